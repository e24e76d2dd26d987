"""One trace's per-phase, per-range, per-kernel and per-category tables: :func:`analyze`.

Works on any reader's :class:`~profkit.traces.Trace` (Nsight Systems or torch.profiler).
All tables are computed in one pass over the activities with group-bys on integer codes.
Counts are per kind of activity: ``kernels`` (kernel launches), ``memcpy``, ``memset``;
``gpu_time_ms`` is the summed duration of all of them, ``kernel_time_ms`` of the kernels
alone. Overlapping streams can make either exceed wall time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.attribution import (
    PHASE_MODES,
    UNATTRIBUTED,
    Attribution,
    PhaseMode,
    TraceHints,
    attribute,
    inference_note,
)
from profkit.analysis.categories import CATEGORIES, categorize
from profkit.analysis.names import factorize as _factorize
from profkit.analysis.tables import (
    COUNT_COLUMNS,
    NS_PER_MS,
    activity_counts,
    category_table,
    first_rows,
    kernel_tables,
    pair_groups,
    phase_table,
    range_table,
)
from profkit.errors import BadInput
from profkit.traces.schema import KINDS, Trace

# What ``--format json`` promises (docs/JSON.md, ``profkit kernels``): exactly these keys,
# plus ``graphs`` after ``memset`` where the trace holds whole CUDA graphs.
CONTRACT = {
    "phases": ["phase", "kernels", "memcpy", "memset", "kernel_time_ms", "gpu_time_ms", "share"],
    "ranges": [
        "range", "instances", "kernels", "memcpy", "memset", "kernel_time_ms", "gpu_time_ms",
    ],
    "kernels": [
        "name", "phase", "category", "kind", "instances", "total_ms", "share",
        "avg_us", "med_us", "min_us", "max_us", "std_us",
    ],
    "categories": ["phase", "category", "kernels", "memcpy", "memset", "gpu_time_ms", "share"],
}  # fmt: skip


@dataclass
class KernelReport:
    """The tables of one trace. Shares are fractions (0-1).

    ``kernels`` has one row per (kernel name, phase), its share being of that phase's GPU
    time; ``overall`` one row per kernel name across phases (phase ``all``), its share of
    the total. ``categories``' share is of its phase's GPU time; ``phases``' of the total.
    """

    source: dict[str, Any]
    totals: dict[str, Any]
    phases: pd.DataFrame
    ranges: pd.DataFrame
    kernels: pd.DataFrame
    overall: pd.DataFrame
    categories: pd.DataFrame
    top: int = 20
    notes: list[str] = field(default_factory=list)
    selected: np.ndarray | None = None
    """Which of the trace's activities these tables count (after ``phase``/``range``)."""

    @property
    def activities(self) -> int:
        """GPU activities of every kind (0 for a CPU-only trace)."""
        return sum(int(self.totals.get(c, 0)) for c in COUNT_COLUMNS.values())

    def top_kernels(self, phase: str | None = None, n: int | None = None) -> pd.DataFrame:
        """The ``n`` (default ``top``; 0 = all) kernels with the most GPU time overall or in a phase."""
        n = self.top if n is None else n
        table = self.overall if phase is None else self.kernels[self.kernels["phase"] == phase]
        return (table.head(n) if n else table).reset_index(drop=True)

    def to_json(self) -> dict[str, Any]:
        """The ``profkit kernels`` JSON (docs/JSON.md); ``kernels`` holds each phase's top rows."""
        kernels = self.kernels
        if self.top:
            kernels = kernels.groupby("phase", sort=False).head(self.top)
        return {
            "source": self.source,
            "totals": self.totals,
            "phases": table_records(self.phases, CONTRACT["phases"]),
            "ranges": table_records(self.ranges, CONTRACT["ranges"]),
            "kernels": table_records(kernels, CONTRACT["kernels"]),
            "categories": table_records(self.categories, CONTRACT["categories"]),
        }


