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
from profkit.analysis.flops import attention_flops
from profkit.analysis.names import short_kernel_name
from profkit.errors import BadInput
from profkit.traces.schema import Trace

NS_PER_MS = 1e6
NS_PER_US = 1e3
ALL_PHASES = "all"
KERNEL_STATS = ["instances", "total_ms", "avg_us", "med_us", "min_us", "max_us", "std_us"]
KERNEL_COLUMNS = [
    "name", "short_name", "phase", "category", "instances", "total_ms", "share",
    "avg_us", "med_us", "min_us", "max_us", "std_us", "grid", "block",
]  # fmt: skip
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
    per_phase, overall = _kernel_tables(frame, k, names, category_names[categories], phase_names)
    report = KernelReport(
        source=_source(trace, phase, range, top, config),
        totals={"kernels": len(frame), "gpu_time_ms": total_ns / NS_PER_MS},
        phases=_phase_table(frame, att, r, phase_names, sidecar, phase is not None),
        ranges=_range_table(att, r, labels, duration, selected, config, range or phase),
        kernels=per_phase,
        overall=overall,
        categories=_category_table(frame, categories, category_names, phase_names),
        top=top,
    )
    report.notes = _notes(att, frame, k, trace.meta)
    return report


def _phase_index(att: Attribution, phase: str) -> int:
    lowered = [p.lower() for p in att.phase_names]
    if phase.lower() not in lowered:
        raise BadInput(f"no phase {phase!r} in this trace; phases: {', '.join(att.phase_names)}")
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


