"""Rules across ranks: ``straggler`` (the rank the others wait for) and ``exposed_comm``
(NCCL transfer time no compute hides), from the report's per-rank NCCL numbers and its
job table (docs/MULTI_GPU.md: ``nccl_wait_ms``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from profkit.analysis.findings.model import Finding
from profkit.analysis.report_types import RankedReport
from profkit.analysis.steps import last_to_join

if TYPE_CHECKING:
    from profkit.analysis.report_types import KernelReport

STRAGGLER_MIN_STEP_FRACTION = 0.75
"""A straggler is the last rank to join the collectives in at least this share of steps."""
STRAGGLER_MIN_STEPS = 2
"""... over at least this many captured steps (one step says nothing of "step after step")."""
STRAGGLER_MIN_WAIT_SHARE = 0.10
"""... and the others wait for it at least this share of the mean step."""
EXPOSED_MIN_SHARE = 0.05
"""exposed_comm: NCCL transfer not hidden by compute, at least this share of the rank's
captured step time."""


def straggler(
    report: KernelReport, idle: dict[int | None, dict[str, float]] | None = None
) -> list[Finding]:
    """The rank the others wait for, step after step. recoverable_ms: per step, the least
    the other ranks waited for it (every rank's step would end that much sooner), bounded
    by the straggler's own host idle in that step where it has a ``host_idle`` finding
    (``idle``: rank -> step -> ms): that is the part its own fix gives back; the rest of
    the wait is the ranks' ordinary skew."""
    if not isinstance(report, RankedReport) or not report.ranks or not len(report.steps):
        return []
    job = report.job()
    joined = last_to_join(job.get("steps", []))
    lasts = [row["last_rank"] for row in joined]
    waits = [row["others_wait_ms"] for row in joined]
    rows = [{**row, "others_wait_ms": round(row["others_wait_ms"], 6)} for row in joined]
    if not lasts:
        return []
    rank = max(set(lasts), key=lasts.count)
    mine = [w for r, w in zip(lasts, waits, strict=True) if r == rank]
    mean_step = float(np.mean([s["slowest_ms"] for s in job["steps"]]))
    if len(lasts) < STRAGGLER_MIN_STEPS or len(mine) < STRAGGLER_MIN_STEP_FRACTION * len(lasts):
        return []
    if not mean_step or float(np.median(mine)) < STRAGGLER_MIN_WAIT_SHARE * mean_step:
        return []
    own = (idle or {}).get(rank)
    if own:
        mine = [min(w, own.get(str(r["step"]), 0.0))
                for r, w in zip((r for r in rows if r["last_rank"] == rank), mine, strict=True)]  # fmt: skip
    total = float(sum(mine))
    span = mean_step * len(lasts)
    return [Finding(
        "straggler", total, total / span,
        {"count": len(mine), "steps": len(lasts), "mean_step_ms": round(mean_step, 6),
         "nccl_wait_ms": {str(r["rank"]): r["nccl_wait_ms"] for r in job.get("ranks", [])},
         "own_host_idle_ms": own or None,
         "rows": rows},
        f"The other ranks wait for rank {rank} in {len(mine)} of {len(lasts)} steps "
        f"({total / max(len(mine), 1):.2f} ms a step to recover): look at what rank {rank} does before its "
        "collectives (data loading, host work, an uneven batch, a slower GPU).",
        rank, None,
    )]  # fmt: skip


def exposed_comm(report: KernelReport) -> list[Finding]:
    """Per rank, NCCL time no compute overlaps, less the time spent waiting for the last
    rank (that is the straggler's): the transfer that overlap could hide."""
    if not isinstance(report, RankedReport) or not report.ranks:
        return []
    ranks, job = report.ranks, report.job()
    per_rank = {int(r["rank"]): r for r in job.get("ranks", [])}
    found = []
    for entry in ranks:
        rank = int(entry.info["rank"])
        comm = entry.comm.to_json()
        info = per_rank.get(rank, {})
        wait = float(info.get("nccl_wait_ms") or 0.0)
        span = float(info.get("mean_step_ms") or 0.0) * max(len(job.get("steps", [])), 1)
        transfer = max(0.0, float(comm["exposed_ms"]) - wait)
        if not span or transfer / span < EXPOSED_MIN_SHARE:
            continue
        found.append(Finding(
            "exposed_comm", transfer, transfer / span,
            {"count": comm["kernels"], "time_ms": comm["time_ms"],
             "overlapped_ms": comm["overlapped_ms"], "exposed_ms": comm["exposed_ms"],
             "wait_ms": round(wait, 6), "rows": comm["by_collective"]},
            f"{transfer:.2f} ms of NCCL transfer on rank {rank} runs with no compute beside "
            "it: overlap it (DDP bucket_cap_mb, FSDP prefetch, gradient accumulation with "
            "no_sync), or communicate less (bf16 gradients, fewer all-reduces).",
            rank, None,
        ))  # fmt: skip
    return found