def analyze(
    trace: Trace,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    phase_domain: str | None = None,
    phases: PhaseMode = "auto",
) -> KernelReport:
    """Attribute every activity of ``trace`` and build all tables in one pass.

    ``phase`` / ``range`` keep only the activities in that phase / enclosed by a range of
    that name (``domain:name`` for a range of another NVTX domain). ``top`` is how many
    kernels the top-kernel views show (0 = all). ``phases`` (``auto``, ``annotated``,
    ``inferred``) says where phases come from (docs/ATTRIBUTION.md).
    """
    check_options(top, phases)
    k, r = trace.kernels, trace.ranges
    att = attribute(k, r, phase_domain, TraceHints.of(trace.meta), phases)
    return tables_of(att, Activities.of(k), r, trace.meta, top, phase, range)


def check_options(top: int, phases: str) -> None:
    """Raise :class:`BadInput` for a ``top`` or ``phases`` :func:`analyze` cannot take."""
    if top < 0:
        raise BadInput(f"--top must be 0 (all) or more, got {top}")
    if phases not in PHASE_MODES:
        raise BadInput(f"--phases must be one of {', '.join(PHASE_MODES)}, got {phases!r}")


@dataclass
class Activities:
    """What the tables read of the kernels table, as arrays: per activity its duration
    (ns, negative clipped to 0), name code, grid, block and launching thread (-1: unknown);
    per distinct name (``names``, in order of first appearance) its kind and category."""

    duration: np.ndarray
    name: np.ndarray
    grid: np.ndarray
    block: np.ndarray
    launch_thread: np.ndarray
    names: np.ndarray
    kinds: np.ndarray
    """Per name: its kind (``kernel``, ``memcpy``...)."""
    name_kinds: np.ndarray
    """Per name: the index of its kind in ``KINDS``."""
    categories: np.ndarray
    """Per name: the index of its category in ``CATEGORIES``."""

    @classmethod
    def of(cls, kernels: pd.DataFrame) -> Activities:
        start = kernels["start"].to_numpy(np.int64)
        duration = (kernels["end"].to_numpy(np.int64) - start).clip(min=0)
        codes, names = _factorize(kernels["name"])
        kinds, name_kinds, categories = _name_facts(kernels, codes, names)
        return cls(
            duration=duration,
            name=codes,
            grid=kernels["grid"].to_numpy(dtype=object),
            block=kernels["block"].to_numpy(dtype=object),
            launch_thread=kernels["launch_thread"].to_numpy(dtype=np.int64, na_value=-1),
            names=names,
            kinds=kinds,
            name_kinds=name_kinds,
            categories=categories,
        )

    def take(self, rows: np.ndarray) -> Activities:
        """The activities at ``rows`` (the per-name facts stay whole: codes keep meaning)."""
        return replace(
            self,
            duration=self.duration[rows],
            name=self.name[rows],
            grid=self.grid[rows],
            block=self.block[rows],
            launch_thread=self.launch_thread[rows],
        )


def tables_of(
    att: Attribution,
    acts: Activities,
    ranges: pd.DataFrame,
    meta: dict[str, Any],
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    counts_of_all: Callable[[], dict[str, np.ndarray]] | None = None,
) -> KernelReport:
    """The report of attributed activities: ``att`` and ``acts`` hold the same rows, and
    ``ranges`` the rows of the ranges ``att`` was attributed against (one rank's, say).

    ``counts_of_all()`` gives the range counts of every activity (``tables.range_counts``),
    used when no activity is filtered out."""
    labels = _range_labels(ranges)
    selected = _selected(att, ranges, labels, phase, range)
    category_names = np.array(CATEGORIES, dtype=object)
    phase_names = np.array(att.phase_names, dtype=object)
    sidecar = meta.get("sidecar") or {}
    config = run_config(sidecar, meta)
    frame = pd.DataFrame(
        {
            "name": acts.name,
            "phase": att.kernel_phase,
            "duration": acts.duration,
            "kind": acts.name_kinds[acts.name],
        }
    )[selected]
    per_phase, overall = kernel_tables(
        frame,
        (acts.grid, acts.block),
        acts.names,
        category_names[acts.categories],
        acts.kinds,
        phase_names,
    )
    report = KernelReport(
        source={**_source_of(meta, phase, range, top, config), "phase_source": att.phase_source},
        totals=_totals(frame),
        phases=phase_table(frame, att, ranges, phase_names, sidecar, phase is not None),
        ranges=range_table(
            att,
            ranges,
            labels,
            frame,
            config,
            range or phase,
            counts_of_all() if counts_of_all is not None and selected.all() else None,
        ),
        kernels=per_phase,
        overall=overall,
        categories=category_table(frame, acts.categories, category_names, phase_names),
        top=top,
    )
    report.notes = _notes(att, frame, acts.launch_thread, meta)
    report.selected = selected
    return report


