"""What the kernel report's tables are made of, added up per (rank, phase) from attributed
columns in one pass.

:func:`add_up` walks the activities chunk by chunk (their attribution from
:mod:`.attribution`) and keeps, per rank and phase, everything the tables need:
counts and ns per (rank, phase, category) and per slot between range bounds (a slot lies on
one thread, so on one rank), the notes' counts, how many activities each (rank, phase)
holds, selected or not, and for several ranks their NCCL kernels (few), which the second
pass needs (:mod:`.rank_comm`). One process is a world of one rank: it has no per-activity
rank array. The per-kernel statistics come from :mod:`.kernel_stats`. Phases keep the
whole trace's codes; a rank's report renumbers them (:mod:`.report_tables`).

The sums of every activity (:func:`whole_trace_sums`, statistics included) are kept with
the columns (and so in the cache): a later query without ``--range`` reads them instead of
walking the activities. For one process they answer ``--phase`` too: :meth:`Sums.restricted`
keeps one phase's share, which is what a pass over that phase's activities alone would add
up (slot sums need each slot to hold one phase's points, which the plan arranges and the
pass checks).

Chunks run on up to four threads (:func:`.chunked.map_chunks`): each returns its share
(integer counts, slot windows, NCCL rows), which the main thread adds up in chunk order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis import chunked
from profkit.analysis.attribution import Plan, attributed, attribution_identity
from profkit.analysis.categories import CATEGORIES, category_of
from profkit.analysis.chunked import map_chunks
from profkit.analysis.comm import is_nccl
from profkit.analysis.kernel_stats import FIGURES, TABLES, Groups, KernelStats, kernel_stats
from profkit.analysis.selection import Selection
from profkit.traces.columns import ActivityColumns, Derived
from profkit.traces.schema import KINDS

KEPT_AS = "sums"
VERSION = 3  # bumped whenever what the sums mean changes (2: inferred phases; 3: ranks)
QUANTITIES = (*KINDS, "kernel_ns", "gpu_ns")
"""What every sum carries: a count per activity kind, then kernel and all-activity ns."""
KERNEL_NS, GPU_NS = len(KINDS), len(KINDS) + 1
KERNEL = KINDS.index("kernel")
STAT_TEXT = ("grid", "block")  # the statistics' text columns (kept as JSON, not arrays)
NCCL = ("row", "rank", "start", "duration", "device", "launch", "name", "selected")


@dataclass
class Sums:
    """Per rank, in the whole trace's phase codes, what the selected activities add up to
    (the tables need nothing else)."""

    by_phase_category: np.ndarray
    """(ranks, phases × categories, QUANTITIES)."""
    by_slot: np.ndarray
    """(slots, QUANTITIES): the points of the selected activities in each slot between
    consecutive bounds; :meth:`by_range` adds them up per range."""
    slot_phase: np.ndarray | None
    """The phase of every point of each slot (:attr:`.Plan.slot_phase`); None where a
    slot holds several phases' points (then no :meth:`restricted`)."""
    moved: np.ndarray  # (ranks, phases): activities attributed through the owner thread
    inferred: np.ndarray  # (ranks, phases): activities whose phase was inferred
    same: np.ndarray  # (ranks, phase, the launching thread's own phase): activities
    unlaunched: np.ndarray  # (ranks, phases): activities without a launch call
    workers: np.ndarray  # (phases, thread codes): threads that launched moved activities
    seen: np.ndarray  # (ranks, phases): every activity, selected or not
    stats: KernelStats | None = None  # the selected activities' (:mod:`.kernel_stats`)
    nccl: dict[str, np.ndarray] = field(default_factory=dict)
    """Several ranks: every NCCL kernel (:data:`NCCL`), ``selected`` or not."""

    @property
    def n_ranks(self) -> int:
        return len(self.seen)

    def by_range(self, plan: Plan) -> np.ndarray:
        """(ranges, QUANTITIES): the slots from each range's start to its end, summed.

        A point p lies in [start, end) exactly when its slot (bounds <= p, counted) is in
        [bounds <= start, bounds <= end), so a range's sum is a difference of prefix sums.
        """
        prefix = np.zeros((len(self.by_slot) + 1, len(QUANTITIES)), dtype=np.int64)
        np.cumsum(self.by_slot, axis=0, out=prefix[1:])
        return prefix[plan.slot(plan.range_end)] - prefix[plan.slot(plan.range_start)]

    def restricted(self, phase: int) -> Sums:
        """One rank's sums of this phase's activities alone (needs ``slot_phase``)."""
        if self.slot_phase is None or self.n_ranks != 1:
            raise ValueError("slots hold several phases: add up the phase's activities")
        n_phases = self.seen.shape[1]
        rows = np.arange(n_phases) == phase
        by_phase = self.by_phase_category.reshape(n_phases, len(CATEGORIES), -1)
        return replace(
            self,
            by_phase_category=(by_phase * rows[:, None, None]).reshape(1, -1, len(QUANTITIES)),
            by_slot=self.by_slot * (self.slot_phase[:-1] == phase)[:, None],
            moved=self.moved * rows,
            inferred=self.inferred * rows,
            same=self.same * rows[:, None],
            unlaunched=self.unlaunched * rows,
            workers=self.workers & rows[:, None],
            stats=None if self.stats is None else self.stats.restricted(phase),
        )

    def kept(self, identity: dict[str, Any]) -> Derived:
        """These sums as arrays and JSON, to keep with the columns."""
        arrays = {name: getattr(self, name) for name in ARRAYS}
        if self.slot_phase is not None:
            arrays["slot_phase"] = self.slot_phase
        arrays.update({f"nccl.{k}": v for k, v in self.nccl.items()})
        text = {}
        assert self.stats is not None
        for name, frame in self.stats.tables().items():
            for column in frame.columns:
                if column in STAT_TEXT:
                    text[f"{name}.{column}"] = frame[column].tolist()
                else:
                    arrays[f"{name}.{column}"] = frame[column].to_numpy()
        return Derived(arrays=arrays, meta={"identity": identity, "text": text})

    @classmethod
    def from_kept(cls, kept: Derived, identity: dict[str, Any]) -> Sums | None:
        """The sums kept by :meth:`kept`, or None if they were computed from other inputs."""
        if kept.meta.get("identity") != identity:
            return None
        a, text = kept.arrays, kept.meta["text"]
        tables = {}
        for name in TABLES:
            columns = {k.split(".", 1)[1]: v for k, v in a.items() if k.startswith(f"{name}.")}
            columns.update(
                {k.split(".", 1)[1]: v for k, v in text.items() if k.startswith(f"{name}.")}
            )
            if columns:
                order = ["rank", "name", "phase", *FIGURES, *STAT_TEXT]
                tables[name] = pd.DataFrame({c: columns[c] for c in order if c in columns})
        return cls(
            **{name: a[name] for name in ARRAYS},
            slot_phase=a.get("slot_phase"),
            stats=KernelStats(**tables),
            nccl={k: a[f"nccl.{k}"] for k in NCCL if f"nccl.{k}" in a},
        )


