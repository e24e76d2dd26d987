"""What the per-rank reports of a multi-process trace add up to, from compact columns.

:func:`add_up_ranks` is :func:`.stream_sums.add_up` with a rank dimension, in the same one
pass over the chunks: per (rank, phase, category) counts and ns, the notes' counts per
rank, the slot sums (a slot lies on one thread, so on one rank: a rank's range totals are
the whole trace's rows of its ranges), the NCCL kernels (few), and one int64 key per
selected activity, ``(rank, name, phase) << 40 | duration``. Phases keep the whole
trace's codes here; :mod:`.stream_ranks` renumbers them per rank.

:mod:`.stream_rank_stats` turns those keys into the kernel statistics.

Every pass over the chunks runs on up to four threads (:func:`.chunked.map_chunks`): a
chunk returns its share (integer counts, slot windows, first hits) or writes its own rows
of a shared array, and the main thread adds the shares up in chunk order, so the sums,
keys and statistics are those of one thread, to the bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from profkit.analysis import stream_stats as stats_of
from profkit.analysis import stream_tables as tables
from profkit.analysis.categories import CATEGORIES
from profkit.analysis.chunked import map_chunks
from profkit.analysis.stream_attribution import Plan
from profkit.analysis.stream_sums import (
    QUANTITIES,
    Window,
    add_sums,
    add_window,
    name_codes,
    point_windows,
)
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns
from profkit.traces.schema import KINDS

BITS, MASK = stats_of.DURATION_BITS, stats_of.DURATION_MASK
MAX_GROUPS = 1 << (63 - BITS)  # (rank, name, phase) codes that fit beside a duration
KERNEL = KINDS.index("kernel")


@dataclass
class RankSelection:
    """Which activities the tables count: per rank the phase code chosen (``--phase``; -1:
    none of its activities), and per slot whether it lies in a chosen range (``--range``)."""

    phase_of_rank: np.ndarray | None = None
    inside: np.ndarray | None = None

    def of(
        self, rank: np.ndarray, att: Mapping[str, np.ndarray], lo: int, hi: int
    ) -> np.ndarray | None:
        """Mask of the chunk's selected activities (None: all of them)."""
        if self.phase_of_rank is None and self.inside is None:
            return None
        keep = np.ones(hi - lo, dtype=bool)
        if self.phase_of_rank is not None:
            keep &= att["phase"][lo:hi] == self.phase_of_rank[rank]
        if self.inside is not None:
            keep &= self.inside[att["self_slot"][lo:hi]] | self.inside[att["owner_slot"][lo:hi]]
        return keep


@dataclass
class RankSums:
    """Per rank, in the whole trace's phase codes, what the selected activities add up to."""

    by_phase_category: np.ndarray  # (ranks, phases × categories, QUANTITIES)
    by_slot: np.ndarray  # (slots, QUANTITIES), every rank's points
    moved: np.ndarray  # (ranks, phases)
    inferred: np.ndarray  # (ranks, phases): activities whose phase was inferred
    same: np.ndarray  # (ranks, phases, phases)
    unlaunched: np.ndarray  # (ranks, phases)
    workers: np.ndarray  # (phases, thread codes)
    seen: np.ndarray  # (ranks, phases): every activity, selected or not
    group: np.ndarray  # per activity: its (rank, name, phase) code, -1 when not selected
    keys: np.ndarray  # sorted ``group << 40 | duration`` of the selected activities
    nccl: dict[str, np.ndarray]  # every NCCL kernel: row, rank, start, duration, device, ...


