"""Sortable (lane, time) keys and interval look-ups: the arithmetic attribution rests on.

A lane is a thread or a process. Packing (lane, time) into one int64 lets a single sort or
``searchsorted`` serve every lane at once: keys of one lane never mix with another's, so
"which range of this thread was open at this time" is one binary search over all threads.
"""

from __future__ import annotations

import numpy as np


class Lanes:
    """Packs (lane, time) into one sortable int64: lane code * span + time offset."""

    def __init__(self, lanes: np.ndarray, times: list[np.ndarray]) -> None:
        self.lanes = np.unique(lanes)
        present = [t for t in times if len(t)]
        self.base = int(min(t.min() for t in present)) if present else 0
        top = int(max(t.max() for t in present)) if present else 0
        self.span = top - self.base + 2
        if (len(self.lanes) + 2) * self.span >= 2**62:
            raise ValueError("trace too long to pack thread and time into one key")

    @classmethod
    def restored(cls, lanes: np.ndarray, base: int, span: int) -> Lanes:
        """The lanes whose ``lanes``, ``base`` and ``span`` were kept."""
        made = cls.__new__(cls)
        made.lanes, made.base, made.span = np.asarray(lanes, dtype=np.int64), int(base), int(span)
        return made

    def codes(self, lane: np.ndarray) -> np.ndarray:
        """Dense code per lane id; lanes not given at construction share the last code."""
        index = np.searchsorted(self.lanes, lane)
        index = np.minimum(index, max(len(self.lanes) - 1, 0))
        known = (self.lanes[index] == lane) if len(self.lanes) else np.zeros(len(lane), bool)
        return np.where(known, index, len(self.lanes)).astype(np.int64)

    def key(self, lane: np.ndarray, time: np.ndarray) -> np.ndarray:
        return self.codes(lane) * self.span + (time - self.base)

    def starts(self) -> np.ndarray:
        """The smallest key of every lane (lane code * span), in order."""
        return np.arange(len(self.lanes) + 1, dtype=np.int64) * self.span


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint intervals covering the same keys, sorted by start."""
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    first = np.ones(len(start), dtype=bool)
    first[1:] = start[1:] > reach[:-1]
    last = np.append(np.flatnonzero(first)[1:] - 1, len(start) - 1)
    return start[first], reach[last]


def stab(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Index of the interval (sorted, non-overlapping, [start, end)) holding each point, or -1."""
    if not len(starts):
        return np.full(len(points), -1, dtype=np.int64)
    index = np.searchsorted(starts, points, side="right") - 1
    inside = (index >= 0) & (points < ends[np.maximum(index, 0)])
    return np.where(inside, index, -1)


def inside_any(start: np.ndarray, end: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Whether each point lies in any of the (possibly overlapping) [start, end) intervals."""
    if not len(start):
        return np.zeros(len(points), dtype=bool)
    starts, ends = union(start, end)
    return stab(starts, ends, points) >= 0