ARRAYS = ("by_phase_category", "by_slot", "moved", "inferred", "same", "unlaunched", "workers",
          "seen")  # fmt: skip


def kept_sums(
    cols: ActivityColumns, plan: Plan, ranks: list[dict[str, Any]] | None = None
) -> Sums | None:
    """The sums and statistics of every activity kept with the columns, if computed from
    these inputs (``ranks``: the infos of several)."""
    kept = cols.derived.get(KEPT_AS)
    return Sums.from_kept(kept, _identity(cols, plan, ranks)) if kept is not None else None


def whole_trace_sums(
    cols: ActivityColumns,
    plan: Plan,
    rank: np.ndarray | None = None,
    ranks: list[dict[str, Any]] | None = None,
) -> Sums:
    """The sums and statistics of every activity: kept with the columns, or added up and
    kept. ``rank``: each activity's, for the ``ranks`` (their infos) of several."""
    found = kept_sums(cols, plan, ranks)
    if found is None:
        n_ranks = len(ranks) if ranks else 1
        found = with_stats(cols, plan, attributed(cols, plan), Selection(), rank, n_ranks)
        cols.remember(KEPT_AS, found.kept(_identity(cols, plan, ranks)))
    return found


def _identity(
    cols: ActivityColumns, plan: Plan, ranks: list[dict[str, Any]] | None
) -> dict[str, Any]:
    return {"version": VERSION, "attribution": attribution_identity(cols, plan), "ranks": ranks}