def add_up_ranks(
    cols: ActivityColumns,
    plan: Plan,
    att: Mapping[str, np.ndarray],
    rank: np.ndarray,
    n_ranks: int,
    nccl_name: np.ndarray,
    selection: RankSelection,
) -> RankSums:
    """One pass over the chunks (see the module doc); ``rank`` per activity,
    ``nccl_name`` per name code (an NCCL kernel's)."""
    n_phases, n_names, n_cat = len(plan.phase_names), len(cols.names), len(CATEGORIES)
    if n_ranks * n_names * n_phases >= MAX_GROUPS:
        raise BadInput("too many (rank, kernel name, phase) groups for one report")
    sums = RankSums(
        by_phase_category=np.zeros((n_ranks * n_phases * n_cat, len(QUANTITIES)), np.int64),
        by_slot=np.zeros((len(plan.bounds) + 1, len(QUANTITIES)), np.int64),
        moved=np.zeros(n_ranks * n_phases, np.int64),
        inferred=np.zeros(n_ranks * n_phases, np.int64),
        same=np.zeros(n_ranks * n_phases * n_phases, np.int64),
        unlaunched=np.zeros(n_ranks * n_phases, np.int64),
        workers=np.zeros((n_phases, len(cols.threads)), dtype=bool),
        seen=np.zeros(n_ranks * n_phases, np.int64),
        group=np.full(len(cols), -1, dtype=np.int32),
        keys=np.empty(len(cols), dtype=np.int64),
        nccl={},
    )
    name_kind, name_category = name_codes(cols)
    cols.load(["name", "duration", "launch_thread", "start", "device", "launch_start"])

    def chunk(lo: int, hi: int) -> _RankPart:  # writes rows lo..hi of group and keys only
        r = rank[lo:hi].astype(np.int64)
        phase = att["phase"][lo:hi].astype(np.int64)
        keep = selection.of(r, att, lo, hi)
        name = cols.arrays["name"][lo:hi]
        c = {"rank_phase": r * n_phases + phase, "same": att["same"][lo:hi],
             "self_slot": att["self_slot"][lo:hi], "owner_slot": att["owner_slot"][lo:hi],
             "inferred": att["inferred"][lo:hi], "name": name, "code": cols.arrays["launch_thread"][lo:hi],
             "duration": cols.arrays["duration"][lo:hi].clip(min=0)}  # fmt: skip
        seen = np.bincount(c["rank_phase"], minlength=len(sums.seen))
        if keep is not None:  # no selection: every activity, no copies
            c = {key: values[keep] for key, values in c.items()}
        part = _rank_part(sums, c, name_kind[c["name"]], name_category[c["name"]], n_phases)
        part.seen, part.nccl = seen, _nccl_rows(cols, lo, hi, r, keep, nccl_name[name])
        group = (r * n_names + name) * n_phases + phase
        if keep is None:
            sums.group[lo:hi] = group
        else:
            group = group[keep]
            sums.group[lo:hi][keep] = group
        part.lo, part.keys = lo, _add_keys(sums.keys, lo, group, c["duration"]) - lo
        return part

    at, nccl_parts = 0, []
    for part in map_chunks(chunk, len(cols), tables.CHUNK):
        part.add_to(sums)
        if at != part.lo:  # selected keys move down, into chunks already done
            sums.keys[at : at + part.keys] = sums.keys[part.lo : part.lo + part.keys]
        at += part.keys
        nccl_parts.append(part.nccl)
    sums.keys = sums.keys[:at]
    sums.keys.sort()
    if not nccl_parts:  # no activity at all (a CPU run's ranks): no NCCL kernel either
        nccl_parts.append(_nccl_rows(cols, 0, 0, rank[:0], None, np.zeros(0, dtype=bool)))
    sums.nccl = {k: np.concatenate([p[k] for p in nccl_parts]) for k in nccl_parts[0]}
    return sums


def _add_keys(keys: np.ndarray, at: int, group: np.ndarray, duration: np.ndarray) -> int:
    """Write ``group << 40 | duration`` at ``keys[at:]`` (``group`` is overwritten); the
    next free index."""
    if len(duration) and duration.max() > MASK:
        raise BadInput("an activity lasts over 18 minutes: not a trace profkit can read")
    group <<= BITS
    group |= duration
    keys[at : at + len(group)] = group
    return at + len(group)


