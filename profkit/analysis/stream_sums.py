"""What the kernel report's tables are made of, added up per phase from attributed columns.

:func:`add_up` walks the activities chunk by chunk (their attribution from
:mod:`.stream_attribution`) and keeps, per phase, everything the tables need: counts and
ns per (phase, category) and per slot between range bounds, the notes' counts, and the
per-kernel statistics (:mod:`.stream_tables`). Kept per phase, the sums of all activities
answer ``--phase`` too: :meth:`Sums.restricted` keeps one phase's share, which is what a
pass over that phase's activities alone would add up (slot sums need each slot to hold one
phase's points, which the plan arranges and the pass checks). So the sums of a whole
trace are kept with its columns (and in the cache): a later query without ``--range``
reads them instead of walking the activities; ``--range`` walks them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis import stream_stats as stats_of
from profkit.analysis import stream_tables as tables
from profkit.analysis.categories import CATEGORIES, category_of
from profkit.analysis.chunked import map_chunks
from profkit.analysis.stream_attribution import Plan
from profkit.traces.columns import ActivityColumns, Derived
from profkit.traces.schema import KINDS

KEPT_AS = "sums"
VERSION = 2  # bumped whenever what the sums mean changes (2: inferred phases)
QUANTITIES = (*KINDS, "kernel_ns", "gpu_ns")
"""What every sum carries: a count per activity kind, then kernel and all-activity ns."""
KERNEL_NS, GPU_NS = len(KINDS), len(KINDS) + 1
STATS = ("per_phase", "overall")
STAT_TEXT = ("grid", "block")  # the statistics' text columns (kept as JSON, not arrays)


@dataclass
class Selection:
    """Which activities a pass adds up: a phase code (``--phase``), slots (``--range``)."""

    phase: int | None = None
    inside: np.ndarray | None = None  # per slot, then False for slot -1 (Plan.slots_inside)

    def of(self, att: Mapping[str, np.ndarray], lo: int, hi: int) -> np.ndarray | None:
        """Mask of the chunk's selected activities (None: all of them)."""
        if self.phase is None and self.inside is None:
            return None
        keep = np.ones(hi - lo, dtype=bool)
        if self.phase is not None:
            keep &= att["phase"][lo:hi] == self.phase
        if self.inside is not None:
            keep &= self.inside[att["self_slot"][lo:hi]] | self.inside[att["owner_slot"][lo:hi]]
        return keep