def with_stats(
    cols: ActivityColumns,
    plan: Plan,
    att: Mapping[str, np.ndarray],
    selection: Selection,
    rank: np.ndarray | None = None,
    n_ranks: int = 1,
    with_counts: bool = False,
) -> Sums:
    """:func:`add_up`, then the kernel statistics of the same activities (``with_counts``:
    their duration counts too, :attr:`.kernel_stats.KernelStats.counts`)."""
    sums = add_up(cols, plan, att, selection, rank, n_ranks)
    groups = Groups(cols, att, rank, n_ranks, len(plan.phase_names), selection)
    sums.stats = kernel_stats(groups, with_counts)
    return sums


def add_up(
    cols: ActivityColumns,
    plan: Plan,
    att: Mapping[str, np.ndarray],
    selection: Selection,
    rank: np.ndarray | None = None,
    n_ranks: int = 1,
) -> Sums:
    """One pass over the chunks: the sums of the selected activities (see the module doc);
    ``rank`` per activity where there are several ranks."""
    n_phases = len(plan.phase_names)
    cells = n_ranks * n_phases
    sums = Sums(
        by_phase_category=np.zeros((cells * len(CATEGORIES), len(QUANTITIES)), np.int64),
        by_slot=np.zeros((len(plan.bounds) + 1, len(QUANTITIES)), np.int64),
        slot_phase=plan.slot_phase,
        moved=np.zeros(cells, np.int64),
        inferred=np.zeros(cells, np.int64),
        same=np.zeros(cells * n_phases, np.int64),
        unlaunched=np.zeros(cells, np.int64),
        workers=np.zeros((n_phases, len(cols.threads)), dtype=bool),
        seen=np.zeros(cells, np.int64),
    )
    name_kind, name_category = name_codes(cols)
    nccl_name = None
    if rank is not None:
        nccl_name = (name_kind == KERNEL) & is_nccl(np.array(cols.names, dtype=object))
        cols.load(["name", "duration", "launch_thread", "start", "device", "launch_start"])
    else:
        cols.load(["name", "duration", "launch_thread"])

    def chunk(lo: int, hi: int) -> _Part:
        r = 0 if rank is None else rank[lo:hi].astype(np.int64)
        phase = att["phase"][lo:hi]
        keep = selection.of(r, att, lo, hi)
        c = {"rank_phase": r * n_phases + phase.astype(np.int64), "same": att["same"][lo:hi],
             "self_slot": att["self_slot"][lo:hi], "owner_slot": att["owner_slot"][lo:hi],
             "inferred": att["inferred"][lo:hi], "name": cols.arrays["name"][lo:hi],
             "code": cols.arrays["launch_thread"][lo:hi],
             "duration": cols.arrays["duration"][lo:hi]}  # fmt: skip
        seen = None  # without a selection, the sums count every activity
        if keep is not None:
            seen = np.bincount(c["rank_phase"], minlength=cells)
            c = {name: values[keep] for name, values in c.items()}
        part = _part(c, name_kind[c["name"]], name_category[c["name"]], plan, sums)
        part.seen = seen
        if nccl_name is not None:
            part.nccl = _nccl_rows(cols, lo, hi, r, keep, nccl_name[cols.arrays["name"][lo:hi]])
        return part

    nccl_parts = []
    for part in map_chunks(chunk, len(cols), chunked.CHUNK):
        part.add_to(sums)
        nccl_parts.append(part.nccl)
    by_cell = sums.by_phase_category.reshape(cells, len(CATEGORIES), len(QUANTITIES))
    if selection.everything:
        sums.seen = by_cell[:, :, : len(KINDS)].sum(axis=(1, 2))
    if rank is not None:
        if not nccl_parts:  # no activity at all (a CPU run's ranks): no NCCL kernel either
            nccl_parts.append(_nccl_rows(cols, 0, 0, rank[:0], None, np.zeros(0, dtype=bool)))
        sums.nccl = {k: np.concatenate([p[k] for p in nccl_parts]) for k in NCCL}
    sums.by_phase_category = sums.by_phase_category.reshape(n_ranks, -1, len(QUANTITIES))
    for name in ("moved", "inferred", "unlaunched", "seen"):
        setattr(sums, name, getattr(sums, name).reshape(n_ranks, n_phases))
    sums.same = sums.same.reshape(n_ranks, n_phases, n_phases)
    return sums


