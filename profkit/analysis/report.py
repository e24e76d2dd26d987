"""One trace's per-phase, per-range, per-kernel and per-category tables: :func:`analyze`.

Works on any reader's :class:`~profkit.traces.Trace` (Nsight Systems or torch.profiler).
All tables are computed in one pass over the activities with group-bys on integer codes;
GPU time is the summed duration of the activities (kernels, copies, memsets), so
overlapping streams can make it exceed wall time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.attribution import UNATTRIBUTED, Attribution, attribute
from profkit.analysis.categories import CATEGORIES, categorize
from profkit.analysis.tables import (
    NS_PER_MS,
    category_table,
    kernel_tables,
    phase_table,
    range_table,
)
from profkit.errors import BadInput
from profkit.traces.schema import Trace

# What ``--format json`` promises (DESIGN.md, "Contracts"): exactly these keys.
CONTRACT = {
    "phases": ["phase", "kernels", "gpu_time_ms", "share"],
    "ranges": ["range", "instances", "kernels", "gpu_time_ms"],
    "kernels": [
        "name", "phase", "category", "instances", "total_ms", "share",
        "avg_us", "med_us", "min_us", "max_us", "std_us",
    ],
    "categories": ["phase", "category", "kernels", "gpu_time_ms", "share"],
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

    def top_kernels(self, phase: str | None = None, n: int | None = None) -> pd.DataFrame:
        """The ``n`` (default ``top``; 0 = all) kernels with the most GPU time overall or in a phase."""
        n = self.top if n is None else n
        table = self.overall if phase is None else self.kernels[self.kernels["phase"] == phase]
        return (table.head(n) if n else table).reset_index(drop=True)

    def to_json(self) -> dict[str, Any]:
        """DESIGN.md's ``profkit kernels`` contract; ``kernels`` holds each phase's top rows."""
        kernels = self.kernels
        if self.top:
            kernels = kernels.groupby("phase", sort=False).head(self.top)
        return {
            "source": self.source,
            "totals": self.totals,
            "phases": _records(self.phases, CONTRACT["phases"]),
            "ranges": _records(self.ranges, CONTRACT["ranges"]),
            "kernels": _records(kernels, CONTRACT["kernels"]),
            "categories": _records(self.categories, CONTRACT["categories"]),
        }


def analyze(
    trace: Trace,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    phase_domain: str | None = None,
) -> KernelReport:
    """Attribute every activity of ``trace`` and build all tables in one pass.

    ``phase`` / ``range`` keep only the activities in that phase / enclosed by a range of
    that name (``domain:name`` for a range of another NVTX domain). ``top`` is how many
    kernels the top-kernel views show (0 = all).
    """
    if top < 0:
        raise BadInput(f"--top must be 0 (all) or more, got {top}")
    k, r = trace.kernels, trace.ranges
    duration = (k["end"].to_numpy(np.int64) - k["start"].to_numpy(np.int64)).clip(min=0)
    att = attribute(k, r, phase_domain)
    labels = _range_labels(r)
    selected = np.ones(len(k), dtype=bool)
    if phase is not None:
        selected &= att.kernel_phase == _phase_index(att, phase)
    if range is not None:
        rows = np.flatnonzero((labels == range) | (r["name"].to_numpy(dtype=object) == range))
        if not len(rows):
            known = ", ".join(list(dict.fromkeys(labels.tolist()))[:12]) or "none"
            raise BadInput(f"no range named {range!r} in this trace; ranges: {known}")
        selected &= att.enclosed_by(rows, len(k))

    codes, names = _factorize(k["name"])
    kinds = k["kind"].to_numpy(dtype=object)[_first_rows(codes)]
    category_names = np.array(CATEGORIES, dtype=object)
    category_index = {c: i for i, c in enumerate(CATEGORIES)}
    categories = np.array(
        [category_index[_category(n, kind)] for n, kind in zip(names, kinds, strict=True)],
        dtype=np.int64,
    )
    phase_names = np.array(att.phase_names, dtype=object)
    sidecar = trace.meta.get("sidecar") or {}
    config = sidecar.get("config") if isinstance(sidecar.get("config"), dict) else None

    frame = pd.DataFrame({"name": codes, "phase": att.kernel_phase, "duration": duration})[selected]
    total_ns = int(frame["duration"].sum())
    per_phase, overall = kernel_tables(frame, k, names, category_names[categories], phase_names)
    report = KernelReport(
        source=_source(trace, phase, range, top, config),
        totals={"kernels": len(frame), "gpu_time_ms": total_ns / NS_PER_MS},
        phases=phase_table(frame, att, r, phase_names, sidecar, phase is not None),
        ranges=range_table(att, r, labels, duration, selected, config, range or phase),
        kernels=per_phase,
        overall=overall,
        categories=category_table(frame, categories, category_names, phase_names),
        top=top,
    )
    report.notes = _notes(att, frame, k, trace.meta)
    return report


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
    return np.array(
        [f"{d}:{n}" if d else n for n, d in zip(names, domains, strict=True)], dtype=object
    )


def _factorize(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes and distinct values of a string column, in order of first appearance.

    Free for a categorical column. For strings, pandas' default path hashes each string's
    characters (0.8 s for 3 M rows); readers give rows that share a few str objects, whose
    hash Python caches, so an object hash table does the same in a sixth of the time.
    """
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy(np.int64)
        return codes, np.asarray(column.cat.categories, dtype=object)
    values = column.to_numpy(dtype=object)
    try:
        from pandas._libs.hashtable import PyObjectHashTable

        uniques, codes = PyObjectHashTable(max(len(values) // 64, 64)).factorize(values)
    except (ImportError, AttributeError, TypeError):  # a pandas without it: the slow path
        codes, uniques = pd.factorize(values)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)


def _first_rows(codes: np.ndarray) -> np.ndarray:
    """Row of each code's first occurrence (factorize numbers codes in order of appearance)."""
    if not len(codes):
        return np.empty(0, dtype=np.int64)
    new = np.ones(len(codes), dtype=bool)
    new[1:] = codes[1:] > np.maximum.accumulate(codes)[:-1]
    return np.flatnonzero(new)


def _category(name: str, kind: str) -> str:
    if kind in ("memcpy", "memset"):
        return "memory"
    if kind == "graph":
        return "graph"
    return categorize(name)


def _source(
    trace: Trace, phase: str | None, range_: str | None, top: int, config: dict[str, Any] | None
) -> dict[str, Any]:
    meta = trace.meta
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
    att: Attribution, frame: pd.DataFrame, kernels: pd.DataFrame, meta: dict[str, Any]
) -> list[str]:
    """Plain sentences on how the activities were attributed (for humans, not the JSON)."""
    notes = list(meta.get("warnings") or [])  # what the reader found odd about the source
    threads = meta.get("thread_names") or {}
    rows = frame.index.to_numpy()
    cross = att.cross_thread[rows]
    same = att.same_thread_phase[rows]
    launchers = kernels["launch_thread"].to_numpy(dtype=np.int64, na_value=-1)[rows]
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


def _records(table: pd.DataFrame, columns: list[str]) -> list[dict[str, Any]]:
    return table[columns].to_dict(orient="records") if len(table) else []
