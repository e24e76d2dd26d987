"""Per-kernel duration statistics of the streaming analysis, from sorted int64 keys.

:func:`kernel_stats` gives, per (name, phase) and per name, what
:func:`.tables.kernel_tables` shows (count, total, mean, median, minimum, maximum,
standard deviation, the shape of the longest instance) without a group-by over millions
of rows: one int64 array of ``(name * phases + phase) << 40 | duration`` per batch of
names, sorted, read by binary searches and ``reduceat`` over its runs; the per-name keys
are the same with the phase dropped, which a stable sort (a merge of the per-phase runs)
orders. Chunks of the passes run on a few threads (:mod:`.chunked`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.analysis import stream_tables as tables
from profkit.analysis.chunked import map_chunks, threads
from profkit.analysis.tables import NS_PER_MS, NS_PER_US
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns

DURATION_BITS = 40  # durations below 2^40 ns (18 minutes) pack beside a group code
DURATION_MASK = (1 << DURATION_BITS) - 1
BATCH = 1 << 23  # activities whose statistics are sorted at once: 64 MB of keys

STAT_COLUMNS = ["name", "phase", "instances", "total_ms", "avg_us", "med_us", "min_us",
                "max_us", "std_us", "grid", "block"]  # fmt: skip
"""The columns of :func:`kernel_stats`' tables (name and phase are codes; phase -1: all)."""