@dataclass
class _Part:
    """One chunk's share of :class:`Sums` (its slot sums as windows of slots)."""

    by_phase_category: np.ndarray
    windows: list[Window]
    one_phase_per_slot: bool  # whether its points agree with ``Plan.slot_phase``
    moved: np.ndarray
    inferred: np.ndarray
    same: np.ndarray
    unlaunched: np.ndarray
    workers: np.ndarray  # (phase, thread code) pairs, as phase * threads + code
    seen: np.ndarray | None = None
    nccl: dict[str, np.ndarray] = field(default_factory=dict)

    def add_to(self, sums: Sums) -> None:
        """Add the counts up (integers: in any order, the same sums)."""
        sums.by_phase_category += self.by_phase_category
        for where, window in self.windows:
            add_window(sums.by_slot, where, window)
        if not self.one_phase_per_slot:
            sums.slot_phase = None  # another process's points: no per-phase slot sums
        sums.moved += self.moved
        sums.inferred += self.inferred
        sums.same += self.same
        sums.unlaunched += self.unlaunched
        sums.workers.reshape(-1)[self.workers] = True
        if self.seen is not None:
            sums.seen += self.seen


def _part(
    c: dict[str, np.ndarray], kind: np.ndarray, category: np.ndarray, plan: Plan, sums: Sums
) -> _Part:
    """A chunk's sums (``sums``: only the shapes are read)."""
    n = len(plan.phase_names)
    rank_phase = c["rank_phase"]
    phase = rank_phase % n if len(sums.moved) > n else rank_phase  # one rank: its phase
    duration = c["duration"].clip(min=0).astype(np.float64)
    by_phase_category = np.zeros_like(sums.by_phase_category)
    add_sums(by_phase_category, rank_phase * len(CATEGORIES) + category, kind, duration)
    windows: list[Window] = []
    agrees = True
    for slot in (c["self_slot"], c["owner_slot"]):
        point = slot >= 0
        windows += slot_windows(slot[point], c["code"][point], kind[point], duration[point])
        if plan.slot_phase is not None and (plan.slot_phase[slot[point]] != phase[point]).any():
            agrees = False
    inferred = c["inferred"] > 0
    # Through the owner's ranges: an inferred phase came from no range.
    moved = (c["owner_slot"] >= 0) & (phase != n - 1) & ~inferred
    threads = sums.workers.shape[1]
    return _Part(
        by_phase_category=by_phase_category,
        windows=windows,
        one_phase_per_slot=agrees,
        moved=np.bincount(rank_phase[moved], minlength=len(sums.moved)),
        inferred=np.bincount(rank_phase[inferred], minlength=len(sums.inferred)),
        same=np.bincount(rank_phase * n + c["same"], minlength=len(sums.same)),
        unlaunched=np.bincount(rank_phase[c["code"] < 0], minlength=len(sums.unlaunched)),
        workers=np.unique(phase[moved] * threads + c["code"][moved]),  # moved: launched
    )


