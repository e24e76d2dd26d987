"""The tables of a kernel report, built from attributed activities with integer group-bys.

Used by :func:`profkit.analysis.report.analyze`: ``frame`` holds one row per selected
activity (``name`` code, ``phase`` code, ``duration`` ns) indexed by its row in
``trace.kernels``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.attribution import UNATTRIBUTED, Attribution
from profkit.analysis.names import short_kernel_name
from profkit.workload.flops import attention_flops

NS_PER_MS = 1e6
NS_PER_US = 1e3
ALL_PHASES = "all"
KERNEL_COLUMNS = [
    "name", "short_name", "phase", "category", "instances", "total_ms", "share",
    "avg_us", "med_us", "min_us", "max_us", "std_us", "grid", "block",
]  # fmt: skip
FLOP_RANGES = (
    "computing attention scores",
    "computing softmax",
    "final matmul",
    "scaled dot product attention",
)


def kernel_tables(
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


def phase_table(
    frame: pd.DataFrame,
    att: Attribution,
    ranges: pd.DataFrame,
    phase_names: np.ndarray,
    sidecar: dict[str, Any],
    filtered: bool,
) -> pd.DataFrame:
    """Activities, GPU time and share per phase; wall time of its ranges; Python time."""
    n = len(phase_names)
    kernels = np.bincount(frame["phase"], minlength=n)
    gpu_ns = np.bincount(frame["phase"], weights=frame["duration"], minlength=n)
    instances, cpu_ns = att.phase_spans(ranges)
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


def range_table(
    att: Attribution,
    ranges: pd.DataFrame,
    labels: np.ndarray,
    duration: np.ndarray,
    selected: np.ndarray,
    config: dict[str, Any] | None,
    filtered: str | None,
) -> pd.DataFrame:
    """Per range name: instances, activities and GPU time enclosed, wall time, FLOPs."""
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
    flops = attention_flops(config) if config and table["range"].isin(FLOP_RANGES).any() else None
    if flops:
        mflop = table["range"].map(flops) / 1e6
        table["mflop"] = mflop  # forward FLOPs of one call, analytic
        gpu_ms = table["gpu_time_ms"].where(table["gpu_time_ms"] > 0)
        table["tflop_s"] = mflop * table["instances"] / gpu_ms / 1e3
    table = table.sort_values(["gpu_time_ms", "instances"], ascending=[False, False], kind="stable")
    return table.reset_index(drop=True)


def category_table(
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
