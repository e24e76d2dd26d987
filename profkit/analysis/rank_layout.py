"""Which rank each activity of a multi-process export belongs to, and what each rank alone
would call its phases.

:func:`ranks_of` numbers the ranks as :func:`.ranks.rank_processes` numbers them (order of
(device, pid); an activity without a launch call goes to the process that launched most on
its device). The activities are attributed once for the whole trace
(:mod:`.attribution`): attribution works per process, so a rank's phases are its rows
of that attribution renumbered as the rank alone numbers them (:func:`rank_views`). One
process is a world of one rank (:meth:`RankView.whole`).

Which activities are which rank's (:func:`ranks_of`): in an nsys export, each process that
ran GPU work is a rank (ties of launch counts go to the lowest pid and device; each process
takes its phases from its own default NVTX domain); several nodes' exports are joined first
(:mod:`.joins`); per-rank traces name their ranks, and joined their layout is their
files' (:mod:`.joins`). What the columns cannot tell (a rank with activity in a
phase only another rank marks: the attribution works per process, so real traces do not do
it) raises :class:`RanksUntold`, one line; no other reading is tried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from profkit.analysis import chunked
from profkit.analysis.attribution import Plan
from profkit.analysis.chunked import map_chunks
from profkit.analysis.phase_ranges import ordered_phase_names, phase_source
from profkit.errors import BadInput
from profkit.traces.columns import START, ActivityColumns
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT
from profkit.workload.names import PHASES


class RanksUntold(BadInput):
    """What the ranked report cannot tell from a trace's columns, said in one line: a rank
    with GPU activity in a phase only another rank marks, say. The attribution works per
    process, so real traces do not do it; no other reading of the trace is tried."""


ACTIVITY_ELSEWHERE = (
    "a rank's GPU activity falls in a phase that only another rank marks: its tables "
    "cannot be split from the other ranks'"
)


@dataclass
class Layout:
    """The ranks: ``info`` as :func:`.ranks.rank_processes` gives it, the rank of every
    activity, and of every range (-1: its thread's process ran no GPU activity)."""

    info: list[dict[str, Any]]
    rank: np.ndarray
    range_rank: np.ndarray


@dataclass
class RankView:
    """One rank's share of the whole trace: its ranges, its phase names as it alone names
    them, the whole trace's phase codes renumbered to those (-1: not its phase), its
    threads (a mask over the thread codes), phase owners, where its phases came from and
    its inferred phases' spans."""

    range_rows: np.ndarray
    names: list[str]
    to_local: np.ndarray
    threads: np.ndarray
    owners: dict[int, int]
    phase_source: str
    inferred_spans: dict[str, tuple[int, int]]

    @classmethod
    def whole(cls, cols: ActivityColumns, plan: Plan) -> RankView:
        """The one rank of a one-process trace: every range, thread and phase."""
        return cls(
            range_rows=np.arange(len(cols.ranges)),
            names=plan.phase_names,
            to_local=np.arange(len(plan.phase_names)),
            threads=np.ones(len(cols.threads), dtype=bool),
            owners=plan.owners,
            phase_source=plan.phase_source,
            inferred_spans=plan.inferred_spans,
        )


def ranks_of(cols: ActivityColumns, fewest: int = 2) -> Layout | None:
    """The ranks of an export's columns; None for fewer than ``fewest`` processes that ran
    GPU work (one process is a rank where it is a node of a job), or where the columns keep
    no start times."""
    if START not in cols.arrays or cols.meta.get("ranks"):
        return None
    thread_pid = (np.asarray(cols.threads, dtype=np.int64) >> PROCESS_SHIFT) & PROCESS_MASK
    pids = np.unique(thread_pid)
    index_of_code = np.append(np.searchsorted(pids, thread_pid), -1)  # code -1: unknown
    counts = _device_counts(cols, index_of_code, len(pids))  # (device, 1 + pid index)
    launched, unlaunched = counts[:, 1:], counts[:, 0]
    # Ties go to the lowest pid and the lowest device (argmax's first); activities without a
    # launch on a device nothing launched on go to the process that launched most overall.
    main = np.where(launched.sum(axis=1) > 0, launched.argmax(axis=1),
                    launched.sum(axis=0).argmax())  # fmt: skip
    per_pid = launched.copy()
    per_pid[np.arange(len(main)), main] += unlaunched
    present = np.flatnonzero(per_pid.sum(axis=0))
    if len(present) < max(fewest, 1):
        return None
    device = per_pid[:, present].argmax(axis=0)
    order = sorted(zip(device.tolist(), present.tolist(), strict=True))
    rank_of_index = np.full(len(pids) + 1, -1, dtype=np.int64)
    rank_of_index[[i for _, i in order]] = np.arange(len(order))
    rank_of_device = rank_of_index[main]
    host = cols.meta.get("host")
    info = [{"rank": r, "world_size": len(order), "device": d, "pid": int(pids[i]), "host": host}
            for r, (d, i) in enumerate(order)]  # fmt: skip
    rank = np.empty(len(cols), dtype=np.int16)

    def chunk(lo: int, hi: int) -> None:  # writes rank[lo:hi] only
        index = index_of_code[cols.arrays["launch_thread"][lo:hi]]
        device_rank = rank_of_device[cols.arrays["device"][lo:hi]]
        rank[lo:hi] = np.where(index >= 0, rank_of_index[index], device_rank)

    for _ in map_chunks(chunk, len(cols), chunked.CHUNK):
        pass
    range_pid = (cols.ranges["thread"].to_numpy(np.int64) >> PROCESS_SHIFT) & PROCESS_MASK
    at = np.minimum(np.searchsorted(pids, range_pid), len(pids) - 1)
    range_rank = np.where(pids[at] == range_pid, rank_of_index[at], -1)
    return Layout(info, rank, range_rank)


def _device_counts(cols: ActivityColumns, index_of_code: np.ndarray, n_pids: int) -> np.ndarray:
    """Per device: activities without a launch call, then those launched by each process."""
    width = n_pids + 1
    cols.load(["launch_thread", "device"])

    def chunk(lo: int, hi: int) -> np.ndarray:
        index = index_of_code[cols.arrays["launch_thread"][lo:hi]]
        device = cols.arrays["device"][lo:hi].astype(np.int64)
        return np.bincount(device * width + index + 1)

    counts = np.zeros(0, dtype=np.int64)
    for found in map_chunks(chunk, len(cols), chunked.CHUNK):
        if len(found) > len(counts):
            counts = np.append(counts, np.zeros(len(found) - len(counts), np.int64))
        counts[: len(found)] += found
    counts = np.append(counts, np.zeros(-len(counts) % width, np.int64))
    return counts.reshape(-1, width)


def rank_views(cols: ActivityColumns, plan: Plan, layout: Layout) -> list[RankView]:
    """Each rank's view of the plan (what attributing its activities alone would give, as
    :func:`.by_process.restrict` says)."""
    lane = plan.p_start // plan.lanes.span
    thread = plan.lanes.lanes[np.minimum(lane, len(plan.lanes.lanes) - 1)]
    phase_pid = (thread >> PROCESS_SHIFT) & PROCESS_MASK
    thread_pid = (np.asarray(cols.threads, dtype=np.int64) >> PROCESS_SHIFT) & PROCESS_MASK
    step_phases = plan.step_phases
    step_pid = _step_processes(plan, step_phases[:, 0]) & PROCESS_MASK
    n = len(layout.info)
    # Each rank's rows, grouped once: a comparison a rank over every row is n^2 at 1,024
    range_rows_of = _rows_of(layout.range_rank, n)
    phases_of = _rows_of(_rank_of_pid(phase_pid, layout), n)
    threads_of = _rows_of(_rank_of_pid(thread_pid, layout), n)
    steps_of = _rows_of(_rank_of_pid(step_pid, layout), n)
    owners_of: dict[int, dict[int, int]] = {}
    for p, t in plan.owners.items():
        owners_of.setdefault(p & PROCESS_MASK, {})[p] = t
    views = []
    for r, info in enumerate(layout.info):
        pid = info["pid"]
        range_rows = range_rows_of[r]
        mine = phases_of[r]
        annotated = list(dict.fromkeys(plan.phase_names[c] for c in plan.phase_code[mine].tolist()))
        own_steps = step_phases[steps_of[r]]
        uses = np.isin(own_steps[:, 0], plan.inferred_steps)
        names, remap = ordered_phase_names(annotated, own_steps[uses, 1])
        local = {name: i for i, name in enumerate(names[:-1])}
        to_local = np.array([local.get(n, -1) for n in plan.phase_names], dtype=np.int64)
        for code, whole in enumerate(plan.remap.tolist()):  # inferred phases by what they are
            if whole >= 0 and to_local[whole] < 0:
                to_local[whole] = remap[code]
        to_local[-1] = len(names) - 1
        inferred_names = [names[i] if i >= 0 else p for i, p in zip(remap, PHASES, strict=False)]
        spans = {}
        if plan.inference is not None and uses.any():
            spans = plan.inference.spans.per_phase(np.unique(own_steps[uses, 0]), inferred_names)
        owners = owners_of.get(pid, {})
        source = phase_source(uses, bool(annotated), plan.mode)
        threads = np.zeros(len(thread_pid), dtype=bool)
        threads[threads_of[r]] = True
        views.append(RankView(range_rows, names, to_local, threads, owners, source, spans))
    return views


def _rank_of_pid(pids: np.ndarray, layout: Layout) -> np.ndarray:
    """The rank of each process key (-1: none of the layout's ranks)."""
    known = np.array([info["pid"] for info in layout.info], dtype=np.int64)
    if not len(known):
        return np.full(len(pids), -1, dtype=np.int64)
    order = np.argsort(known, kind="stable")
    at = np.searchsorted(known[order], pids).clip(max=len(known) - 1)
    return np.where(known[order][at] == pids, order[at], -1)


def _rows_of(rank: np.ndarray, n: int) -> list[np.ndarray]:
    """Per rank 0..n-1, the rows whose ``rank`` it is, in row order."""
    order = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[order], np.arange(n + 1))
    return [order[bounds[r] : bounds[r + 1]] for r in range(n)]


def _step_processes(plan: Plan, steps: np.ndarray) -> np.ndarray:
    """The process key of each step number (steps never span two processes)."""
    if plan.inference is None or not len(steps):
        return np.zeros(len(steps), dtype=np.int64)
    lanes = plan.inference.step_lanes
    starts = plan.inference.step_starts
    code = starts[np.maximum(steps - 1, 0)] // lanes.span
    return np.append(lanes.lanes, -1)[np.minimum(code, len(lanes.lanes))]
