"""The tables of a kernel report, built from attributed activities with integer group-bys.

Used by :func:`profkit.analysis.report.analyze`: ``frame`` holds one row per selected
activity (``name`` code, ``phase`` code, ``duration`` ns, ``kind`` code: the index of its
kind in :data:`~profkit.traces.schema.KINDS`) indexed by its row in ``trace.kernels``.

Every table that counts GPU work counts each kind apart (:data:`COUNT_COLUMNS`):
``kernels`` are kernel launches only, as in the export's kernel table and in Nsight
Systems' ``cuda_gpu_kern_sum``; ``gpu_time_ms`` sums every activity, ``kernel_time_ms``
the kernels alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.attribution import UNATTRIBUTED, Attribution
from profkit.analysis.names import short_kernel_name
from profkit.traces.schema import KINDS
from profkit.workload.flops import attention_flops
from profkit.workload.names import ATTENTION_RANGES

NS_PER_MS = 1e6
NS_PER_US = 1e3
ALL_PHASES = "all"
KERNEL_COLUMNS = [
    "name", "short_name", "phase", "category", "kind", "instances", "total_ms", "share",
    "avg_us", "med_us", "min_us", "max_us", "std_us", "grid", "block",
]  # fmt: skip
KERNEL = KINDS.index("kernel")
GRAPH = KINDS.index("graph")
COUNT_COLUMNS = {"kernel": "kernels", "memcpy": "memcpy", "memset": "memset", "graph": "graphs"}
"""The count column of each activity kind; ``graphs`` appears only where a trace has any."""


def activity_counts(
    key: np.ndarray, kind: np.ndarray, duration: np.ndarray, size: int
) -> dict[str, np.ndarray]:
    """Per key (0 .. size-1): a count per activity kind, then kernel and all-activity ns."""
    n_kinds = len(KINDS)
    counts = np.bincount(key * n_kinds + kind, minlength=size * n_kinds).reshape(size, n_kinds)
    out: dict[str, np.ndarray] = {
        COUNT_COLUMNS[name]: counts[:, code].astype(np.int64)
        for code, name in enumerate(KINDS)
        if code != GRAPH or counts[:, GRAPH].any()
    }
    kernel_ns = np.where(kind == KERNEL, duration, 0)
    out["kernel_ns"] = np.bincount(key, weights=kernel_ns, minlength=size)
    out["gpu_ns"] = np.bincount(key, weights=duration, minlength=size)
    return out


def count_columns(counts: dict[str, np.ndarray], rows: np.ndarray | slice) -> dict[str, Any]:
    """The count columns and the two times (ms) of ``activity_counts``, at ``rows``."""
    columns: dict[str, Any] = {
        column: counts[column][rows] for column in COUNT_COLUMNS.values() if column in counts
    }
    columns["kernel_time_ms"] = counts["kernel_ns"][rows] / NS_PER_MS
    columns["gpu_time_ms"] = counts["gpu_ns"][rows] / NS_PER_MS
    return columns


def kernel_tables(
    frame: pd.DataFrame,
    shapes: tuple[np.ndarray, np.ndarray],
    names: np.ndarray,
    categories: np.ndarray,
    kinds: np.ndarray,
    phase_names: np.ndarray,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (name, phase) and per name statistics, with the launch shape of the longest run.

    ``shapes`` are the grid and block of each row ``frame``'s index numbers; ``categories``
    and ``kinds`` hold each name's category and activity kind."""
    per_phase = _duration_stats(frame, ["name", "phase"], len(phase_names))
    overall = _duration_stats(frame, ["name"], len(phase_names))
    grids, blocks = shapes
    for table in (per_phase, overall):
        table["grid"] = grids[table["longest"]]
        table["block"] = blocks[table["longest"]]
    return labelled_kernel_tables(per_phase, overall, names, categories, kinds, phase_names)


