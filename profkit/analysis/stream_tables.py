"""The tables of :func:`~profkit.analysis.streaming.analyze_columns`, from sums and sorts.

The same tables, columns and order as :mod:`profkit.analysis.tables` builds from a
per-activity frame (tests compare them), built instead from what the chunked pass added up
(:class:`~profkit.analysis.streaming.Totals`: a row of ``QUANTITIES`` per phase × category
and per range) and, for the per-kernel statistics, from one sorted int64 array of
``group << 40 | duration`` per table: counts, sums, minima, maxima and medians are binary
searches and chunked passes over it, never a group-by over millions of rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.categories import CATEGORIES
from profkit.analysis.chunked import map_chunks, threads
from profkit.analysis.tables import (
    COUNT_COLUMNS,
    NS_PER_MS,
    NS_PER_US,
    _count_columns,
    labelled_kernel_tables,
    phases_from_counts,
    ranges_from_counts,
)
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns
from profkit.traces.schema import KINDS

CHUNK = 1 << 17  # activities per analysis chunk: ~15 MB of temporaries, a few in flight
BATCH = 1 << 23  # activities whose statistics are sorted at once: 64 MB of keys
DURATION_BITS = 40  # durations below 2^40 ns (18 minutes) pack beside a group code
DURATION_MASK = (1 << DURATION_BITS) - 1


def counts(sums: np.ndarray, rows: np.ndarray | slice = slice(None)) -> dict[str, np.ndarray]:
    """``activity_counts``' dict (:mod:`.tables`) from rows of QUANTITIES sums.

    ``graphs`` is there only where some graph was counted, as there.
    """
    picked = sums[rows]
    out: dict[str, np.ndarray] = {}
    for code, kind in enumerate(KINDS):
        if kind != "graph" or sums[:, code].any():
            out[COUNT_COLUMNS[kind]] = picked[:, code].astype(np.int64)
    out["kernel_ns"] = picked[:, len(KINDS)].astype(np.float64)
    out["gpu_ns"] = picked[:, len(KINDS) + 1].astype(np.float64)
    return out


def totals_of(sums: np.ndarray) -> dict[str, Any]:
    """The report's ``totals``: every count, kernel and GPU time (ms)."""
    found = counts(sums.sum(axis=0, keepdims=True))
    totals: dict[str, Any] = {c: int(found[c][0]) for c in COUNT_COLUMNS.values() if c in found}
    totals["kernel_time_ms"] = float(found["kernel_ns"][0]) / NS_PER_MS
    totals["gpu_time_ms"] = float(found["gpu_ns"][0]) / NS_PER_MS
    return totals


def phase_table(
    by_phase: np.ndarray,
    phase_names: list[str],
    phase_ranges: pd.DataFrame,
    sidecar: dict[str, Any],
    filtered: bool,
) -> pd.DataFrame:
    """:func:`.tables.phase_table` from per-phase sums."""
    found = counts(by_phase)
    cpu_ns = (phase_ranges["end"] - phase_ranges["start"]).groupby(phase_ranges["name"]).sum()
    instances = phase_ranges.groupby("name").size()
    active = by_phase[:, : len(KINDS)].sum(axis=1) > 0
    return phases_from_counts(phase_names, found, instances, cpu_ns, active, sidecar, filtered)


def range_table(
    by_range: np.ndarray,
    ranges: pd.DataFrame,
    labels: np.ndarray,
    config: dict[str, Any] | None,
    filtered: str | None,
) -> pd.DataFrame:
    """:func:`.tables.range_table` from per-range sums."""
    found = counts(by_range)
    columns = {c: found[c] for c in found if c not in ("kernel_ns", "gpu_ns")}
    columns["kernel_ns"] = by_range[:, len(KINDS)]
    columns["gpu_ns"] = by_range[:, len(KINDS) + 1]
    return ranges_from_counts(columns, ranges, labels, config, filtered)


def category_table(by_phase_category: np.ndarray, phase_names: list[str]) -> pd.DataFrame:
    """:func:`.tables.category_table` from per (phase, category) sums."""
    n_categories = len(CATEGORIES)
    present = np.flatnonzero(by_phase_category[:, : len(KINDS)].sum(axis=1))
    phase, category = present // n_categories, present % n_categories
    found = counts(by_phase_category)
    gpu_ns = found["gpu_ns"][present]
    phase_total = np.bincount(phase, weights=gpu_ns, minlength=len(phase_names))
    columns = _count_columns(found, present)
    del columns["kernel_time_ms"]
    table = pd.DataFrame(
        {
            "phase": np.array(phase_names, dtype=object)[phase],
            "category": np.array(CATEGORIES, dtype=object)[category],
            **columns,
            "share": gpu_ns / np.where(phase_total[phase] > 0, phase_total[phase], np.nan),
            "order": phase,
        }
    )
    table = table.sort_values(["order", "gpu_time_ms"], ascending=[True, False], kind="stable")
    return table.drop(columns=["order"]).reset_index(drop=True)


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

    def count(lo: int, hi: int) -> np.ndarray:
        return np.bincount(cols.arrays["name"][lo:hi][phase[lo:hi] >= 0], minlength=len(cols.names))

    per_name = np.zeros(len(cols.names), dtype=np.int64)
    for part in map_chunks(count, len(cols), CHUNK):
        per_name += part
    batches, start, held = [], 0, 0
    for name, size in enumerate(per_name.tolist()):
        if held and held + size > BATCH:
            batches.append(range(start, name))
            start, held = name, 0
        held += size
    return [*batches, range(start, len(cols.names))]


def kernel_tables(
    stats: tuple[pd.DataFrame, pd.DataFrame],
    cols: ActivityColumns,
    categories: np.ndarray,
    phase_names: list[str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`.tables.kernel_tables` from :func:`kernel_stats`' tables."""
    names = np.array(cols.names, dtype=object)
    kinds = np.array(cols.kinds, dtype=object)
    per_phase, overall = (table.copy() for table in stats)
    labels = np.array(phase_names, dtype=object)
    category_names = np.array(CATEGORIES, dtype=object)[categories]
    return labelled_kernel_tables(per_phase, overall, names, category_names, kinds, labels)


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
    size = CHUNK
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
    for lo in range(0, len(keys), CHUNK):
        part = keys[lo : lo + CHUNK]
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
    return np.concatenate([first, *map_chunks(starts, max(len(keys) - 1, 0), CHUNK)])


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

    for group, part_total, part_shifted, part_sq in map_chunks(chunk, len(keys), CHUNK):
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
    for found in map_chunks(chunk, len(cols), CHUNK):
        np.minimum(first_hit, found, out=first_hit)
    return np.where(first_hit < len(cols), first_hit, -1)[groups]


def _longest_overall(per_phase: pd.DataFrame, overall: pd.DataFrame) -> np.ndarray:
    """Each name's first activity with its longest duration: among its phases reaching
    that duration, the earliest of their first such activities."""
    high_of = pd.Series(overall["high"].to_numpy(), index=overall["name"].to_numpy())
    reaching = per_phase[per_phase["high"].to_numpy() == high_of[per_phase["name"]].to_numpy()]
    earliest = reaching.groupby("name")["longest"].min()
    return earliest[overall["name"]].to_numpy(np.int64)