@dataclass
class Sums:
    """Per phase, what the selected activities add up to (the tables need nothing else)."""

    by_phase_category: np.ndarray
    """(phases × categories, QUANTITIES)."""
    by_slot: np.ndarray
    """(slots, QUANTITIES): the points of the selected activities in each slot between
    consecutive bounds; :meth:`by_range` adds them up per range."""
    slot_phase: np.ndarray | None
    """The phase of every point of each slot (:attr:`.Plan.slot_phase`); None where a
    slot holds several phases' points (then no :meth:`restricted`)."""
    moved: np.ndarray  # per phase: activities attributed through the owner thread
    inferred: np.ndarray  # per phase: activities whose phase was inferred
    same: np.ndarray  # (phase, the launching thread's own phase): activities
    unlaunched: np.ndarray  # per phase: activities without a launch call
    workers: np.ndarray  # (phase, thread code): threads that launched moved activities
    per_phase: pd.DataFrame  # kernel statistics per (name, phase): stream_stats.kernel_stats
    overall: pd.DataFrame  # per name
    unattributed_seen: bool  # whether any activity (selected or not) is unattributed

    def by_range(self, plan: Plan) -> np.ndarray:
        """(ranges, QUANTITIES): the slots from each range's start to its end, summed.

        A point p lies in [start, end) exactly when its slot (bounds <= p, counted) is in
        [bounds <= start, bounds <= end), so a range's sum is a difference of prefix sums.
        """
        prefix = np.zeros((len(self.by_slot) + 1, len(QUANTITIES)), dtype=np.int64)
        np.cumsum(self.by_slot, axis=0, out=prefix[1:])
        return prefix[plan.slot(plan.range_end)] - prefix[plan.slot(plan.range_start)]

    def restricted(self, phase: int) -> Sums:
        """The sums of this phase's activities alone (needs ``slot_phase``)."""
        if self.slot_phase is None:
            raise ValueError("slots hold several phases: add up the phase's activities")
        n_phases = len(self.moved)
        rows = np.arange(n_phases) == phase
        by_phase = self.by_phase_category.reshape(n_phases, len(CATEGORIES), -1)
        stats = self.per_phase[self.per_phase["phase"] == phase].reset_index(drop=True)
        return replace(
            self,
            by_phase_category=(by_phase * rows[:, None, None]).reshape(-1, len(QUANTITIES)),
            by_slot=self.by_slot * (self.slot_phase[:-1] == phase)[:, None],
            moved=self.moved * rows,
            inferred=self.inferred * rows,
            same=self.same * rows[:, None],
            unlaunched=self.unlaunched * rows,
            workers=self.workers & rows[:, None],
            per_phase=stats,
            overall=stats.assign(phase=-1),  # one phase: its rows are the per-name ones
        )

    def kept(self, identity: dict[str, Any]) -> Derived:
        """These sums as arrays and JSON, to keep with the columns."""
        arrays = {name: getattr(self, name) for name in ARRAYS}
        if self.slot_phase is not None:
            arrays["slot_phase"] = self.slot_phase
        text = {}
        for name in STATS:
            frame = getattr(self, name)
            for column in frame.columns:
                if column in STAT_TEXT:
                    text[f"{name}.{column}"] = frame[column].tolist()
                else:
                    arrays[f"{name}.{column}"] = frame[column].to_numpy()
        meta = {"identity": identity, "text": text, "unattributed_seen": self.unattributed_seen}
        return Derived(arrays=arrays, meta=meta)

    @classmethod
    def from_kept(cls, kept: Derived, identity: dict[str, Any]) -> Sums | None:
        """The sums kept by :meth:`kept`, or None if they were computed from other inputs."""
        if kept.meta.get("identity") != identity:
            return None
        a, text = kept.arrays, kept.meta["text"]
        stats = {}
        for name in STATS:
            columns = {k.split(".", 1)[1]: v for k, v in a.items() if k.startswith(f"{name}.")}
            columns.update({k.split(".", 1)[1]: v for k, v in text.items() if k.startswith(name)})
            stats[name] = pd.DataFrame({c: columns[c] for c in stats_of.STAT_COLUMNS})
        return cls(
            **{name: a[name] for name in ARRAYS},
            slot_phase=a.get("slot_phase"),
            per_phase=stats["per_phase"],
            overall=stats["overall"],
            unattributed_seen=bool(kept.meta["unattributed_seen"]),
        )


ARRAYS = ("by_phase_category", "by_slot", "moved", "inferred", "same", "unlaunched", "workers")


