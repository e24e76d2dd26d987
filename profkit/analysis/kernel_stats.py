"""Per-kernel duration statistics of attributed columns, from sorted int64 keys.

:func:`kernel_stats` gives, per (rank, name, phase) and per (rank, name), and for several
ranks per (name, phase) and per name across them, what the kernel tables show (count,
total, mean, median, minimum, maximum, standard deviation, the shape of the longest
instance) without a group-by over millions of rows: one int64 array of ``group << 40 |
duration`` per batch of names, sorted, read by binary searches and ``reduceat`` over its
runs. A group code is ``(name * ranks + rank) * phases + phase``, counted from the batch's
first name, so dropping the phase (``// phases``) keeps the order of the groups and a
stable sort, which merges the sorted runs, orders the keys by (name, rank). Across ranks
the keys are counted first, one per distinct (group, duration) (:mod:`.duration_counts`),
and the counts regrouped without the rank, then without the phase: no copy of every key.
With ``with_counts`` the whole trace's counts per (name, phase) come back too, for a job
whose files' counts add up to its own (:mod:`.job_stats`). One process is a world of one
rank: its (rank, name) groups are its names.

Names are taken in batches of at most :data:`BATCH` selected activities, so the keys
stay bounded whatever the trace's size; nothing per activity is kept between passes
(each pass recomputes a chunk's groups from the columns, the attribution and the
selection). Chunks run on a few threads (:mod:`.chunked`), results in chunk order: the
statistics are one thread's, to the bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis import chunked
from profkit.analysis.chunked import map_chunks
from profkit.analysis.duration_counts import (
    DURATION_BITS,
    DURATION_MASK,
    DurationCounts,
    added,
    counted,
)
from profkit.analysis.selection import Selection
from profkit.analysis.tables import NS_PER_MS, NS_PER_US
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns

MAX_GROUPS = 1 << (63 - DURATION_BITS)  # group codes of one batch that fit beside it
BATCH = 1 << 23  # activities whose statistics are sorted at once: 64 MB of keys

STAT_COLUMNS = ["name", "phase", "instances", "total_ms", "avg_us", "med_us", "min_us",
                "max_us", "std_us", "grid", "block"]  # fmt: skip
"""The columns of a scope's two tables (name and phase are codes; phase -1: all)."""
TABLES = ("per_phase", "overall", "whole_per_phase", "whole_overall")
FIGURES = ("instances", "total_ms", "avg_us", "med_us", "min_us", "max_us", "std_us")