def _kernel_tables(
    frame: pd.DataFrame,
    kernels: pd.DataFrame,
    names: np.ndarray,
    categories: np.ndarray,
    phase_names: np.ndarray,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (name, phase) and per name statistics, with the launch shape of the longest run."""
    per_phase = _duration_stats(frame, ["name", "phase"], len(phase_names))
    overall = _duration_stats(frame, ["name"], len(phase_names))
    grids = kernels["grid"].to_numpy(dtype=object)
    blocks = kernels["block"].to_numpy(dtype=object)
    per_phase["phase_total"] = per_phase.groupby("phase")["total_ms"].transform("sum")
    overall["phase_total"] = overall["total_ms"].sum()
    phase_order = {p: i for i, p in enumerate(phase_names)}
    out = []
    for table in (per_phase, overall):
        table["share"] = table["total_ms"] / table["phase_total"].where(table["phase_total"] > 0)
        table["short_name"] = [short_kernel_name(n) for n in names[table["name"]]]
        table["category"] = categories[table["name"]]
        table["grid"] = grids[table["longest"]]
        table["block"] = blocks[table["longest"]]
        table["phase"] = np.where(
            table["phase"] >= 0, phase_names[table["phase"].clip(lower=0)], ALL_PHASES
        )
        table["name"] = names[table["name"]]
        table["phase_order"] = table["phase"].map(phase_order).fillna(-1)
        table = table.sort_values(["phase_order", "total_ms"], ascending=[True, False])
        out.append(table[KERNEL_COLUMNS].reset_index(drop=True))
    return out[0], out[1]


def _duration_stats(frame: pd.DataFrame, keys: list[str], n_phases: int) -> pd.DataFrame:
    """count, sum, mean, median, min, max, std and longest row of the durations per group."""
    name = frame["name"].to_numpy()
    code = name * n_phases + frame["phase"].to_numpy() if len(keys) == 2 else name
    # A categorical grouper on integer codes: pandas groups by the codes directly instead
    # of hashing millions of keys.
    size = int(code.max()) + 1 if len(code) else 0
    grouper = pd.Categorical.from_codes(code, categories=pd.RangeIndex(size), validate=False)
    grouped = frame["duration"].groupby(grouper, observed=True, sort=False)
    stats = grouped.agg(["count", "sum", "mean", "median", "min", "max", "std", "idxmax"])
    group = stats.index.to_numpy(np.int64)
    stats["std"] = stats["std"].fillna(0.0)  # one instance: no spread (as nsys reports it)
    return pd.DataFrame(
        {
            "name": group // n_phases if len(keys) == 2 else group,
            "phase": group % n_phases if len(keys) == 2 else -1,
            "instances": stats["count"].to_numpy(np.int64),
            "total_ms": stats["sum"].to_numpy() / NS_PER_MS,
            "avg_us": stats["mean"].to_numpy() / NS_PER_US,
            "med_us": stats["median"].to_numpy() / NS_PER_US,
            "min_us": stats["min"].to_numpy() / NS_PER_US,
            "max_us": stats["max"].to_numpy() / NS_PER_US,
            "std_us": stats["std"].to_numpy() / NS_PER_US,
            # Row of the group's longest instance: its grid and block are the ones shown.
            "longest": stats["idxmax"].to_numpy(np.int64),
        }
    )


def _phase_table(
    frame: pd.DataFrame,
    att: Attribution,
    ranges: pd.DataFrame,
    phase_names: np.ndarray,
    sidecar: dict[str, Any],
    filtered: bool,
) -> pd.DataFrame:
    n = len(phase_names)
    kernels = np.bincount(frame["phase"], minlength=n)
    gpu_ns = np.bincount(frame["phase"], weights=frame["duration"], minlength=n)
    phase_ranges = ranges[att.is_phase_range]
    cpu_ns = (phase_ranges["end"] - phase_ranges["start"]).groupby(phase_ranges["name"]).sum()
    instances = phase_ranges.groupby("name").size()
    total = gpu_ns.sum()
    table = pd.DataFrame(
        {
            "phase": phase_names,
            "instances": [int(instances.get(p, 0)) for p in phase_names],
            "kernels": kernels.astype(np.int64),
            "gpu_time_ms": gpu_ns / NS_PER_MS,
            "share": gpu_ns / total if total else np.zeros(n),
            "cpu_time_ms": [cpu_ns.get(p, np.nan) / NS_PER_MS for p in phase_names],
        }
    )
    python = _python_ms(sidecar)
    if python:
        table["python_ms"] = [python.get(p, np.nan) for p in phase_names]
    keep = (table["kernels"] > 0) | ((table["instances"] > 0) & (not filtered))
    keep &= (table["phase"] != UNATTRIBUTED) | (table["kernels"] > 0)
    return table[keep].reset_index(drop=True)


def _python_ms(sidecar: dict[str, Any]) -> dict[str, float]:
    """Per phase, the child's own wall-clock time summed over the captured (timed) steps."""
    result = sidecar.get("result")
    steps = result.get("steps") if isinstance(result, dict) else None
    if not isinstance(steps, list) or not steps:
        return {}
    totals: dict[str, float] = {}
    for step in steps:
        for key, value in step.items() if isinstance(step, dict) else ():
            if key.endswith("_ms") and isinstance(value, int | float):
                totals[key.removesuffix("_ms")] = totals.get(key.removesuffix("_ms"), 0.0) + value
    return totals


def _range_table(
    att: Attribution,
    ranges: pd.DataFrame,
    labels: np.ndarray,
    duration: np.ndarray,
    selected: np.ndarray,
    config: dict[str, Any] | None,
    filtered: str | None,
) -> pd.DataFrame:
    gpu_ns, kernels = att.range_totals(np.where(selected, duration, 0), selected)
    frame = pd.DataFrame(
        {
            "range": labels,
            "domain": ranges["domain"].fillna("").to_numpy(dtype=object),
            "kernels": kernels,
            "gpu_ns": gpu_ns,
            "cpu_ns": (ranges["end"] - ranges["start"]).to_numpy(),
        }
    )
    table = (
        frame.groupby(["range", "domain"], sort=False)
        .agg(
            instances=("kernels", "size"),
            kernels=("kernels", "sum"),
            gpu_ns=("gpu_ns", "sum"),
            cpu_ns=("cpu_ns", "sum"),
        )
        .reset_index()
    )
    table["gpu_time_ms"] = table["gpu_ns"] / NS_PER_MS
    table["cpu_time_ms"] = table["cpu_ns"] / NS_PER_MS
    table = table.drop(columns=["gpu_ns", "cpu_ns"])
    if filtered:
        table = table[table["kernels"] > 0]
    flops = attention_flops(config) if config and table["range"].isin(_FLOP_RANGES).any() else None
    if flops:
        mflop = table["range"].map(flops) / 1e6
        table["mflop"] = mflop  # forward FLOPs of one call, analytic
        gpu_ms = table["gpu_time_ms"].where(table["gpu_time_ms"] > 0)
        table["tflop_s"] = mflop * table["instances"] / gpu_ms / 1e3
    table = table.sort_values(["gpu_time_ms", "instances"], ascending=[False, False], kind="stable")
    return table.reset_index(drop=True)


_FLOP_RANGES = (
    "computing attention scores",
    "computing softmax",
    "final matmul",
    "scaled dot product attention",
)


def _category_table(
    frame: pd.DataFrame,
    categories: np.ndarray,
    category_names: np.ndarray,
    phase_names: np.ndarray,
) -> pd.DataFrame:
    """GPU time per (phase, category), each phase's categories by time, with bincounts."""
    n_categories = len(category_names)
    key = frame["phase"].to_numpy() * n_categories + categories[frame["name"].to_numpy()]
    size = len(phase_names) * n_categories
    counts = np.bincount(key, minlength=size)
    gpu_ns = np.bincount(key, weights=frame["duration"].to_numpy(), minlength=size)
    present = np.flatnonzero(counts)
    phase, category = present // n_categories, present % n_categories
    phase_total = np.bincount(phase, weights=gpu_ns[present], minlength=len(phase_names))
    table = pd.DataFrame(
        {
            "phase": phase_names[phase],
            "category": category_names[category],
            "kernels": counts[present].astype(np.int64),
            "gpu_time_ms": gpu_ns[present] / NS_PER_MS,
            "share": gpu_ns[present] / np.where(phase_total[phase] > 0, phase_total[phase], np.nan),
            "order": phase,
        }
    )
    table = table.sort_values(["order", "gpu_time_ms"], ascending=[True, False], kind="stable")
    return table.drop(columns=["order"]).reset_index(drop=True)


def _source(
    trace: Trace, phase: str | None, range_: str | None, top: int, config: dict[str, Any] | None
) -> dict[str, Any]:
    meta = trace.meta
    source = {"path": meta.get("path"), "format": meta.get("format")}
    for key in ("tool", "tool_version", "gpu"):
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
    notes = []
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