def add_up(
    cols: ActivityColumns, plan: Plan, att: Mapping[str, np.ndarray], selection: Selection
) -> Sums:
    """One pass over the chunks: the sums of the selected activities (see the module doc)."""
    n_phases, last = len(plan.phase_names), len(plan.phase_names) - 1
    sums = Sums(
        by_phase_category=np.zeros((n_phases * len(CATEGORIES), len(QUANTITIES)), np.int64),
        by_slot=np.zeros((len(plan.bounds) + 1, len(QUANTITIES)), np.int64),
        slot_phase=plan.slot_phase,
        moved=np.zeros(n_phases, np.int64),
        inferred=np.zeros(n_phases, np.int64),
        same=np.zeros((n_phases, n_phases), np.int64),
        unlaunched=np.zeros(n_phases, np.int64),
        workers=np.zeros((n_phases, len(cols.threads)), dtype=bool),
        per_phase=pd.DataFrame(),
        overall=pd.DataFrame(),
        unattributed_seen=False,
    )
    name_kind, name_category = name_codes(cols)
    cols.load(["name", "duration", "launch_thread"])  # each chunk reads them
    filtered = selection.phase is not None or selection.inside is not None
    selected_phase = np.full(len(cols), -1, dtype=np.int16) if filtered else att["phase"]

    def chunk(lo: int, hi: int) -> _Part:  # writes rows lo..hi of ``selected_phase`` only
        keep = selection.of(att, lo, hi)
        phase = att["phase"][lo:hi]
        c = {"phase": phase, "same": att["same"][lo:hi], "self_slot": att["self_slot"][lo:hi],
             "owner_slot": att["owner_slot"][lo:hi], "inferred": att["inferred"][lo:hi],
             "name": cols.arrays["name"][lo:hi],
             "code": cols.arrays["launch_thread"][lo:hi],
             "duration": cols.arrays["duration"][lo:hi]}  # fmt: skip
        if keep is not None:
            selected_phase[lo:hi][keep] = phase[keep]
            c = {name: values[keep] for name, values in c.items()}
        part = _part(c, name_kind[c["name"]], name_category[c["name"]], plan, len(cols.threads))
        part.unattributed_seen = bool((phase == last).any())  # selected or not
        return part

    for part in map_chunks(chunk, len(cols), tables.CHUNK):
        part.add_to(sums)
    sums.per_phase, sums.overall = stats_of.kernel_stats(cols, selected_phase, n_phases)
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
    unattributed_seen: bool = False

    def add_to(self, sums: Sums) -> None:
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
        sums.unattributed_seen |= self.unattributed_seen


def _part(
    c: dict[str, np.ndarray], kind: np.ndarray, category: np.ndarray, plan: Plan, threads: int
) -> _Part:
    n_phases, last = len(plan.phase_names), len(plan.phase_names) - 1
    duration = c["duration"].clip(min=0).astype(np.float64)
    phase = c["phase"].astype(np.int64)
    by_phase_category = np.zeros((n_phases * len(CATEGORIES), len(QUANTITIES)), np.int64)
    add_sums(by_phase_category, phase * len(CATEGORIES) + category, kind, duration)
    windows: list[Window] = []
    agrees = True
    for slot in (c["self_slot"], c["owner_slot"]):
        point = slot >= 0
        windows += point_windows(slot[point], c["code"][point], kind[point], duration[point])
        if plan.slot_phase is not None and (plan.slot_phase[slot[point]] != phase[point]).any():
            agrees = False
    inferred = c["inferred"] > 0
    # Through the owner's ranges: an inferred phase came from no range.
    moved = (c["owner_slot"] >= 0) & (phase != last) & ~inferred
    unlaunched = c["code"] < 0
    same = np.bincount(phase * n_phases + c["same"], minlength=n_phases**2)
    return _Part(
        by_phase_category=by_phase_category,
        windows=windows,
        one_phase_per_slot=agrees,
        moved=np.bincount(phase[moved], minlength=n_phases),
        inferred=np.bincount(phase[inferred], minlength=n_phases),
        same=same.reshape(n_phases, n_phases),
        unlaunched=np.bincount(phase[unlaunched], minlength=n_phases),
        workers=np.unique(phase[moved] * threads + c["code"][moved]),  # moved: launched
    )


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
    kernel = kind == KINDS.index("kernel")
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


def point_windows(
    slot: np.ndarray, code: np.ndarray, kind: np.ndarray, duration: np.ndarray
) -> list[Window]:
    """The points' sums by slot, one launching thread at a time: a chunk's points of one
    thread lie on one lane, close in time, so in a narrow window of slots (a bincount over
    every slot per chunk would cost chunks × slots). Points spread over many more slots
    than they are (a table of copies read after the kernels spans the whole trace) are
    summed over the slots they hit only."""
    windows: list[Window] = []
    present = np.flatnonzero(np.bincount(code.astype(np.int64) + 1)) - 1
    for thread in present.tolist():
        mine = code == thread if len(present) > 1 else slice(None)
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