def kernel_stats(
    cols: ActivityColumns, phase: np.ndarray, n_phases: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Duration statistics per (name, phase) and per name of the activities whose ``phase``
    is not -1 (not selected), with the shape of each group's longest one.

    Names are taken in batches of at most :data:`BATCH` activities (one batch below that
    size), so the sorted keys stay bounded whatever the trace's size. In a batch, one sort:
    the per-name keys are the per-(name, phase) keys with the phase dropped, already
    sorted within each phase, so a stable sort (a merge of those runs) orders them.
    """
    per_phase_parts, overall_parts = [], []
    for names in _name_batches(cols, phase, n_phases):
        keys = _group_keys(cols, phase, n_phases, names)
        per_phase_parts.append(_duration_stats(keys, n_phases, by_phase=True))
        _drop_phase(keys, n_phases)
        keys.sort(kind="stable")
        overall_parts.append(_duration_stats(keys, n_phases, by_phase=False))
        del keys
    per_phase = pd.concat(per_phase_parts, ignore_index=True)
    overall = pd.concat(overall_parts, ignore_index=True)
    per_phase["longest"] = _longest(cols, phase, per_phase, n_phases)
    overall["longest"] = _longest_overall(per_phase, overall)
    longest = np.unique(np.concatenate([per_phase["longest"], overall["longest"]]))
    shape_of = dict(zip(longest.tolist(), cols.shapes_at(longest), strict=True))
    for table in (per_phase, overall):
        shapes = [shape_of[i] for i in table.pop("longest").tolist()]
        table["grid"] = [g for g, _ in shapes]
        table["block"] = [b for _, b in shapes]
        table.pop("high")
    return per_phase[STAT_COLUMNS], overall[STAT_COLUMNS]


def _name_batches(cols: ActivityColumns, phase: np.ndarray, n_phases: int) -> list[range]:
    """Consecutive name codes in batches of at most ``BATCH`` selected activities (a name
    with more is a batch of its own); one batch holding every name when all fit."""
    if len(cols) <= BATCH:  # every activity fits one batch: no need to count them
        return [range(0, len(cols.names))]

    def count(lo: int, hi: int) -> np.ndarray:
        return np.bincount(cols.arrays["name"][lo:hi][phase[lo:hi] >= 0], minlength=len(cols.names))

    per_name = np.zeros(len(cols.names), dtype=np.int64)
    for part in map_chunks(count, len(cols), tables.CHUNK):
        per_name += part
    batches, start, held = [], 0, 0
    for name, size in enumerate(per_name.tolist()):
        if held and held + size > BATCH:
            batches.append(range(start, name))
            start, held = name, 0
        held += size
    return [*batches, range(start, len(cols.names))]


def _group_of(name: np.ndarray, phase: np.ndarray, n_phases: int) -> np.ndarray:
    return name.astype(np.int64) * n_phases + phase


def _group_keys(
    cols: ActivityColumns, phase: np.ndarray, n_phases: int, names: range
) -> np.ndarray:
    """Sorted ``(name * n_phases + phase) << 40 | duration`` of the selected activities
    whose name code is in ``names``.

    Chunks fill their slices of the keys on several threads; the keys are then sorted in
    a few parts at once, and the parts merged by a stable sort (numpy's timsort merges
    sorted runs in one pass)."""
    size = tables.CHUNK
    every = names.start == 0 and names.stop >= len(cols.names)

    def selected(lo: int, hi: int) -> np.ndarray:
        keep = phase[lo:hi] >= 0
        if not every:
            name = cols.arrays["name"][lo:hi]
            keep &= (name >= names.start) & (name < names.stop)
        return keep

    counts = list(map_chunks(lambda lo, hi: int(selected(lo, hi).sum()), len(cols), size))
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    keys = np.empty(int(offsets[-1]), dtype=np.int64)

    def fill(lo: int, hi: int) -> bool:  # writes its own slice of ``keys``; True: too long
        keep = selected(lo, hi)
        group = _group_of(cols.arrays["name"][lo:hi][keep], phase[lo:hi][keep], n_phases)
        duration = cols.arrays["duration"][lo:hi][keep].clip(min=0)
        at = int(offsets[lo // size])
        keys[at : at + len(group)] = (group << DURATION_BITS) | (duration & DURATION_MASK)
        return bool(len(duration) and duration.max() > DURATION_MASK)

    if any(list(map_chunks(fill, len(cols), size))):
        raise BadInput("an activity lasts over 18 minutes: not a trace profkit can read")
    part = -(-len(keys) // threads())
    for _ in map_chunks(lambda lo, hi: keys[lo:hi].sort(), len(keys), max(part, 1)):
        pass
    if part < len(keys):
        keys.sort(kind="stable")  # merges the sorted parts
    return keys


def _drop_phase(keys: np.ndarray, n_phases: int) -> None:
    """``name << 40 | duration`` in place of each ``(name * n_phases + phase) << 40 | ...``."""
    for lo in range(0, len(keys), tables.CHUNK):
        part = keys[lo : lo + tables.CHUNK]
        name = (part >> DURATION_BITS) // n_phases
        part &= DURATION_MASK
        part |= name << DURATION_BITS


def _duration_stats(keys: np.ndarray, n_phases: int, by_phase: bool) -> pd.DataFrame:
    """count, sum, mean, median, min, max and std per group of the sorted ``keys``."""
    first = _runs(keys)  # keys are sorted: each group is one run
    groups = keys[first] >> DURATION_BITS
    count = np.diff(np.append(first, len(keys)))
    low = keys[first] & DURATION_MASK
    high = keys[first + count - 1] & DURATION_MASK
    median = (
        (keys[first + (count - 1) // 2] & DURATION_MASK)
        + (keys[first + count // 2] & DURATION_MASK)
    ) / 2
    total, squares = _sums(keys, first, count)
    mean = total / count
    std = np.where(count > 1, np.sqrt(np.maximum(squares, 0) / np.maximum(count - 1, 1)), 0.0)
    return pd.DataFrame(
        {
            "name": groups // n_phases if by_phase else groups,
            "phase": groups % n_phases if by_phase else -1,
            "instances": count.astype(np.int64),
            "total_ms": total / NS_PER_MS,
            "avg_us": mean / NS_PER_US,
            "med_us": median / NS_PER_US,
            "min_us": low / NS_PER_US,
            "max_us": high / NS_PER_US,
            "std_us": std / NS_PER_US,
            "high": high,
        }
    )


def _runs(keys: np.ndarray) -> np.ndarray:
    """Index of the first key of each group (a run of equal ``key >> DURATION_BITS``)."""

    def starts(lo: int, hi: int) -> np.ndarray:  # no full-length temporaries
        group = keys[lo : hi + 1] >> DURATION_BITS
        return np.flatnonzero(group[1:] != group[:-1]) + lo + 1

    first = np.zeros(min(len(keys), 1), dtype=np.int64)
    return np.concatenate([first, *map_chunks(starts, max(len(keys) - 1, 0), tables.CHUNK)])


def _sums(keys: np.ndarray, first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group: the sum of durations and the sum of squared deviations from the mean.

    Groups are runs of the sorted keys, so each chunk's part of a run is one segment of
    ``np.add.reduceat`` (summed in key order, as a bincount over the run would); the
    chunks' sums are added in chunk order, so threads change no bit of them."""
    groups = len(first)
    total = np.zeros(groups)
    shift = (keys[first] & DURATION_MASK).astype(np.float64) if groups else np.zeros(0)
    shifted, shifted_sq = np.zeros(groups), np.zeros(groups)

    def chunk(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # The chunk's segments: from its start, then from each run that starts inside it.
        inside = first[(first > lo) & (first < hi)] - lo
        segment = np.concatenate([[0], inside])
        group = np.arange(len(segment)) + (np.searchsorted(first, lo, side="right") - 1)
        duration = (keys[lo:hi] & DURATION_MASK).astype(np.float64)
        part_total = np.add.reduceat(duration, segment)
        deviation = duration - np.repeat(shift[group], np.diff(np.append(segment, hi - lo)))
        part_shifted = np.add.reduceat(deviation, segment)
        deviation *= deviation
        return group, part_total, part_shifted, np.add.reduceat(deviation, segment)

    for group, part_total, part_shifted, part_sq in map_chunks(chunk, len(keys), tables.CHUNK):
        total[group] += part_total
        shifted[group] += part_shifted
        shifted_sq[group] += part_sq
    # sum((d - mean)^2) = sum((d - s)^2) - (sum(d - s))^2 / n, with s a member: stable.
    return total, shifted_sq - shifted * shifted / np.maximum(count, 1)


def _longest(
    cols: ActivityColumns, phase: np.ndarray, stats: pd.DataFrame, n_phases: int
) -> np.ndarray:
    """Index of each (name, phase) group's first activity (in trace order) with its longest
    duration (``stats["high"]``)."""
    groups = stats["name"].to_numpy(np.int64) * n_phases + stats["phase"].to_numpy(np.int64)
    size = len(cols.names) * n_phases
    longest_of = np.full(size, -1, dtype=np.int64)  # by group code: few, so a dense table
    longest_of[groups] = stats["high"].to_numpy(np.int64)

    def chunk(lo: int, hi: int) -> np.ndarray:  # per group: its first hit in the chunk
        p = phase[lo:hi]
        rows = np.flatnonzero(p >= 0)
        group = _group_of(cols.arrays["name"][lo:hi][rows], p[rows], n_phases)
        duration = cols.arrays["duration"][lo:hi][rows].clip(min=0)
        hit = duration == longest_of[group]
        first_hit = np.full(size, len(cols), dtype=np.int64)
        np.minimum.at(first_hit, group[hit], lo + rows[hit])  # ties: the first in trace order
        return first_hit

    first_hit = np.full(size, len(cols), dtype=np.int64)
    for found in map_chunks(chunk, len(cols), tables.CHUNK):
        np.minimum(first_hit, found, out=first_hit)
    return np.where(first_hit < len(cols), first_hit, -1)[groups]


def _longest_overall(per_phase: pd.DataFrame, overall: pd.DataFrame) -> np.ndarray:
    """Each name's first activity with its longest duration: among its phases reaching
    that duration, the earliest of their first such activities."""
    high_of = pd.Series(overall["high"].to_numpy(), index=overall["name"].to_numpy())
    reaching = per_phase[per_phase["high"].to_numpy() == high_of[per_phase["name"]].to_numpy()]
    earliest = reaching.groupby("name")["longest"].min()
    return earliest[overall["name"]].to_numpy(np.int64)