def _nccl_rows(
    cols: ActivityColumns,
    lo: int,
    hi: int,
    rank: np.ndarray | int,
    keep: np.ndarray | None,
    nccl: np.ndarray,
) -> dict[str, np.ndarray]:
    """The chunk's NCCL kernels (:data:`NCCL`; ``keep`` None: every activity is selected)."""
    rows = np.flatnonzero(nccl)
    a = cols.arrays
    return {
        "row": rows + lo,
        "rank": np.broadcast_to(rank, (hi - lo,))[rows],
        "start": a["start"][lo:hi][rows],
        "duration": a["duration"][lo:hi][rows],
        "device": a["device"][lo:hi][rows].astype(np.int64),
        "launch": a["launch_start"][lo:hi][rows],
        "name": a["name"][lo:hi][rows],
        "selected": np.ones(len(rows), dtype=bool) if keep is None else keep[rows],
    }


def name_codes(cols: ActivityColumns) -> tuple[np.ndarray, np.ndarray]:
    """Per name: the index of its kind in ``KINDS`` and of its category in ``CATEGORIES``."""
    kind = np.array([KINDS.index(k) for k in cols.kinds], dtype=np.int64)
    index = {c: i for i, c in enumerate(CATEGORIES)}
    category = [index[category_of(n, k)] for n, k in zip(cols.names, cols.kinds, strict=True)]
    return kind, np.array(category, dtype=np.int64)


def add_sums(into: np.ndarray, key: np.ndarray, kind: np.ndarray, duration: np.ndarray) -> None:
    """Add each activity to row ``key`` of ``into``: its kind's count, its ns (float64:
    bincount's weights are float, and converting int64 weights inside it is slow)."""
    size = len(into)
    n_kinds = len(KINDS)  # one bincount for every kind's count
    counts = np.bincount(key * n_kinds + kind, minlength=size * n_kinds).reshape(size, n_kinds)
    into[:, :n_kinds] += counts
    # One weighted bincount for kernels' ns and the others' (row 2 * key + is kernel): the
    # float sums of integer ns are exact below 2^53 ns (104 days) per row, so their sum too.
    kernel = kind == KERNEL
    ns = np.bincount(key * 2 + kernel, weights=duration, minlength=2 * size).reshape(size, 2)
    ns = ns.astype(np.int64)
    into[:, KERNEL_NS] += ns[:, 1]
    into[:, GPU_NS] += ns[:, 0] + ns[:, 1]


Window = tuple[int | np.ndarray, np.ndarray]
"""Sums of slots: from a first slot on (dense), or of the slots listed (sparse)."""


def add_window(by_slot: np.ndarray, where: int | np.ndarray, window: np.ndarray) -> None:
    if isinstance(where, int):
        by_slot[where : where + len(window)] += window
    else:
        by_slot[where] += window  # the slots listed are distinct


def slot_windows(
    slot: np.ndarray, code: np.ndarray, kind: np.ndarray, duration: np.ndarray
) -> list[Window]:
    """The points' sums by slot, one launching thread at a time: a chunk's points of one
    thread lie on one lane, close in time, so in a narrow window of slots (a bincount over
    every slot per chunk would cost chunks × slots). Points spread over many more slots
    than they are (a table of copies read after the kernels spans the whole trace) are
    summed over the slots they hit only. Several threads' points are grouped by one
    stable sort of their 16-bit codes (a radix sort), not compared with each thread."""
    if not len(code):
        return []
    windows: list[Window] = []
    parts: list[slice | np.ndarray] = [slice(None)]
    if code.min() != code.max():
        order = np.argsort(code, kind="stable")
        cut = np.flatnonzero(np.diff(code[order])) + 1
        parts = list(np.split(order, cut))
    for mine in parts:
        s = slot[mine].astype(np.int64)
        low, high = int(s.min()), int(s.max()) + 1
        if high - low <= 2 * len(s) + 4096:
            window = np.zeros((high - low, len(QUANTITIES)), np.int64)
            add_sums(window, s - low, kind[mine], duration[mine])
            windows.append((low, window))
        else:
            hit, index = np.unique(s, return_inverse=True)
            window = np.zeros((len(hit), len(QUANTITIES)), np.int64)
            add_sums(window, index, kind[mine], duration[mine])
            windows.append((hit, window))
    return windows