def labelled_kernel_tables(
    per_phase: pd.DataFrame,
    overall: pd.DataFrame,
    names: np.ndarray,
    categories: np.ndarray,
    kinds: np.ndarray,
    phase_names: np.ndarray,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The two kernel tables from their statistics by name and phase code: each row's share
    of its phase, names, categories and kinds looked up per name code, phases labelled and
    ordered (the in-memory and the streaming analysis share this)."""
    per_phase["phase_total"] = per_phase.groupby("phase")["total_ms"].transform("sum")
    overall["phase_total"] = overall["total_ms"].sum()
    phase_order = {p: i for i, p in enumerate(phase_names)}
    out = []
    for table in (per_phase, overall):
        table["share"] = table["total_ms"] / table["phase_total"].where(table["phase_total"] > 0)
        table["short_name"] = [short_kernel_name(n) for n in names[table["name"]]]
        table["category"] = categories[table["name"]]
        table["kind"] = kinds[table["name"]]
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
    """Activities of each kind, kernel and GPU time, share per phase; wall and Python time."""
    n = len(phase_names)
    counts = activity_counts(
        frame["phase"].to_numpy(), frame["kind"].to_numpy(), frame["duration"].to_numpy(), n
    )
    instances, cpu_ns = att.phase_spans(ranges)
    active = np.bincount(frame["phase"], minlength=n) > 0
    return phases_from_counts(phase_names, counts, instances, cpu_ns, active, sidecar, filtered)


def phases_from_counts(
    phase_names: np.ndarray | list[str],
    counts: dict[str, np.ndarray],
    instances: pd.Series,
    cpu_ns: pd.Series,
    active: np.ndarray,
    sidecar: dict[str, Any],
    filtered: bool,
) -> pd.DataFrame:
    """The phase table from per-phase counts and ns, instances and wall ns per phase name:
    share of GPU time, the run's own Python time, and only the phases worth a row."""
    n = len(phase_names)
    gpu_ns = counts["gpu_ns"]
    total = gpu_ns.sum()
    table = pd.DataFrame(
        {
            "phase": phase_names,
            "instances": [int(instances.get(p, 0)) for p in phase_names],
            **count_columns(counts, slice(None)),
            "share": gpu_ns / total if total else np.zeros(n),
            "cpu_time_ms": [cpu_ns.get(p, np.nan) / NS_PER_MS for p in phase_names],
        }
    )
    python = _python_ms(sidecar)
    if python:
        table["python_ms"] = [python.get(p, np.nan) for p in phase_names]
    keep = active | ((table["instances"] > 0) & (not filtered))
    keep &= (table["phase"] != UNATTRIBUTED) | active
    return table[keep].reset_index(drop=True)


def _python_ms(sidecar: dict[str, Any]) -> dict[str, float]:
    """Per phase, the child's own wall-clock time summed over the captured (timed) steps.

    None for a run of several ranks: its sidecar times one rank's phases, where the trace's
    (and every rank's) tables would show them beside other ranks' ranges.
    """
    result = sidecar.get("result")
    if isinstance(result, dict) and (result.get("world_size") or 1) > 1:
        return {}
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
    frame: pd.DataFrame,
    config: dict[str, Any] | None,
    filtered: str | None,
    counts: dict[str, np.ndarray] | None = None,
) -> pd.DataFrame:
    """Per range name: instances, activities of each kind and their time, wall time, FLOPs.

    ``counts``: :func:`range_counts` of the frame's activities, where the caller has them."""
    if counts is None:
        rows = frame.index.to_numpy()
        n = len(att.kernel_phase)
        kind = np.full(n, -1, dtype=np.int8)
        kind[rows] = frame["kind"].to_numpy()
        duration = np.zeros(n, dtype=np.int64)
        duration[rows] = frame["duration"].to_numpy()
        counts = range_counts(att, kind, duration)
    return ranges_from_counts(counts, ranges, labels, config, filtered)


def range_counts(att: Attribution, kind: np.ndarray, duration: np.ndarray) -> dict[str, np.ndarray]:
    """Per range row: a count per activity kind enclosed, then kernel and all-activity ns.

    ``kind`` (index in ``KINDS``; -1 for an activity not counted) and ``duration`` (ns) are
    per activity of ``att``. ``graphs`` is there only where a graph is counted."""
    # Each pass over the ranges costs ~80 ms per million activities: each returns a sum and
    # a count, so kernels and copies ride along with the two times, and a kind the trace
    # lacks costs nothing.
    is_kernel = kind == KERNEL
    kernel_ns, kernels = att.range_totals(np.where(is_kernel, duration, 0), is_kernel)
    gpu_ns, memcpy = att.range_totals(duration, kind == KINDS.index("memcpy"))
    out = {"kernels": kernels, "memcpy": memcpy}
    for code in (KINDS.index("memset"), GRAPH):
        present = kind == code
        if code == GRAPH and not present.any():
            continue
        out[COUNT_COLUMNS[KINDS[code]]] = (
            att.range_totals(present, present)[1] if present.any() else np.zeros_like(memcpy)
        )
    return out | {"kernel_ns": kernel_ns, "gpu_ns": gpu_ns}


