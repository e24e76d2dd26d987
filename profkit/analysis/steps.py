"""The job across ranks, step by step: the slowest rank, the spread, the wait for the last.

A rank's steps start at each instance of its first phase (``forward``) on the thread that
holds most of them; an activity belongs to the step in which it was launched (its launch
call's start, else its own start). Per (step, rank): ``step_ms`` is the GPU span (first
kernel start to last kernel end), ``nccl_ms`` the NCCL kernels' time, ``nccl_wait_ms``
the part of it spent waiting for the last rank to join (:func:`nccl_waits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.comm import Intervals

NS_PER_MS = 1_000_000
STEP_COLUMNS = ["step", "rank", "step_ms", "nccl_ms", "nccl_wait_ms"]


@dataclass
class RankSteps:
    """One rank's activities with the step each belongs to (-1: before the first)."""

    rank: int
    step: np.ndarray
    start: np.ndarray
    end: np.ndarray
    nccl: np.ndarray
    is_kernel: np.ndarray

    @classmethod
    def of(
        cls,
        rank: int,
        ranges: pd.DataFrame,
        first_phase: str,
        activities: Intervals,
        launch_start: np.ndarray,
        is_kernel: np.ndarray,
        nccl: np.ndarray,
    ) -> RankSteps:
        """One rank's steps from its ranges and its activities' arrays: ``launch_start``
        -1 where the launch call is unknown, ``nccl`` (a subset of ``is_kernel``) marking
        its NCCL kernels."""
        starts = step_starts(ranges, first_phase)
        point = np.where(launch_start >= 0, launch_start, activities.start)
        step = np.searchsorted(starts, point, side="right") - 1
        return cls(rank, step, activities.start, activities.end, nccl, is_kernel)

    def kernels_of(self, step: int) -> pd.DataFrame:
        """``start``, ``end`` (ns) and ``nccl`` of the kernels of one step."""
        chosen = (self.step == step) & self.is_kernel
        return pd.DataFrame(
            {"start": self.start[chosen], "end": self.end[chosen], "nccl": self.nccl[chosen]}
        )

    def table(self) -> pd.DataFrame:
        """Per step: GPU span start/end and NCCL time."""
        return pd.DataFrame(self.table_columns())

    def table_columns(self) -> dict[str, np.ndarray]:
        """:meth:`table`'s columns (``step``, ``start``, ``end``, ``nccl_ms``, ``rank``)."""
        inside = self.step >= 0
        frame = pd.DataFrame(
            {
                "step": self.step[inside],
                "start": self.start[inside],
                "end": self.end[inside],
                "nccl_ns": np.where(self.nccl, self.end - self.start, 0)[inside],
            }
        )
        out = frame.groupby("step").agg(
            start=("start", "min"), end=("end", "max"), nccl_ns=("nccl_ns", "sum")
        )
        out["nccl_ms"] = out.pop("nccl_ns") / NS_PER_MS
        out = out.reset_index().assign(rank=self.rank)
        return {c: out[c].to_numpy() for c in out.columns}


def step_starts(ranges: pd.DataFrame, first_phase: str) -> np.ndarray:
    """Start of each instance of the first phase on the thread that holds most of them."""
    r = ranges[ranges["name"] == first_phase]
    if r.empty:
        return np.empty(0, np.int64)
    owner = r["thread"].value_counts().index[0]
    return np.sort(r.loc[r["thread"] == owner, "start"].to_numpy(np.int64))


def nccl_waits(ranks: list[RankSteps]) -> pd.DataFrame:
    """Per (step, rank): NCCL time spent before the last rank's matching kernel started.

    The k-th NCCL kernel of a step on each rank is taken to be one collective (ranks issue
    collectives in the same order); it cannot finish before every rank has joined, so on
    a rank that started it early, ``min(latest start - own start, duration)`` is waiting.
    Only collectives every rank ran are counted.
    """
    if len(ranks) < 2:
        return pd.DataFrame(columns=["step", "rank", "wait_ms"])
    # One frame of every rank's NCCL kernels (a frame per rank costs ms each: 1,024 ranks),
    # each (rank, step)'s kernels numbered in start order (k).
    chosen = [r.nccl & (r.step >= 0) for r in ranks]
    frame = pd.DataFrame(
        {
            "step": np.concatenate([r.step[c] for r, c in zip(ranks, chosen, strict=True)]),
            "start": np.concatenate([r.start[c] for r, c in zip(ranks, chosen, strict=True)]),
            "duration": np.concatenate(
                [(r.end - r.start)[c] for r, c in zip(ranks, chosen, strict=True)]
            ),
            "rank": np.repeat([r.rank for r in ranks], [int(c.sum()) for c in chosen]),
        }
    )
    order = np.lexsort((frame["start"].to_numpy(), frame["step"].to_numpy(),
                        np.repeat(np.arange(len(ranks)), [int(c.sum()) for c in chosen])))  # fmt: skip
    frame = frame.iloc[order].reset_index(drop=True)
    frame["k"] = frame.groupby(["rank", "step"], sort=False).cumcount()
    frame = frame[frame.groupby(["step", "k"])["rank"].transform("nunique") == len(ranks)]
    latest = frame.groupby(["step", "k"])["start"].transform("max")
    waiting = np.minimum(latest - frame["start"], frame["duration"]).clip(lower=0)
    waits = frame.assign(wait_ns=waiting).groupby(["step", "rank"])["wait_ns"].sum()
    return (waits / NS_PER_MS).rename("wait_ms").reset_index()


