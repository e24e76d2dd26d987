"""Kernel durations as counts: how many activities of each group lasted each duration.

A group's statistics (count, total, mean, median, minimum, maximum, standard deviation)
need its durations, not its activities: ``DurationCounts`` holds one sorted int64 key
``group << 40 | duration`` per distinct (group, duration) and how many activities have
it. Counts of several parts (the ranks of a trace, the files of a job) add up into the
counts of the whole, so the statistics across ranks come from counts, never from a copy
of every activity's key: a long run repeats its durations (a few distinct durations per
kernel and phase), and what the counts take shrinks with the repeats.

Sums are integers (exact up to 2^63 ns) before they become floats, so the statistics do
not depend on how the durations were split into parts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit.analysis.tables import NS_PER_MS, NS_PER_US

DURATION_BITS = 40  # durations below 2^40 ns (18 minutes) pack beside a group code
DURATION_MASK = (1 << DURATION_BITS) - 1


@dataclass
class DurationCounts:
    """Sorted distinct ``group << 40 | duration`` keys and how many activities have each."""

    keys: np.ndarray
    counts: np.ndarray

    def regrouped(self, to: Callable[[np.ndarray], np.ndarray]) -> DurationCounts:
        """The counts with each group code mapped by ``to`` (groups it maps together add up)."""
        keys = (to(self.keys >> DURATION_BITS) << DURATION_BITS) | (self.keys & DURATION_MASK)
        return _summed(keys, self.counts)

    def stats(self) -> pd.DataFrame:
        """Per group: its code, instances, total (ms), mean, median, minimum, maximum and
        standard deviation (µs), and its longest duration (``high``, ns)."""
        keys, counts = self.keys, self.counts
        group = keys >> DURATION_BITS
        duration = keys & DURATION_MASK
        first = np.flatnonzero(np.diff(group, prepend=-1)) if len(keys) else np.zeros(0, np.int64)
        last = np.append(first[1:], len(keys))[: len(first)] - 1
        ends = np.cumsum(counts)  # activities up to each key's, included
        before = ends[first] - counts[first]
        n = ends[last] - before
        low, high = duration[first], duration[last]
        median = (
            _at(ends, duration, before + (n - 1) // 2) + _at(ends, duration, before + n // 2)
        ) / 2
        total = _add(counts * duration, first)
        deviation = duration - np.repeat(low, last - first + 1)  # from a member: stable
        shifted = _add(counts * deviation, first).astype(np.float64)
        shifted_sq = _add(counts * np.square(deviation.astype(np.float64)), first)
        squares = shifted_sq - shifted * shifted / np.maximum(n, 1)
        std = np.where(n > 1, np.sqrt(np.maximum(squares, 0) / np.maximum(n - 1, 1)), 0.0)
        return pd.DataFrame(
            {
                "group": group[first],
                "instances": n.astype(np.int64),
                "total_ms": total.astype(np.float64) / NS_PER_MS,
                "avg_us": total.astype(np.float64) / n / NS_PER_US,
                "med_us": median / NS_PER_US,
                "min_us": low / NS_PER_US,
                "max_us": high / NS_PER_US,
                "std_us": std / NS_PER_US,
                "high": high,
            }
        )


def counted(keys: np.ndarray) -> DurationCounts:
    """The counts of sorted ``group << 40 | duration`` keys (one per activity)."""
    first = np.flatnonzero(np.diff(keys, prepend=-1)) if len(keys) else np.zeros(0, np.int64)
    return DurationCounts(keys[first], np.diff(np.append(first, len(keys))).astype(np.int64))


def added(parts: Sequence[DurationCounts]) -> DurationCounts:
    """The counts of several parts together (their group codes must mean the same)."""
    if not parts:
        return DurationCounts(np.zeros(0, np.int64), np.zeros(0, np.int64))
    return _summed(
        np.concatenate([p.keys for p in parts]), np.concatenate([p.counts for p in parts])
    )


def _summed(keys: np.ndarray, counts: np.ndarray) -> DurationCounts:
    """Keys sorted and equal ones' counts added."""
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    if not len(keys):
        return DurationCounts(keys, counts)
    first = np.flatnonzero(np.diff(keys, prepend=-1))
    return DurationCounts(keys[first], np.add.reduceat(counts, first))


def _at(ends: np.ndarray, duration: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The duration of the activity at each ``position`` (from 0) in key order."""
    return duration[np.searchsorted(ends, position, side="right")]


def _add(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per group (runs starting at ``first``), the sum of its ``values``."""
    return np.add.reduceat(values, first) if len(first) else np.zeros(0, values.dtype)