def category_table(
    frame: pd.DataFrame,
    categories: np.ndarray,
    category_names: np.ndarray,
    phase_names: np.ndarray,
) -> pd.DataFrame:
    """Activities and GPU time per (phase, category), each phase's categories by time."""
    n_categories = len(category_names)
    key = frame["phase"].to_numpy() * n_categories + categories[frame["name"].to_numpy()]
    size = len(phase_names) * n_categories
    counts = activity_counts(key, frame["kind"].to_numpy(), frame["duration"].to_numpy(), size)
    present = np.flatnonzero(np.bincount(key, minlength=size))
    phase, category = present // n_categories, present % n_categories
    gpu_ns = counts["gpu_ns"][present]
    phase_total = np.bincount(phase, weights=gpu_ns, minlength=len(phase_names))
    columns = count_columns(counts, present)
    del columns["kernel_time_ms"]
    table = pd.DataFrame(
        {
            "phase": phase_names[phase],
            "category": category_names[category],
            **columns,
            "share": gpu_ns / np.where(phase_total[phase] > 0, phase_total[phase], np.nan),
            "order": phase,
        }
    )
    table = table.sort_values(["order", "gpu_time_ms"], ascending=[True, False], kind="stable")
    return table.drop(columns=["order"]).reset_index(drop=True)


def first_rows(codes: np.ndarray) -> np.ndarray:
    """Row of each code's first occurrence (factorize numbers codes in order of appearance)."""
    if not len(codes):
        return np.empty(0, dtype=np.int64)
    new = np.ones(len(codes), dtype=bool)
    new[1:] = codes[1:] > np.maximum.accumulate(codes)[:-1]
    return np.flatnonzero(new)


def pair_groups(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (left, right) pair, numbered in order of first appearance (-1 where either
    is missing, which a groupby drops), and the first row of each pair: a groupby on
    integer codes, not on the text of every row."""
    left_code = pd.factorize(left)[0]
    right_code = pd.factorize(right)[0]
    present = (left_code >= 0) & (right_code >= 0)
    width = int(right_code.max(initial=0)) + 1
    group = np.full(len(left), -1, dtype=np.int64)
    group[present] = pd.factorize(left_code[present] * width + right_code[present])[0]
    return group, np.flatnonzero(present)[first_rows(group[present])]


def ranges_from_counts(
    columns: dict[str, np.ndarray],
    ranges: pd.DataFrame,
    labels: np.ndarray,
    config: dict[str, Any] | None,
    filtered: str | None,
) -> pd.DataFrame:
    """The range table from per-range-row counts and ns (``kernel_ns``, ``gpu_ns``): summed
    by name, wall time, and the attention ranges' analytic FLOPs."""
    domain = ranges["domain"].fillna("").to_numpy(dtype=object)
    group, first = pair_groups(np.asarray(labels, dtype=object), domain)
    summed = {**columns, "cpu_ns": (ranges["end"] - ranges["start"]).to_numpy(np.int64)}
    rows = np.flatnonzero(group >= 0)
    rows = rows[np.argsort(group[rows], kind="stable")]  # each group's rows, in row order
    runs = np.flatnonzero(np.diff(group[rows], prepend=-1))  # where each group's rows start
    table = pd.DataFrame(
        {
            "range": labels[first],
            "domain": domain[first],
            "instances": np.diff(np.append(runs, len(rows))),
            **{
                name: np.add.reduceat(np.asarray(values, np.int64)[rows], runs)
                if len(rows)
                else np.zeros(0, np.int64)
                for name, values in summed.items()
            },
        }
    )
    table["kernel_time_ms"] = table.pop("kernel_ns") / NS_PER_MS
    table["gpu_time_ms"] = table.pop("gpu_ns") / NS_PER_MS
    table["cpu_time_ms"] = table.pop("cpu_ns") / NS_PER_MS
    if filtered:
        counted = [c for c in COUNT_COLUMNS.values() if c in table]
        table = table[table[counted].sum(axis=1) > 0]
    flops = (
        attention_flops(config) if config and table["range"].isin(ATTENTION_RANGES).any() else None
    )
    if flops:
        mflop = table["range"].map(flops) / 1e6
        table["mflop"] = mflop  # forward FLOPs of one call, analytic
        gpu_ms = table["gpu_time_ms"].where(table["gpu_time_ms"] > 0)
        table["tflop_s"] = mflop * table["instances"] / gpu_ms / 1e3
    table = table.sort_values(["gpu_time_ms", "instances"], ascending=[False, False], kind="stable")
    return table.reset_index(drop=True)
