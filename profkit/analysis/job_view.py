"""A job of many ranks as a person reads it: distributions across ranks, not a row per rank.

Above :data:`MANY_RANKS` ranks the terminal shows the job (``profkit kernels``): each
rank's step time, GPU time and NCCL numbers as percentiles across ranks, the slowest,
median and fastest ranks, the ranks the others wait for, and the nodes' clocks (summarized
too above :data:`MANY_NODES` nodes). The full per-rank tables stay in md, csv and json and
under ``--rank N`` (:func:`profkit.analysis.presentation.rank_tables`). The same choice of
ranks gives the lanes picture its rows (:func:`lane_ranks`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.presentation import NODES_TITLE, node_table, rank_tables
from profkit.analysis.report_types import RankedReport
from profkit.analysis.steps import last_to_join

MANY_RANKS = 8
"""Above this many ranks the terminal shows the job, not every rank: one node of 8 GPUs
still reads row by row (8 rows, 24 phase rows); two nodes' tables no longer fit a screen."""
MANY_NODES = 8
"""Above this many nodes the Nodes table is summarized too: offset percentiles, the largest."""
SHOWN = 3
"""Slowest and fastest ranks shown (each), and nodes with the largest clock offsets."""
STRAGGLERS_SHOWN = 5
PERCENTILES = {"p0": 0.0, "p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
"""Columns of the distribution tables: numpy's percentiles (linear between ranks)."""
HOW_TO_SEE_ALL = "Every rank's tables: --format md, csv or json; one rank's: --rank N"


def many_ranks(report: RankedReport) -> bool:
    """Whether the terminal shows ``report``'s job summarized (more than :data:`MANY_RANKS`
    ranks in the job, whether or not ``--rank`` narrowed the report to one)."""
    return max(report.world_size, len(report.ranks)) > MANY_RANKS


NUMBER_COLUMNS = [
    "rank", "host", "device", "pid", "mean_step_ms", "slowest_steps",
    "gpu_time_ms", "nccl_ms", "nccl_exposed_ms", "nccl_wait_ms",
]  # fmt: skip


def rank_numbers(report: RankedReport, job: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per rank, in rank order: who it is, its mean step (the JSON's
    ``job.ranks[].mean_step_ms``), GPU time, NCCL time, exposed and waiting NCCL time, and
    in how many steps it was the slowest."""
    job = report.job() if job is None else job
    per_rank = {int(r["rank"]): r for r in job["ranks"]}
    slowest = pd.Series([s["slowest_rank"] for s in job["steps"]], dtype="int64").value_counts()
    rows = []
    for entry in report.ranks:
        rank = int(entry.info["rank"])
        steps = per_rank.get(rank, {})
        rows.append(
            {
                "rank": rank,
                "host": entry.info.get("host"),
                "device": entry.info.get("device"),
                "pid": entry.info.get("pid"),
                "mean_step_ms": float(steps.get("mean_step_ms", np.nan)),
                "slowest_steps": int(slowest.get(rank, 0)),
                "gpu_time_ms": float(entry.totals["gpu_time_ms"]),
                "nccl_ms": float(entry.comm.time_ms),
                "nccl_exposed_ms": float(entry.comm.exposed_ms),
                "nccl_wait_ms": float(steps.get("nccl_wait_ms", 0.0)),
            }
        )
    return pd.DataFrame(rows, columns=NUMBER_COLUMNS)


def by_step_time(numbers: pd.DataFrame) -> pd.DataFrame:
    """Ranks with a step time, slowest first (the lower rank first among equals)."""
    timed = numbers[numbers["mean_step_ms"].notna()]
    return timed.sort_values(["mean_step_ms", "rank"], ascending=[False, True], kind="stable")


def picks(numbers: pd.DataFrame, shown: int = SHOWN) -> list[tuple[str, int]]:
    """(label, rank): the ``shown`` slowest, the median, the ``shown`` fastest by mean step
    time, slowest first; every timed rank where there are no more than that."""
    order = [int(r) for r in by_step_time(numbers)["rank"]]
    if len(order) <= 2 * shown + 1:
        return [(f"slowest #{i + 1}", r) for i, r in enumerate(order)]
    middle = len(order) // 2
    return (
        [(f"slowest #{i + 1}", order[i]) for i in range(shown)]
        + [("median", order[middle])]
        + [(f"fastest #{i}", order[-i]) for i in range(shown, 0, -1)]
    )


def lane_ranks(report: RankedReport) -> list[int]:
    """The ranks the lanes picture draws: every rank of the report where it has no more
    than :data:`MANY_RANKS`; else the slowest, a median and the fastest by mean step time."""
    ranks = [int(e.info["rank"]) for e in report.ranks]
    if len(ranks) <= MANY_RANKS:
        return ranks
    order = [int(r) for r in by_step_time(rank_numbers(report))["rank"]]
    return [order[0], order[len(order) // 2], order[-1]] if len(order) >= 3 else ranks


def step_matrix(report: RankedReport) -> pd.DataFrame:
    """Every rank's step time (``step_ms``, the GPU span): ranks down, steps across, NaN
    where a rank has no such step."""
    if report.steps.empty:
        return pd.DataFrame()
    matrix = report.steps.pivot(index="rank", columns="step", values="step_ms")
    return matrix.sort_index().sort_index(axis=1).astype(np.float64)


def distribution(report: RankedReport, numbers: pd.DataFrame) -> pd.DataFrame:
    """Each per-rank number across ranks (and every rank's every step) as percentiles, and
    where its maximum is."""
    rows = []
    ranks = numbers["rank"].to_numpy()
    for quantity in ("mean_step_ms", "gpu_time_ms", "nccl_ms", "nccl_exposed_ms", "nccl_wait_ms"):
        values = numbers[quantity].to_numpy(np.float64)
        known = ~np.isnan(values)
        if known.any():
            at = int(ranks[known][np.argmax(values[known])])
            rows.append(_percentile_row(quantity, values[known], f"rank {at}"))
        if quantity == "mean_step_ms" and not report.steps.empty:
            steps = report.steps
            worst = int(np.argmax(steps["step_ms"].to_numpy(np.float64)))
            at_step = f"rank {steps['rank'].iloc[worst]}, step {steps['step'].iloc[worst]}"
            rows.append(_percentile_row("step_ms (each step)", steps["step_ms"], at_step))
    return pd.DataFrame(rows)


def percentiles(values: Any) -> dict[str, float]:
    """:data:`PERCENTILES` of ``values``, by name."""
    found = np.percentile(np.asarray(values, np.float64), list(PERCENTILES.values()))
    return dict(zip(PERCENTILES, map(float, found), strict=True))


def _percentile_row(name: str, values: Any, at: str) -> dict[str, Any]:
    return {"per rank": name, **percentiles(values), "max at": at}


def extremes(numbers: pd.DataFrame, steps: int) -> pd.DataFrame:
    """The rows of :func:`picks`, labelled, with ``slowest_steps`` as "k of N"."""
    rows = numbers.set_index("rank")
    out = []
    for label, rank in picks(numbers):
        row = rows.loc[rank]
        out.append(
            {
                "": label,
                "rank": rank,
                **{k: row[k] for k in ("host", "device", "pid", "mean_step_ms")},
                "slowest in": f"{row['slowest_steps']} of {steps}",
                **{k: row[k] for k in ("gpu_time_ms", "nccl_exposed_ms", "nccl_wait_ms")},
            }
        )
    return pd.DataFrame(out)


def stragglers(
    report: RankedReport, numbers: pd.DataFrame, job: dict[str, Any]
) -> pd.DataFrame | None:
    """The ranks last to join a step's collectives (the others wait for them), the most
    often first: in how many steps, and the least the others waited for it (mean of those
    steps); the ``straggler`` finding's rank marked. None without two ranks' waits."""
    joined = pd.DataFrame(last_to_join(job["steps"]))
    if joined.empty:
        return None
    grouped = joined.groupby("last_rank")["others_wait_ms"].agg(["size", "mean"])
    grouped = grouped.reset_index().sort_values(
        ["size", "mean", "last_rank"], ascending=[False, False, True], kind="stable"
    )
    found = {f.get("rank") for f in report.findings or [] if f.get("kind") == "straggler"}
    hosts = numbers.set_index("rank")["host"]
    return pd.DataFrame(
        [
            {
                "rank": int(rank),
                "host": hosts.get(int(rank)),
                "last in": f"{int(size)} of {len(joined)} steps",
                "others_wait_ms": float(mean),
                "finding": "straggler" if int(rank) in found else "",
            }
            for rank, size, mean in grouped.head(STRAGGLERS_SHOWN).itertuples(index=False)
        ]
    )


def nodes_summary(report: RankedReport, many: int = MANY_NODES) -> list[tuple[str, pd.DataFrame]]:
    """The Nodes table; above ``many`` nodes, its clock offsets as percentiles and the
    :data:`SHOWN` nodes with the largest."""
    if not report.nodes:
        return []
    table = node_table(report)
    if len(report.nodes) <= many:
        return [(NODES_TITLE, table)]
    later = report.nodes[1:]
    offsets = np.array([n["offset_ms"] for n in later if n["offset_ms"] is not None]) * 1000
    row: dict[str, Any] = {
        "nodes": len(report.nodes),
        "hosts": len({n["host"] for n in report.nodes}),
    }
    if len(offsets):
        row.update(percentiles(offsets))
    row.update(
        taken_out=sum(bool(n["applied"]) for n in later),
        ambiguous=sum(bool(n["ambiguous"]) for n in later),
        unknown=sum(n["offset_ms"] is None and not n["ambiguous"] for n in later),
    )
    largest = table.iloc[1:].assign(size=table["clock_offset_us"].iloc[1:].abs())
    largest = largest.sort_values("size", ascending=False, kind="stable").drop(columns="size")
    return [
        (f"{NODES_TITLE}: offsets (µs) of the {len(later)} others", pd.DataFrame([row])),
        (f"Nodes with the largest clock offsets (of {len(report.nodes)})", largest.head(SHOWN)),
    ]


def job_tables(report: RankedReport) -> list[tuple[str, pd.DataFrame]]:
    """The job of many ranks as a few short tables, titled."""
    job = report.job()
    numbers = rank_numbers(report, job)
    steps = len(job["steps"])
    hosts = len({e.info.get("host") for e in report.ranks})
    head = (
        f"The job across its {len(report.ranks):,} ranks ({hosts:,} host"
        f"{'s' if hosts != 1 else ''}, {steps} steps): percentiles"
    )
    tables = [(head, distribution(report, numbers))]
    if numbers["mean_step_ms"].notna().any():
        title = "Slowest, median and fastest ranks by mean step (GPU span)"
        tables.append((title, extremes(numbers, steps)))
    late = stragglers(report, numbers, job)
    if late is not None:
        tables.append(("Stragglers: last to join a step's collectives", late))
    return tables + nodes_summary(report)


def one_rank_tables(report: RankedReport, rank: int) -> list[tuple[str, pd.DataFrame]]:
    """``--rank N`` of a job of many ranks: the rank tables (the report holds that rank
    alone), the steps table cut to its rows, the nodes summarized."""
    tables = []
    for title, table in rank_tables(report):
        if title == NODES_TITLE:
            tables += nodes_summary(report)
        elif "step" in table:
            tables.append((f"{title} (rank {rank})", table[table["rank"] == rank]))
        else:
            tables.append((title, table))
    return tables