@dataclass
class _RankPart:
    """One chunk's share of :class:`RankSums` (its slot sums as windows of slots), and
    where its keys lie: ``keys`` of them from index ``lo`` on."""

    by_phase_category: np.ndarray
    windows: list[Window]
    moved: np.ndarray
    inferred: np.ndarray
    same: np.ndarray
    unlaunched: np.ndarray
    workers: np.ndarray  # (phase, thread code) pairs, as phase * threads + code
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    nccl: dict[str, np.ndarray] = field(default_factory=dict)
    lo: int = 0
    keys: int = 0

    def add_to(self, sums: RankSums) -> None:
        """Add the counts up (integers: in any order, the same sums)."""
        sums.by_phase_category += self.by_phase_category
        for where, window in self.windows:
            add_window(sums.by_slot, where, window)
        sums.moved += self.moved
        sums.inferred += self.inferred
        sums.same += self.same
        sums.unlaunched += self.unlaunched
        sums.workers.reshape(-1)[self.workers] = True
        sums.seen += self.seen


def _rank_part(
    sums: RankSums, c: dict[str, np.ndarray], kind: np.ndarray, category: np.ndarray, n: int
) -> _RankPart:
    """A chunk's sums (``sums``: only the shapes are read)."""
    rank_phase, phase = c["rank_phase"], c["rank_phase"] % n
    duration = c["duration"].astype(np.float64)  # clipped at 0 already
    by_phase_category = np.zeros_like(sums.by_phase_category)
    add_sums(by_phase_category, rank_phase * len(CATEGORIES) + category, kind, duration)
    windows: list[Window] = []
    for slot in (c["self_slot"], c["owner_slot"]):
        windows += _slot_windows(slot, c["code"], kind, duration)
    inferred = c["inferred"] > 0
    moved = (c["owner_slot"] >= 0) & (phase != n - 1) & ~inferred  # an inferred phase: no range
    threads = sums.workers.shape[1]
    return _RankPart(
        by_phase_category=by_phase_category,
        windows=windows,
        moved=np.bincount(rank_phase[moved], minlength=len(sums.moved)),
        inferred=np.bincount(rank_phase[inferred], minlength=len(sums.inferred)),
        same=np.bincount(rank_phase * n + c["same"], minlength=len(sums.same)),
        unlaunched=np.bincount(rank_phase[c["code"] < 0], minlength=len(sums.unlaunched)),
        workers=np.unique(phase[moved] * threads + c["code"][moved]),  # moved: launched
    )


def _slot_windows(
    slot: np.ndarray, code: np.ndarray, kind: np.ndarray, duration: np.ndarray
) -> list[Window]:
    """:func:`.stream_sums.point_windows` of the points (slot >= 0), one launching thread
    at a time: grouped by thread with one stable sort of the 16-bit codes (a radix sort),
    where ``point_windows`` would compare every point with each of a chunk's threads
    (several processes launch from several times as many threads as one)."""
    point = np.flatnonzero(slot >= 0)
    order = point[np.argsort(code[point], kind="stable")]
    code_sorted = code[order]
    cut = np.flatnonzero(code_sorted[1:] != code_sorted[:-1]) + 1
    windows: list[Window] = []
    for part in np.split(order, cut) if len(order) else []:
        windows += point_windows(slot[part], code[part], kind[part], duration[part])
    return windows


def _nccl_rows(
    cols: ActivityColumns,
    lo: int,
    hi: int,
    rank: np.ndarray,
    keep: np.ndarray | None,
    nccl: np.ndarray,
) -> dict[str, np.ndarray]:
    """The chunk's NCCL kernels: row, rank, start, duration, device, launch, name, selected
    (``keep`` None: every activity is)."""
    rows = np.flatnonzero(nccl)
    a = cols.arrays
    return {
        "row": rows + lo,
        "rank": rank[rows],
        "start": a["start"][lo:hi][rows],
        "duration": a["duration"][lo:hi][rows],
        "device": a["device"][lo:hi][rows].astype(np.int64),
        "launch": a["launch_start"][lo:hi][rows],
        "name": a["name"][lo:hi][rows],
        "selected": np.ones(len(rows), dtype=bool) if keep is None else keep[rows],
    }