@dataclass
class KernelStats:
    """The statistics tables: ``per_phase`` per (rank, name, phase), ``overall`` per
    (rank, name) (both with a ``rank`` column); for several ranks, ``whole_per_phase``
    per (name, phase) and ``whole_overall`` per name across them (None for one rank,
    whose tables are the whole trace's). Rows are in code order, phases the whole
    trace's codes."""

    per_phase: pd.DataFrame
    overall: pd.DataFrame
    whole_per_phase: pd.DataFrame | None = None
    whole_overall: pd.DataFrame | None = None
    counts: DurationCounts | None = None
    """Where asked for: the whole trace's duration counts per (name, phase) (group code
    ``name * phases + phase``), which add up across the files of a job."""

    def of_rank(self, r: int, to_local: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Rank ``r``'s per (name, phase) and per name tables, in its own phase codes."""
        per_phase = self.per_phase[self.per_phase["rank"] == r].reset_index(drop=True)
        per_phase["phase"] = to_local[per_phase["phase"].to_numpy()]
        overall = self.overall[self.overall["rank"] == r].reset_index(drop=True)
        return per_phase[STAT_COLUMNS], overall[STAT_COLUMNS]

    def whole(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The whole trace's two tables (one rank's are its)."""
        if self.whole_per_phase is None or self.whole_overall is None:
            return self.per_phase[STAT_COLUMNS], self.overall[STAT_COLUMNS]
        return self.whole_per_phase[STAT_COLUMNS], self.whole_overall[STAT_COLUMNS]

    def restricted(self, phase: int) -> KernelStats:
        """One rank's statistics of one phase's activities alone: its rows of
        ``per_phase``, which are then its per-name rows too."""
        assert self.whole_per_phase is None, "the whole trace's tables need every rank"
        stats = self.per_phase[self.per_phase["phase"] == phase].reset_index(drop=True)
        return KernelStats(stats, stats.assign(phase=-1))

    def tables(self) -> dict[str, pd.DataFrame]:
        """The tables present, by name (:data:`TABLES`)."""
        return {t: getattr(self, t) for t in TABLES if getattr(self, t) is not None}


@dataclass
class Groups:
    """What a pass needs to tell each activity's group: the columns, the attribution, the
    rank of each activity (None: one rank), the counts of ranks and phases, and which
    activities are counted."""

    cols: ActivityColumns
    att: Mapping[str, np.ndarray]
    rank: np.ndarray | None
    n_ranks: int
    n_phases: int
    selection: Selection

    def chunk(
        self, lo: int, hi: int, names: range | None = None
    ) -> tuple[np.ndarray | slice, np.ndarray]:
        """The chunk's selected rows (whose name code is in ``names``, where given; a slice
        where every row is: no index array to gather with) and their group codes, from
        ``names.start`` on."""
        r = 0 if self.rank is None else self.rank[lo:hi].astype(np.int64)
        keep = self.selection.of(r, self.att, lo, hi)
        name = self.cols.arrays["name"][lo:hi]
        if names is not None:
            inside = (name >= names.start) & (name < names.stop)
            keep = inside if keep is None else keep & inside
        group = (name.astype(np.int64) - (names.start if names else 0)) * self.n_ranks + r
        group *= self.n_phases
        group += self.att["phase"][lo:hi]
        if keep is None:
            return slice(None), group
        rows = np.flatnonzero(keep)
        return rows, group[rows]


def kernel_stats(groups: Groups, with_counts: bool = False) -> KernelStats:
    """Duration statistics of the selected activities per group (see the module doc),
    each row with the launch shape of its group's first longest activity;
    ``with_counts``: with the whole trace's duration counts per (name, phase)."""
    n_ranks, n_phases = groups.n_ranks, groups.n_phases
    if n_ranks * n_phases >= MAX_GROUPS:
        raise BadInput("too many (rank, kernel name, phase) groups for one report")
    parts: dict[str, list[pd.DataFrame]] = {t: [] for t in TABLES}
    every: list[DurationCounts] = []
    per_name = n_ranks * n_phases
    for names in _name_batches(groups):
        keys = _group_keys(groups, names)
        parts["per_phase"].append(_frame(_stats(keys), names.start, n_ranks, n_phases))
        across = None
        if n_ranks > 1:  # across ranks: the rank dropped, then the phase
            across = counted(keys).regrouped(lambda g: g // per_name * n_phases + g % n_phases)
            parts["whole_per_phase"].append(_frame(across.stats(), names.start, 1, n_phases))
        if with_counts:  # group codes from name 0 on, not from the batch's first
            found = across if across is not None else counted(keys)
            first = (names.start * n_phases) << DURATION_BITS  # order kept
            every.append(DurationCounts(found.keys + first, found.counts))
        if across is not None:
            across = across.regrouped(lambda g: g // n_phases)
            parts["whole_overall"].append(_frame(across.stats(), names.start, 1, 1))
            del across
        _regroup(keys, lambda g: g // n_phases)
        parts["overall"].append(_frame(_stats(keys), names.start, n_ranks, 1))
        del keys
    tables = {t: pd.concat(p, ignore_index=True) for t, p in parts.items() if p}
    for table in ("overall", "whole_overall"):
        if table in tables:
            tables[table]["phase"] = -1
    for table in ("whole_per_phase", "whole_overall"):
        if table in tables:
            del tables[table]["rank"]
    _add_shapes(groups, tables)
    return KernelStats(**tables, counts=added(every) if with_counts else None)


def _frame(stats: pd.DataFrame, first_name: int, n_ranks: int, n_phases: int) -> pd.DataFrame:
    """The statistics of a batch's groups with their name, rank and phase codes."""
    group = stats.pop("group").to_numpy()
    codes = pd.DataFrame(
        {
            "rank": (group // n_phases) % n_ranks,
            "name": group // (n_ranks * n_phases) + first_name,
            "phase": group % n_phases,
        }
    )
    return pd.concat([codes, stats], axis=1)


def _name_batches(groups: Groups) -> list[range]:
    """Consecutive name codes in batches of at most ``BATCH`` selected activities (a name
    with more is a batch of its own) and fewer than ``MAX_GROUPS`` groups; one batch
    holding every name when all fit."""
    cols = groups.cols
    n_names, per_name = len(cols.names), groups.n_ranks * groups.n_phases
    most = max(MAX_GROUPS // per_name - 1, 1)  # names whose groups fit one batch's codes
    if len(cols) <= BATCH and n_names <= most:  # every activity fits one batch
        return [range(0, n_names)]

    def count(lo: int, hi: int) -> np.ndarray:
        rows, _ = groups.chunk(lo, hi)
        return np.bincount(cols.arrays["name"][lo:hi][rows], minlength=n_names)

    selected = np.zeros(n_names, dtype=np.int64)
    for part in map_chunks(count, len(cols), chunked.CHUNK):
        selected += part
    batches, start, held = [], 0, 0
    for name, size in enumerate(selected.tolist()):
        if held and (held + size > BATCH or name - start >= most):
            batches.append(range(start, name))
            start, held = name, 0
        held += size
    return [*batches, range(start, n_names)]


def _group_keys(groups: Groups, names: range) -> np.ndarray:
    """Sorted ``group << 40 | duration`` of the selected activities whose name code is in
    ``names``.

    Chunks fill their slices of the keys on several threads; the keys are then sorted in
    a few parts at once, and the parts merged by a stable sort (numpy's timsort merges
    sorted runs in one pass)."""
    cols, size = groups.cols, chunked.CHUNK
    every = names.start == 0 and names.stop >= len(cols.names)
    batch = None if every else names
    if every and groups.selection.everything:
        counts = [min(size, len(cols) - lo) for lo in range(0, len(cols), size)]
    else:
        counts = list(
            map_chunks(lambda lo, hi: len(groups.chunk(lo, hi, batch)[1]), len(cols), size)
        )
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    keys = np.empty(int(offsets[-1]), dtype=np.int64)

    def fill(lo: int, hi: int) -> bool:  # writes its own slice of ``keys``; True: too long
        rows, group = groups.chunk(lo, hi, batch)
        duration = cols.arrays["duration"][lo:hi][rows].clip(min=0)
        at = int(offsets[lo // size])
        group <<= DURATION_BITS
        group |= duration & DURATION_MASK
        keys[at : at + len(group)] = group
        return bool(len(duration) and duration.max() > DURATION_MASK)

    if any(list(map_chunks(fill, len(cols), size))):
        raise BadInput("an activity lasts over 18 minutes: not a trace profkit can read")
    part = -(-len(keys) // chunked.threads())
    for _ in map_chunks(lambda lo, hi: keys[lo:hi].sort(), len(keys), max(part, 1)):
        pass
    if part < len(keys):
        keys.sort(kind="stable")  # merges the sorted parts
    return keys


def _regroup(keys: np.ndarray, to: Callable[[np.ndarray], np.ndarray]) -> None:
    """Map each key's group code by ``to`` in place, then sort (a stable sort: where ``to``
    keeps the groups' order it merges the runs of each new group)."""

    def chunk(lo: int, hi: int) -> None:  # writes keys[lo:hi] only
        part = keys[lo:hi]
        group = to(part >> DURATION_BITS)
        part &= DURATION_MASK
        part |= group << DURATION_BITS

    for _ in map_chunks(chunk, len(keys), chunked.CHUNK):
        pass
    keys.sort(kind="stable")


def _stats(keys: np.ndarray) -> pd.DataFrame:
    """count, sum, mean, median, min, max and std per group of the sorted ``keys``, with
    each group's code and longest duration (``high``)."""
    first = _runs(keys)  # keys are sorted: each group is one run
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
            "group": keys[first] >> DURATION_BITS,
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
    return np.concatenate([first, *map_chunks(starts, max(len(keys) - 1, 0), chunked.CHUNK)])


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

    for group, part_total, part_shifted, part_sq in map_chunks(chunk, len(keys), chunked.CHUNK):
        total[group] += part_total
        shifted[group] += part_shifted
        shifted_sq[group] += part_sq
    # sum((d - mean)^2) = sum((d - s)^2) - (sum(d - s))^2 / n, with s a member: stable.
    return total, shifted_sq - shifted * shifted / np.maximum(count, 1)


def _add_shapes(groups: Groups, tables: dict[str, pd.DataFrame]) -> None:
    """Each row's ``grid`` and ``block``: those of its group's first activity (in trace
    order) with the group's longest duration; ``high`` dropped."""
    n_ranks, n_phases = groups.n_ranks, groups.n_phases
    fine = tables["per_phase"]
    code = _codes(fine, n_ranks, n_phases)
    first = _first_longest(groups, code, fine["high"].to_numpy(np.int64))
    coarse: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "overall": lambda g: g // n_phases,
        "whole_per_phase": lambda g: g // (n_ranks * n_phases) * n_phases + g % n_phases,
        "whole_overall": lambda g: g // (n_ranks * n_phases),
    }
    longest = {"per_phase": first}
    for table, to in coarse.items():
        if table in tables:
            codes = _codes(tables[table], n_ranks, n_phases, table)
            longest[table] = _coarse_longest(code, fine["high"], first, codes, tables[table], to)
    rows = np.unique(np.concatenate(list(longest.values())))
    shape_of = dict(zip(rows.tolist(), groups.cols.shapes_at(rows), strict=True))
    for table, frame in tables.items():
        shapes = [shape_of[i] for i in longest[table].tolist()]
        frame["grid"] = [g for g, _ in shapes]
        frame["block"] = [b for _, b in shapes]
        frame.pop("high")


def _codes(frame: pd.DataFrame, n_ranks: int, n_phases: int, table: str = "per_phase") -> Any:
    """The group codes of a table's rows, as its mapping from (rank, name, phase) gives."""
    name = frame["name"].to_numpy(np.int64)
    rank = frame["rank"].to_numpy(np.int64) if "rank" in frame else 0
    phase = frame["phase"].to_numpy(np.int64)
    if table == "per_phase":
        return (name * n_ranks + rank) * n_phases + phase
    if table == "overall":
        return name * n_ranks + rank
    if table == "whole_per_phase":
        return name * n_phases + phase
    return name


def _first_longest(groups: Groups, code: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Per (rank, name, phase) group (``code``, ascending): the index of its first
    activity in trace order with its longest duration ``high``; one pass over the chunks."""
    cols = groups.cols
    size = len(cols.names) * groups.n_ranks * groups.n_phases
    longest_of = np.full(size, -1, dtype=np.int64)  # by group code: few, so a dense table
    longest_of[code] = high
    first_hit = np.full(size, len(cols), dtype=np.int64)

    def chunk(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The groups with a longest activity in the chunk, and the first such row."""
        rows, group = groups.chunk(lo, hi)
        duration = cols.arrays["duration"][lo:hi][rows].clip(min=0)
        hit = duration == longest_of[group]
        found, first = np.unique(group[hit], return_index=True)
        hit_rows = np.flatnonzero(hit) if isinstance(rows, slice) else rows[hit]
        return found, lo + hit_rows[first]

    for found, rows in map_chunks(chunk, len(cols), chunked.CHUNK):
        first_hit[found] = np.minimum(first_hit[found], rows)  # ``found`` are distinct
    return first_hit[code]


def _coarse_longest(
    fine: np.ndarray,
    fine_high: pd.Series,
    first: np.ndarray,
    coarse: np.ndarray,
    table: pd.DataFrame,
    to: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """Per coarse group (``coarse``, ascending): the first of its fine groups' longest
    activities that are as long as the coarse group's longest (its first longest activity
    in trace order)."""
    index = np.searchsorted(coarse, to(fine))
    candidate = fine_high.to_numpy(np.int64) == table["high"].to_numpy(np.int64)[index]
    best = np.full(len(coarse), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(best, index[candidate], first[candidate])
    return best
