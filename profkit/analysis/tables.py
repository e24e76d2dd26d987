"""The tables of a kernel report, labelled and ordered, from the sums the analysis made.

:mod:`.report_tables` hands over per-phase, per-range and per-(name, phase) counts and
nanoseconds (:mod:`.sums`, :mod:`.kernel_stats`); here they become the tables a user reads.
Every table that counts GPU work counts each kind apart (:data:`COUNT_COLUMNS`):
``kernels`` are kernel launches only, as in the export's kernel table and in Nsight
Systems' ``cuda_gpu_kern_sum``; ``gpu_time_ms`` sums every activity, ``kernel_time_ms``
the kernels alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.names import short_kernel_name
from profkit.analysis.phase_ranges import UNATTRIBUTED
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
COUNT_COLUMNS = {"kernel": "kernels", "memcpy": "memcpy", "memset": "memset", "graph": "graphs"}
"""The count column of each activity kind; ``graphs`` appears only where a trace has any."""


def count_columns(counts: dict[str, np.ndarray], rows: np.ndarray | slice) -> dict[str, Any]:
    """The count columns and the two times (ms) of per-key counts (a count column per
    kind, ``kernel_ns``, ``gpu_ns``), at ``rows``."""
    columns: dict[str, Any] = {
        column: counts[column][rows] for column in COUNT_COLUMNS.values() if column in counts
    }
    columns["kernel_time_ms"] = counts["kernel_ns"][rows] / NS_PER_MS
    columns["gpu_time_ms"] = counts["gpu_ns"][rows] / NS_PER_MS
    return columns


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
    ordered."""
    # Totals added as whole nanoseconds: exact in any order, so a rank's shares do not
    # depend on how its names are numbered (alone on a worker, or in the whole job)
    per_phase["phase_total"] = _whole_ns(per_phase).groupby(per_phase["phase"]).transform("sum")
    per_phase["phase_total"] /= NS_PER_MS
    overall["phase_total"] = _whole_ns(overall).sum() / NS_PER_MS
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
        # by name where totals tie, not by the names' codes
        table = table.sort_values(
            ["phase_order", "total_ms", "name"], ascending=[True, False, True], kind="stable"
        )
        out.append(table[KERNEL_COLUMNS].reset_index(drop=True))
    return out[0], out[1]


def _whole_ns(table: pd.DataFrame) -> pd.Series:
    """A statistics table's totals in whole nanoseconds (sums of integer durations)."""
    return pd.Series(np.rint(table["total_ms"].to_numpy() * NS_PER_MS), index=table.index)


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
