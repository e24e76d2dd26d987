"""Kernel statistics of the ranks of a multi-process trace, from one sort of int64 keys.

:func:`.stream_rank_sums.add_up_ranks` leaves one key per selected activity,
``(rank, name, phase) << 40 | duration``. :func:`kernel_statistics` sorts those keys once
and derives the four tables a ranked report needs, each by mapping the sorted keys and
sorting them again with ``kind="stable"`` (numpy's timsort merges the runs the first sort
left: a fraction of a quicksort): per (rank, name, phase), per (rank, name), per (name,
phase), per name. :func:`first_longest` and :func:`coarse_longest` find each group's
first longest activity in trace order, which the tables show the launch shape of.

The mapping and the pass over the chunks run on up to four threads
(:func:`.chunked.map_chunks`), each chunk writing its own rows or returning its first
hits; the result is one thread's, to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis import stream_stats as stats_of
from profkit.analysis import stream_tables as tables
from profkit.analysis.chunked import map_chunks
from profkit.analysis.tables import NS_PER_MS, NS_PER_US
from profkit.traces.columns import ActivityColumns

BITS, MASK = stats_of.DURATION_BITS, stats_of.DURATION_MASK


@dataclass
class Stats:
    """Duration statistics of groups (codes, ascending), and each group's longest duration."""

    group: np.ndarray
    frame: pd.DataFrame  # stream_stats.STAT_COLUMNS but name, phase, grid, block
    high: np.ndarray


def _stats(keys: np.ndarray) -> Stats:
    """What :func:`.stream_stats.kernel_stats` computes per group, from sorted keys."""
    first = stats_of._runs(keys)
    group = keys[first] >> BITS
    count = np.diff(np.append(first, len(keys)))
    low = keys[first] & MASK
    high = keys[first + count - 1] & MASK
    median = ((keys[first + (count - 1) // 2] & MASK) + (keys[first + count // 2] & MASK)) / 2
    total, squares = stats_of._sums(keys, first, count)
    std = np.where(count > 1, np.sqrt(np.maximum(squares, 0) / np.maximum(count - 1, 1)), 0.0)
    frame = pd.DataFrame(
        {
            "instances": count.astype(np.int64),
            "total_ms": total / NS_PER_MS,
            "avg_us": total / count / NS_PER_US,
            "med_us": median / NS_PER_US,
            "min_us": low / NS_PER_US,
            "max_us": high / NS_PER_US,
            "std_us": std / NS_PER_US,
        }
    )
    return Stats(group, frame, high)


def _regrouped(keys: np.ndarray, to: Any) -> np.ndarray:
    """The keys with each group code mapped by ``to``, sorted again (runs merged)."""
    out = np.empty_like(keys)

    def chunk(lo: int, hi: int) -> None:  # writes out[lo:hi] only
        part = keys[lo:hi]
        out[lo:hi] = (to(part >> BITS) << BITS) | (part & MASK)

    for _ in map_chunks(chunk, len(keys), tables.CHUNK):
        pass
    out.sort(kind="stable")
    return out


@dataclass
class KernelStatistics:
    """The four statistics tables, with group codes: ``rank_phase`` (rank, name, phase),
    ``rank_name`` (rank, name), ``name_phase`` (name, phase), ``name`` (name)."""

    rank_phase: Stats
    rank_name: Stats
    name_phase: Stats
    name: Stats


def kernel_statistics(keys: np.ndarray, n_names: int, n_phases: int) -> KernelStatistics:
    """Statistics per (rank, name, phase), per (rank, name), per (name, phase) and per
    name, from the sorted (rank, name, phase) keys (see the module doc)."""
    fine = _stats(keys)
    by_rank_name = _stats(_regrouped(keys, lambda g: g // n_phases))
    name_phase_keys = _regrouped(keys, lambda g: g % (n_names * n_phases))
    del keys
    by_name_phase = _stats(name_phase_keys)
    by_name = _stats(_regrouped(name_phase_keys, lambda g: g // n_phases))
    return KernelStatistics(fine, by_rank_name, by_name_phase, by_name)


def first_longest(cols: ActivityColumns, group: np.ndarray, fine: Stats, size: int) -> np.ndarray:
    """Per fine group (``fine.group`` order): the index of its first activity (in trace
    order) with the group's longest duration; one pass over the chunks."""
    longest_of = np.full(size, -1, dtype=np.int64)
    longest_of[fine.group] = fine.high
    first_hit = np.full(size, len(cols), dtype=np.int64)

    def chunk(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The groups with a longest activity in the chunk, and the first such row."""
        g = group[lo:hi].astype(np.int64)
        rows = np.flatnonzero(g >= 0)
        duration = cols.arrays["duration"][lo:hi][rows].clip(min=0)
        hit = duration == longest_of[g[rows]]
        groups, first = np.unique(g[rows][hit], return_index=True)
        return groups, lo + rows[hit][first]

    for groups, rows in map_chunks(chunk, len(cols), tables.CHUNK):
        first_hit[groups] = np.minimum(first_hit[groups], rows)  # ``groups`` are distinct
    return first_hit[fine.group]


def coarse_longest(fine: Stats, first: np.ndarray, coarse: Stats, to: Any) -> np.ndarray:
    """Per coarse group: the first of its fine groups' longest activities that are as long
    as the coarse group's longest (its first longest activity in trace order)."""
    index = np.searchsorted(coarse.group, to(fine.group))
    candidate = fine.high == coarse.high[index]
    best = np.full(len(coarse.group), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best, index[candidate], first[candidate])
    return best
