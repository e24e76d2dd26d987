"""Communication on one GPU: NCCL kernels by collective, and how much of them compute hides.

The rule (docs/MULTI_GPU.md): NCCL kernels are the kernels whose name starts with
``nccl`` (every naming generation: ``ncclKernel_AllReduce_RING_LL_Sum_float``,
``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclDevKernel_SendRecv``, ...). Compute is
every other *kernel* on the same GPU; copies and memsets are not compute. Then

- ``time_ms``: the NCCL kernels' summed durations;
- ``overlapped_ms``: the length of the intersection of the union of the NCCL intervals
  with the union of the compute intervals;
- ``exposed_ms``: the NCCL union minus that overlap — the time the GPU does nothing but
  communicate.

Interval arithmetic is one sort of boundary events and a cumulative sum (no loop over
kernels), so it costs O(n log n) on millions of kernels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.names import matching
from profkit.traces.schema import NCCL_PREFIX

NS_PER_MS = 1_000_000
# Longest names first: "ReduceScatter" before "Reduce", "AllGather" before "Gather".
COLLECTIVES = (
    ("ReduceScatter", r"reduce_?scatter"),
    ("AllReduce", r"all_?reduce"),
    ("AllGather", r"all_?gather"),
    ("AllToAll", r"all_?to_?all"),
    ("Broadcast", r"broadcast|bcast"),
    ("SendRecv", r"send_?recv|sendrecv|send|recv"),
    ("Reduce", r"reduce"),
)
OTHER_COLLECTIVE = "Other"
_COLLECTIVE_RE = [(label, re.compile(pattern, re.IGNORECASE)) for label, pattern in COLLECTIVES]


def is_nccl(names: pd.Series | np.ndarray) -> np.ndarray:
    """True for each kernel name of an NCCL kernel (any naming generation)."""
    column = names if isinstance(names, pd.Series) else pd.Series(names, dtype=object)
    return matching(column, lambda name: bool(NCCL_PREFIX.match(name)))  # per distinct name


def collective(name: str) -> str:
    """The collective an NCCL kernel runs: ``AllReduce``, ``ReduceScatter``, ... or ``Other``.

    Only the part before the argument list counts (``ncclDevKernel_Generic(ncclDevComm*)``
    names no collective: NCCL 2.19+'s generic kernel runs whatever work it is handed).
    """
    head = name.split("(", 1)[0]
    for label, pattern in _COLLECTIVE_RE:
        if pattern.search(head):
            return label
    return OTHER_COLLECTIVE


def covered_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of the intervals ``[start, end)``."""
    seg_start, seg_end = union(start, end)
    return int((seg_end - seg_start).sum())


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals ``[start, end)`` as disjoint segments, sorted, none empty.

    One sort by start, then a running maximum of the ends: an interval opens a new segment
    where it starts after every earlier one has ended. Empty intervals (``end <= start``)
    cover nothing.
    """
    start, end = np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    keep = end > start
    if not keep.all():
        start, end = start[keep], end[keep]
    if len(start) > 1 and (start[1:] < start[:-1]).any():  # kernels mostly come sorted
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
    if not len(start):
        return start, end
    reach = np.maximum.accumulate(end)
    opens = np.empty(len(start), dtype=bool)
    opens[0] = True
    np.greater(start[1:], reach[:-1], out=opens[1:])
    first = np.flatnonzero(opens)
    last = np.append(first[1:], len(start)) - 1  # each segment ends where the next opens
    return start[first], reach[last]


def both_covered_ns(
    a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray, b_end: np.ndarray
) -> int:
    """Length of (union of the A intervals) ∩ (union of the B intervals).

    Each union is a sorted list of disjoint segments (:func:`union`); the time B covers
    before any point is a binary search in B's segments plus a running sum of their
    lengths, so each A segment's share is the difference of two such lookups.
    """
    if not len(a_start) or not len(b_start):
        return 0
    a_from, a_to = union(a_start, a_end)
    b_from, b_to = union(b_start, b_end)
    if not len(a_from) or not len(b_from):
        return 0
    before = np.concatenate([[0], np.cumsum(b_to - b_from)])  # B's time before segment i

    def covered_before(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(b_from, t, side="right")  # B segments starting at or before t
        last = np.maximum(i - 1, 0)
        inside = np.where(i > 0, np.minimum(t, b_to[last]) - b_from[last], 0)
        return before[last] * (i > 0) + inside

    return int((covered_before(a_to) - covered_before(a_from)).sum())


@dataclass
class CommStats:
    """One GPU's (one rank's) communication; times in ms."""

    kernels: int = 0
    time_ms: float = 0.0
    overlapped_ms: float = 0.0
    exposed_ms: float = 0.0
    by_collective: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "kernels": self.kernels,
            "time_ms": self.time_ms,
            "overlapped_ms": self.overlapped_ms,
            "exposed_ms": self.exposed_ms,
            "by_collective": self.by_collective,
        }


@dataclass
class Intervals:
    """GPU activities as arrays: start and end (ns) and device of each."""

    start: np.ndarray
    end: np.ndarray
    device: np.ndarray

    def take(self, rows: np.ndarray) -> Intervals:
        """The activities at ``rows`` (indices or a mask)."""
        return Intervals(self.start[rows], self.end[rows], self.device[rows])


def comm_stats_apart(nccl: Intervals, compute: Intervals, nccl_names: np.ndarray) -> CommStats:
    """NCCL time, its overlap with compute and the exposed rest, from NCCL kernels and
    compute kernels given apart (names: the NCCL kernels', in order); activities of
    several devices are measured per device and summed."""
    union_ns = overlap_ns = 0
    devices = np.unique(nccl.device)
    one = len(devices) == 1 and bool((compute.device == devices[0]).all())
    for dev in devices:
        # One GPU (a rank's): no copies of its (maybe millions of) compute kernels.
        n = nccl if one else nccl.take(nccl.device == dev)
        c = compute if one else compute.take(compute.device == dev)
        union_ns += covered_ns(n.start, n.end)
        overlap_ns += both_covered_ns(n.start, n.end, c.start, c.end)
    duration = (nccl.end - nccl.start).clip(min=0)
    return CommStats(
        kernels=len(nccl.start),
        time_ms=int(duration.sum()) / NS_PER_MS,
        overlapped_ms=overlap_ns / NS_PER_MS,
        exposed_ms=(union_ns - overlap_ns) / NS_PER_MS,
        by_collective=_by_collective(nccl_names, duration),
    )


def _by_collective(names: np.ndarray, duration: np.ndarray) -> list[dict[str, Any]]:
    if not len(names):
        return []
    codes, distinct = pd.factorize(names)
    labels = np.array([collective(str(n)) for n in distinct], dtype=object)[codes]
    frame = pd.DataFrame({"collective": labels, "duration": duration})
    grouped = frame.groupby("collective", sort=False)["duration"].agg(["size", "sum"])
    grouped = grouped.sort_values("sum", ascending=False, kind="stable")
    return [
        {
            "collective": str(label),
            "kernels": int(row["size"]),
            "time_ms": int(row["sum"]) / NS_PER_MS,
        }
        for label, row in grouped.iterrows()
    ]