def _selected(
    att: Attribution,
    ranges: pd.DataFrame,
    labels: np.ndarray,
    phase: str | None,
    range_: str | None,
) -> np.ndarray:
    """Per activity: in ``phase`` and enclosed by a range named ``range_`` (where given)."""
    n = len(att.kernel_phase)
    selected = np.ones(n, dtype=bool)
    if phase is not None:
        selected &= att.kernel_phase == _phase_index(att, phase)
    if range_ is not None:
        names = ranges["name"].to_numpy(dtype=object)
        rows = np.flatnonzero((labels == range_) | (names == range_))
        if not len(rows):
            known = ", ".join(list(dict.fromkeys(labels.tolist()))[:12]) or "none"
            raise BadInput(f"no range named {range_!r} in this trace; ranges: {known}")
        selected &= att.enclosed_by(rows, n)
    return selected


def _name_facts(
    kernels: pd.DataFrame, codes: np.ndarray, names: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct name: its kind, the kind's index in ``KINDS``, its category's index."""
    kinds = kernels["kind"].to_numpy(dtype=object)[first_rows(codes)]
    # Readers name copies and memsets apart from kernels ("[CUDA memcpy HtoD]", "[memset]"),
    # so each name has one kind: the row kinds come from the few names, not millions of rows.
    kind_index = {kind: i for i, kind in enumerate(KINDS)}
    name_kinds = np.array([kind_index[kind] for kind in kinds], dtype=np.int8)
    category_index = {c: i for i, c in enumerate(CATEGORIES)}
    categories = np.array(
        [category_index[_category(n, kind)] for n, kind in zip(names, kinds, strict=True)],
        dtype=np.int64,
    )
    return kinds, name_kinds, categories


def _totals(frame: pd.DataFrame) -> dict[str, Any]:
    """``{kernels, memcpy, memset[, graphs], kernel_time_ms, gpu_time_ms}`` of the frame."""
    counts = activity_counts(
        np.zeros(len(frame), dtype=np.int64),
        frame["kind"].to_numpy(),
        frame["duration"].to_numpy(),
        1,
    )
    totals: dict[str, Any] = {
        column: int(counts[column][0]) for column in COUNT_COLUMNS.values() if column in counts
    }
    totals["kernel_time_ms"] = float(counts["kernel_ns"][0]) / NS_PER_MS
    totals["gpu_time_ms"] = float(counts["gpu_ns"][0]) / NS_PER_MS
    return totals


def _phase_index(att: Attribution, phase: str) -> int:
    # The last name is the catch-all ``unattributed``: offered only when some kernel has it.
    last = len(att.phase_names) - 1
    present = [
        name
        for index, name in enumerate(att.phase_names)
        if index < last or bool((att.kernel_phase == last).any())
    ]
    lowered = [p.lower() for p in present]
    if phase.lower() not in lowered:
        listed = ", ".join(present) or "none"
        raise BadInput(f"no phase {phase!r} in this trace; phases: {listed}")
    return lowered.index(phase.lower())


def _range_labels(ranges: pd.DataFrame) -> np.ndarray:
    """``name`` for the default NVTX domain, ``domain:name`` for others (as nsys shows them)."""
    names = ranges["name"].to_numpy(dtype=object)
    domains = ranges["domain"].fillna("").to_numpy(dtype=object)

    def label(n: object, d: object) -> object:
        return f"{d}:{n}" if d else n

    # One label per distinct (name, domain), not one f-string per range row.
    group, first = pair_groups(names, domains)
    distinct = np.array([label(names[f], domains[f]) for f in first.tolist()], dtype=object)
    labels = np.empty(len(names), dtype=object)
    known = group >= 0
    labels[known] = distinct[group[known]]
    for row in np.flatnonzero(~known).tolist():  # a missing name: as it reads
        labels[row] = label(names[row], domains[row])
    return labels


def _category(name: str, kind: str) -> str:
    if kind in ("memcpy", "memset"):
        return "memory"
    if kind == "graph":
        return "graph"
    return categorize(name)


def run_config(sidecar: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any] | None:
    """The run's config: the sidecar's beside the trace, else the trace's own (a Chrome
    trace written by ``profkit torch`` carries it in its header)."""
    for config in (sidecar.get("config"), meta.get("config")):
        if isinstance(config, dict):
            return config
    return None


def _source(
    trace: Trace, phase: str | None, range_: str | None, top: int, config: dict[str, Any] | None
) -> dict[str, Any]:
    return _source_of(trace.meta, phase, range_, top, config)


def _source_of(
    meta: dict[str, Any],
    phase: str | None,
    range_: str | None,
    top: int,
    config: dict[str, Any] | None,
) -> dict[str, Any]:
    source = {"path": meta.get("path"), "format": meta.get("format")}
    # What the reader dropped or clamped (negative durations, non-finite times): counts
    # appear only when non-zero, beside the warnings that say why.
    for key in ("tool", "tool_version", "gpu", "dropped_events", "clamped_activities",
                "clamped_ranges"):  # fmt: skip
        if meta.get(key):
            source[key] = meta[key]
    if config:
        source["config"] = config
    source.update(phase=phase, range=range_, top=top)
    return source


def _notes(
    att: Attribution, frame: pd.DataFrame, launch_thread: np.ndarray, meta: dict[str, Any]
) -> list[str]:
    """Plain sentences on how the activities were attributed (for humans, not the JSON)."""
    notes = list(meta.get("warnings") or [])  # what the reader found odd about the source
    notes += inference_note(att, frame.index.to_numpy(), meta)
    threads = meta.get("thread_names") or {}
    rows = frame.index.to_numpy()
    cross = att.cross_thread[rows]
    same = att.same_thread_phase[rows]
    launchers = launch_thread[rows]
    owners = ", ".join(sorted({threads.get(t, f"thread {t}") for t in att.owners.values()}))
    nsys = meta.get("format") == "nsys-sqlite"
    rule = "the rule of Nsight Systems' nvtx_gpu_proj_sum" if nsys else "a same-thread rule"
    for index, name in enumerate(att.phase_names):
        in_phase = frame["phase"].to_numpy() == index
        moved = cross & in_phase
        if name == UNATTRIBUTED or not moved.any():
            continue
        workers = sorted({threads.get(t, f"thread {t}") for t in np.unique(launchers[moved])})
        notes.append(
            f"{name}: {int(moved.sum()):,} of its {int(in_phase.sum()):,} GPU activities were "
            f"launched from {', '.join(workers)} and attributed through the ranges open on "
            f"{owners} at launch; the launching thread alone ({rule}) would give it "
            f"{int((same == index).sum()):,}."
        )
    outside = int((frame["phase"].to_numpy() == len(att.phase_names) - 1).sum())
    unlaunched = int((launchers < 0).sum())
    if outside > unlaunched:
        notes.append(
            f"{outside - unlaunched:,} GPU activities were launched outside every phase range "
            "(unattributed)."
        )
    if unlaunched:
        notes.append(
            f"{unlaunched:,} GPU activities have no launch call in the trace (their API call "
            "was not traced): they are unattributed and in no range."
        )
    return notes


def table_records(table: pd.DataFrame, columns: list[str]) -> list[dict[str, Any]]:
    """The JSON rows of a report table: ``columns`` (and ``graphs`` after ``memset``)."""
    if "graphs" in table and "memset" in columns:
        columns = [
            *columns[: columns.index("memset") + 1],
            "graphs",
            *columns[columns.index("memset") + 1 :],
        ]
    return table[columns].to_dict(orient="records") if len(table) else []
