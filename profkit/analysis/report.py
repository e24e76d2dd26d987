"""One trace's per-phase, per-range, per-kernel and per-category tables: :func:`analyze`.

Works on any reader's :class:`~profkit.traces.Trace` (Nsight Systems or torch.profiler).
All tables are computed in one pass over the activities with group-bys on integer codes.
Counts are per kind of activity: ``kernels`` (kernel launches), ``memcpy``, ``memset``;
``gpu_time_ms`` is the summed duration of all of them, ``kernel_time_ms`` of the kernels
alone. Overlapping streams can make either exceed wall time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.attribution import (
    UNATTRIBUTED,
    Attribution,
    PhaseMode,
    TraceHints,
    attribute,
    inference_note,
)
from profkit.analysis.categories import CATEGORIES, category_of
from profkit.analysis.names import factorize as _factorize
from profkit.analysis.report_types import CONTRACT as CONTRACT
from profkit.analysis.report_types import KernelReport as KernelReport
from profkit.analysis.report_types import run_config as run_config
from profkit.analysis.report_types import source_of
from profkit.analysis.selection import check_options as check_options
from profkit.analysis.selection import no_range, phase_index, range_labels
from profkit.analysis.tables import (
    COUNT_COLUMNS,
    NS_PER_MS,
    activity_counts,
    category_table,
    first_rows,
    kernel_tables,
    phase_table,
    range_table,
)
from profkit.traces.schema import KINDS, Trace


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
    labels = range_labels(ranges)
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
        source={**source_of(meta, phase, range, top, config), "phase_source": att.phase_source},
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
        unattributed_seen = bool((att.kernel_phase == len(att.phase_names) - 1).any())
        selected &= att.kernel_phase == phase_index(att.phase_names, unattributed_seen, phase)
    if range_ is not None:
        names = ranges["name"].to_numpy(dtype=object)
        rows = np.flatnonzero((labels == range_) | (names == range_))
        if not len(rows):
            raise no_range(range_, labels)
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
        [category_index[category_of(n, kind)] for n, kind in zip(names, kinds, strict=True)],
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
