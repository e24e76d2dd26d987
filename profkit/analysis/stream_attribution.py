"""Attribution of :class:`~profkit.traces.columns.ActivityColumns`, chunk by chunk, kept.

The rule of :func:`.attribution.attribute` (same sorts and binary searches), per chunk of
activities against the ranges, which are few: each activity gets its phase, the phase its
launching thread alone would give it (for the notes), and the *slots* of its attribution
points. Every range start and end key, sorted, cuts the (thread, time) keys into slots; a
point lies in a range exactly when its slot lies between the range's start and end slots,
so any range question (``--range``, the range table) is a look-up by slot. An activity
has a point on its launching thread (slot -1 when its launch is unknown) and, when it was
launched from a worker thread, one on the owner thread of its process (-1 otherwise).

These four small arrays (12 bytes an activity) depend on the trace alone, not on the
query, so they are kept with the columns (:meth:`ActivityColumns.remember`), and through
them in the cache: a later query of the same trace starts from them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from profkit.analysis import stream_tables as tables
from profkit.analysis.attribution import UNATTRIBUTED, _outermost, _owners, phase_intervals
from profkit.analysis.chunked import map_chunks
from profkit.analysis.intervals import Lanes, stab
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns, Derived
from profkit.traces.schema import PROCESS_SHIFT

KEPT_AS = "attribution"
VERSION = 1  # bumped whenever what the arrays mean changes
MAX_PROJECTED = 1 << 23  # projected phase bounds at most (each lane × each phase bound)
ARRAYS = {"phase": np.int16, "same": np.int16, "self_slot": np.int32, "owner_slot": np.int32}


@dataclass
class Plan:
    """What attribution needs from the ranges alone (see :func:`.attribution.attribute`)."""

    lanes: Lanes
    domain: str
    owners: dict[int, int]
    phase_names: list[str]
    phase_code: np.ndarray  # per phase interval, then the catch-all slot
    p_start: np.ndarray
    p_end: np.ndarray
    is_phase: np.ndarray
    range_start: np.ndarray
    range_end: np.ndarray
    bounds: np.ndarray
    """Every range start and end key, sorted: they cut the keys into slots; with the
    phases' bounds projected onto every lane, when that makes each slot one phase's."""
    slot_phase: np.ndarray | None = None
    """The phase of every point in each slot (then -1 for slot -1), where one phase holds
    them all (:func:`_projected_phases`); the sums check it as they go."""

    def slot(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each key: how many bounds lie at or before it."""
        return np.searchsorted(self.bounds, keys, side="right")

    def slots_inside(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Per slot (then a last entry for slot -1, "no point"): inside some [start, end)?

        ``start`` and ``end`` are range bounds (so in ``bounds``), which makes it exact.
        """
        marks = np.zeros(len(self.bounds) + 2, dtype=np.int64)
        np.add.at(marks, self.slot(start), 1)
        np.add.at(marks, self.slot(end), -1)
        inside = np.cumsum(marks) > 0
        inside[-1] = False
        return inside


def plan_of(cols: ActivityColumns, phase_domain: str | None = None) -> Plan:
    """The phases (outermost ranges of each process's owner thread) and the slot bounds."""
    r = cols.ranges
    r_start, r_end = r["start"].to_numpy(np.int64), r["end"].to_numpy(np.int64)
    r_thread = r["thread"].to_numpy(np.int64)
    domains = r["domain"].fillna("").astype(str)
    if phase_domain is None:
        phase_domain = "" if (domains == "").any() or domains.empty else domains.mode().iloc[0]
    known = cols.launch_bounds()
    lanes = Lanes(r_thread, [r_start, r_end, np.array(known if known else [], dtype=np.int64)])
    # Only traces whose steps carry phase ranges come here (analysis.kernels checks), so the
    # outermost ranges of the owner thread are the phases, as attribute() finds them there.
    candidates = _outermost(r, (domains == phase_domain).to_numpy(), lanes)
    owners = _owners(r_thread[candidates], r_end[candidates] - r_start[candidates])
    phase_rows = candidates[np.isin(r_thread[candidates], list(owners.values()))]
    phases = phase_intervals(r, phase_rows, lanes)
    is_phase, p_start, p_end = phases.is_phase, phases.start, phases.end
    phase_names, phase_code = phases.names, phases.code
    phase_names.append(UNATTRIBUTED)
    phase_code[-1] = len(phase_names) - 1
    if len(phase_names) > np.iinfo(np.int16).max:
        raise BadInput(f"{len(phase_names):,} distinct phase names: profkit reads at most 32,767")
    range_start, range_end = lanes.key(r_thread, r_start), lanes.key(r_thread, r_end)
    projected = _projected_phases(cols, lanes, owners, p_start, p_end)
    keys = [range_start, range_end] + ([] if projected is None else [projected])
    plan = Plan(lanes, phase_domain, owners, phase_names, phase_code, p_start, p_end,
                is_phase, range_start, range_end, _sorted_unique(np.concatenate(keys)))  # fmt: skip
    if projected is not None:
        plan.slot_phase = _slot_phases(plan)
    return plan


def _projected_phases(
    cols: ActivityColumns,
    lanes: Lanes,
    owners: dict[int, int],
    p_start: np.ndarray,
    p_end: np.ndarray,
) -> np.ndarray | None:
    """The phases' start and end times as keys on every lane that holds attribution points
    (the launching threads' and their owner's), so that every slot with points lies on
    one lane and in one phase.

    Only for one process (one owner thread): its phase at time t is the same on all its
    threads. None where that does not hold or the keys would be too many.
    """
    if len(owners) != 1 or not len(p_start):
        return None
    thread = np.append(np.asarray(cols.threads, dtype=np.int64), -1)
    owner = _owner_of(thread, owners)
    point_lanes = np.unique(np.concatenate([lanes.codes(thread), lanes.codes(owner[owner >= 0])]))
    if 2 * len(p_start) * len(point_lanes) > MAX_PROJECTED:
        return None
    # Offsets on the owner's lane, and each lane's first and past-last key: a slot then
    # never reaches from another lane into a lane with points.
    times = np.concatenate([p_start % lanes.span, p_end % lanes.span, [0, lanes.span]])
    return (point_lanes[:, None] * lanes.span + times[None, :]).reshape(-1)


def _slot_phases(plan: Plan) -> np.ndarray:
    """The phase of every point in each slot (see :func:`_projected_phases`), then one
    entry for slot -1 (no point): a slot with points lies on one lane, so its first key
    tells."""
    bounds = plan.bounds
    first = np.concatenate([bounds[:1] - 1, bounds]) if len(bounds) else np.zeros(1, np.int64)
    owner_lane = int(plan.p_start[0] // plan.lanes.span)
    on_owner = owner_lane * plan.lanes.span + first % plan.lanes.span
    phase = plan.phase_code[stab(plan.p_start, plan.p_end, on_owner)]
    return np.append(phase, -1).astype(np.int16)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` by a sort: numpy 2's hashing unique is ~40x slower on these keys."""
    values = np.sort(values)
    return values[np.append(True, values[1:] != values[:-1])] if len(values) else values


def attributed(cols: ActivityColumns, plan: Plan) -> Mapping[str, np.ndarray]:
    """Per activity: ``phase``, ``same`` (the launching thread's phase alone), ``self_slot``
    and ``owner_slot``; kept with the columns, and taken from them when already there."""
    expected = attribution_identity(cols, plan)
    kept = cols.derived.get(KEPT_AS)
    if kept is not None and kept.meta == expected and _fits(kept.arrays, len(cols)):
        return kept.arrays
    arrays = _attribute(cols, plan)
    cols.remember(KEPT_AS, Derived(arrays, expected))
    return arrays


def attribution_identity(cols: ActivityColumns, plan: Plan) -> dict[str, Any]:
    """What the arrays were computed from: a kept set that differs is recomputed (JSON
    types only: it is compared with what the cache read back)."""
    digest = hashlib.sha256(plan.bounds.tobytes())
    digest.update(plan.p_start.tobytes() + plan.p_end.tobytes())
    return {
        "version": VERSION,
        "rows": len(cols),
        "domain": plan.domain,
        "phases": plan.phase_names,
        "owners": [[process, thread] for process, thread in sorted(plan.owners.items())],
        "keys": digest.hexdigest()[:32],
    }


def _fits(arrays: Mapping[str, np.ndarray], rows: int) -> bool:
    return set(arrays) == set(ARRAYS) and all(
        len(arrays[n]) == rows and arrays[n].dtype == t for n, t in ARRAYS.items()
    )


def _attribute(cols: ActivityColumns, plan: Plan) -> dict[str, np.ndarray]:
    out = {name: np.empty(len(cols), dtype=t) for name, t in ARRAYS.items()}
    out["self_slot"][:] = -1
    out["owner_slot"][:] = -1
    last = len(plan.phase_names) - 1
    lane, owner_lane, cross_of = _thread_tables(cols, plan)
    span, base = plan.lanes.span, plan.lanes.base

    def chunk(lo: int, hi: int) -> None:  # writes rows lo..hi of ``out`` only
        launch = cols.arrays["launch_start"][lo:hi]
        rows = np.flatnonzero(launch >= 0)
        code = cols.arrays["launch_thread"][lo:hi][rows]  # -1 (unknown) indexes the last entry
        time = launch[rows] - base
        self_keys = lane[code] * span + time
        same = np.full(hi - lo, last, dtype=np.int64)
        same[rows] = plan.phase_code[stab(plan.p_start, plan.p_end, self_keys)]
        cross = cross_of[code]
        cross_rows = rows[cross]
        owner_keys = owner_lane[code[cross]] * span + time[cross]
        phase = same.copy()
        phase[cross_rows] = plan.phase_code[stab(plan.p_start, plan.p_end, owner_keys)]
        out["phase"][lo:hi] = phase
        out["same"][lo:hi] = same
        out["self_slot"][lo + rows] = plan.slot(self_keys)
        out["owner_slot"][lo + cross_rows] = plan.slot(owner_keys)

    for _ in map_chunks(chunk, len(cols), tables.CHUNK):
        pass
    return out


def _thread_tables(cols: ActivityColumns, plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per launching-thread code (then one entry for -1, unknown): its lane code, its
    process's owner thread's lane code, and whether it is a worker (owner elsewhere)."""
    thread = np.append(np.asarray(cols.threads, dtype=np.int64), -1)
    owner = _owner_of(thread, plan.owners)
    worker = (owner >= 0) & (owner != thread)
    return plan.lanes.codes(thread), plan.lanes.codes(owner), worker


def _owner_of(thread: np.ndarray, owners: dict[int, int]) -> np.ndarray:
    """The owner thread of each thread's process (-1 where its process has no phases)."""
    if not owners:
        return np.full(len(thread), -1, dtype=np.int64)
    processes = np.array(sorted(owners), dtype=np.int64)
    threads = np.array([owners[p] for p in processes], dtype=np.int64)
    process = thread >> PROCESS_SHIFT
    index = np.minimum(np.searchsorted(processes, process), len(processes) - 1)
    return np.where(processes[index] == process, threads[index], -1)