def step_table(ranks: list[RankSteps]) -> pd.DataFrame:
    """One row per (step, rank): ``step_ms`` (GPU span), ``nccl_ms``, ``nccl_wait_ms``."""
    # One frame from every rank's columns (a frame per rank costs ms each: 1,024 ranks)
    parts = [c for c in (r.table_columns() for r in ranks) if len(c["step"])]
    if not parts:
        return pd.DataFrame(columns=STEP_COLUMNS)
    table = pd.DataFrame({c: np.concatenate([p[c] for p in parts]) for c in parts[0]})
    table["step_ms"] = (table["end"] - table["start"]) / NS_PER_MS
    table = table.merge(nccl_waits(ranks), on=["step", "rank"], how="left")
    table["nccl_wait_ms"] = table.pop("wait_ms").fillna(0.0).astype(float)
    return table[STEP_COLUMNS].sort_values(["step", "rank"]).reset_index(drop=True)


def job_summary(steps: pd.DataFrame, world_size: int) -> dict[str, Any]:
    """Per step: slowest and fastest rank, spread; per rank: mean step and NCCL wait."""
    if steps.empty:
        return {"world_size": world_size, "steps": [], "ranks": []}
    per_step = _step_records(steps)
    by_rank = steps.groupby("rank").agg(
        mean_step_ms=("step_ms", "mean"),
        nccl_ms=("nccl_ms", "sum"),
        nccl_wait_ms=("nccl_wait_ms", "sum"),
    )
    slowest = pd.Series([s["slowest_rank"] for s in per_step]).value_counts()
    return {
        "world_size": world_size,
        "slowest_rank": int(slowest.index[0]),
        "mean_spread_ms": float(np.mean([s["spread_ms"] for s in per_step])),
        "steps": per_step,
        "ranks": [
            {"rank": int(rank), **{k: float(v) for k, v in row.items()}}
            for rank, row in by_rank.iterrows()
        ],
    }


def _step_records(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """Per step, in step order: its slowest and fastest rank (the first of equals), the
    spread, and each rank's NCCL wait (one pass: a group per step costs ~1 ms a step)."""
    grouped = steps.groupby("step", sort=True)
    step_ms = steps["step_ms"].to_numpy(np.float64)
    rank = steps["rank"].to_numpy()
    slowest = grouped["step_ms"].idxmax()
    slow = steps.index.get_indexer(slowest)
    fast = steps.index.get_indexer(grouped["step_ms"].idxmin())
    waits: dict[Any, dict[str, float]] = {}
    for step, who, wait in zip(steps["step"], rank, steps["nccl_wait_ms"], strict=True):
        waits.setdefault(step, {})[str(int(who))] = float(wait)
    return [
        {
            "step": int(step),
            "slowest_rank": int(rank[s]),
            "slowest_ms": float(step_ms[s]),
            "fastest_rank": int(rank[f]),
            "fastest_ms": float(step_ms[f]),
            "spread_ms": float(step_ms[s] - step_ms[f]),
            "nccl_wait_ms": waits[step],
        }
        for step, s, f in zip(slowest.index, slow, fast, strict=True)
    ]


def last_to_join(job_steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step of :func:`job_summary` whose waits name two ranks or more: the rank that
    waited least in its collectives (the last to join them: ``last_rank``) and the least
    any other rank waited (``others_wait_ms``: what every rank's step would give back)."""
    rows = []
    for step in job_steps:
        wait = {int(r): float(w) for r, w in (step.get("nccl_wait_ms") or {}).items()}
        if len(wait) < 2:
            continue
        last = min(wait, key=lambda r: wait[r])
        others = min(w for r, w in wait.items() if r != last)
        rows.append({"step": step["step"], "last_rank": last, "others_wait_ms": others})
    return rows
