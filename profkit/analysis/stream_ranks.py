"""The ranked report of a multi-process Nsight Systems export, from compact columns.

:func:`analyze_rank_columns` gives what :func:`.ranks.analyze_ranks` gives (tests compare
them on the 2-rank fixtures) in bounded memory: the columns of a multi-process export keep
each activity's GPU start and device besides what one process needs
(:data:`profkit.traces.columns.TIMED`), and

1. ranks are numbered as :func:`.ranks.rank_processes` numbers them (order of (device,
   pid); an activity without a launch call goes to the process that launched most on its
   device): :func:`ranks_of`;
2. the activities are attributed once, as for one process (:mod:`.stream_attribution`):
   attribution works per process, so a rank's phases are its rows of that attribution,
   renumbered as the rank alone numbers them (:class:`RankView`);
3. one pass adds up every rank's sums and keys (:mod:`.stream_rank_sums`; the keys give
   the kernel statistics, :mod:`.stream_rank_stats`), from which come each rank's tables
   and the whole trace's; a second pass finds the compute kernels that
   meet NCCL and each rank's step spans (:mod:`.stream_rank_comm`).

Which activities are which rank's (:func:`ranks_of`): in an nsys export, each process that
ran GPU work is a rank (ties of launch counts go to the lowest pid and device; each process
takes its phases from its own default NVTX domain); several nodes' exports are joined first
(:mod:`.stream_nodes`); per-rank traces name their ranks, and joined their layout is their
files' (:mod:`.stream_rank_files`). Phases are annotated or inferred, per rank as it alone
would. What the columns cannot tell (a rank with activity in a phase only another rank
marks: the attribution works per process, so real traces do not do it) raises
:class:`~.stream_rank_tables.RanksUntold`, one line; no other reading is tried.

Every pass over the activities (numbering the ranks, attributing, adding up, the second
pass) runs its chunks on up to four threads (:mod:`.chunked`), its result the same as on one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from profkit.analysis import stream_tables as tables
from profkit.analysis.attribution import (
    PhaseMode,
    ordered_phase_names,
    phase_source,
)
from profkit.analysis.chunked import map_chunks
from profkit.analysis.comm import is_nccl
from profkit.analysis.report_types import KernelReport, RankedReport, RankEntry
from profkit.analysis.selection import phase_index, range_labels
from profkit.analysis.steps import step_table
from profkit.analysis.stream_attribution import Plan, attributed, plan_of
from profkit.analysis.stream_rank_comm import (
    kernels_reader,
    nccl_unions,
    rank_comm,
    rank_steps,
    second_pass,
)
from profkit.analysis.stream_rank_stats import kernel_statistics
from profkit.analysis.stream_rank_sums import KERNEL, RankSelection, add_up_ranks
from profkit.analysis.stream_rank_tables import (
    ACTIVITY_ELSEWHERE,
    RanksUntold,
    by_range,
    first_steps,
    rank_scope,
    scope_report,
    stat_frames,
    whole_scope,
)
from profkit.analysis.stream_sums import name_codes
from profkit.errors import BadInput
from profkit.traces.columns import START, ActivityColumns
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT
from profkit.workload.names import PHASES


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

    for _ in map_chunks(chunk, len(cols), tables.CHUNK):
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
    for found in map_chunks(chunk, len(cols), tables.CHUNK):
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
    views = []
    for r, info in enumerate(layout.info):
        pid = info["pid"]
        range_rows = np.flatnonzero(layout.range_rank == r)
        mine = np.flatnonzero(phase_pid == pid)
        annotated = list(dict.fromkeys(plan.phase_names[c] for c in plan.phase_code[mine].tolist()))
        own_steps = step_phases[step_pid == pid]
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
        owners = {p: t for p, t in plan.owners.items() if p & PROCESS_MASK == pid}
        source = phase_source(uses, bool(annotated), plan.mode)
        views.append(RankView(range_rows, names, to_local, thread_pid == pid, owners, source,
                              spans))  # fmt: skip
    return views


def _step_processes(plan: Plan, steps: np.ndarray) -> np.ndarray:
    """The process key of each step number (steps never span two processes)."""
    if plan.inference is None or not len(steps):
        return np.zeros(len(steps), dtype=np.int64)
    lanes = plan.inference.step_lanes
    starts = plan.inference.step_starts
    code = starts[np.maximum(steps - 1, 0)] // lanes.span
    return np.append(lanes.lanes, -1)[np.minimum(code, len(lanes.lanes))]


def analyze_rank_columns(
    cols: ActivityColumns,
    layout: Layout,
    top: int = 20,
    phase: str | None = None,
    range_: str | None = None,
    rank: int | None = None,
    phases: PhaseMode = "auto",
) -> RankedReport:
    """:func:`.ranks.analyze_ranks` for the columns of a multi-process export (the same
    report); raises :class:`~.stream_rank_tables.RanksUntold` where the columns cannot
    tell it (no other reading is tried)."""
    if rank is not None and rank not in [p["rank"] for p in layout.info]:
        known = ", ".join(str(p["rank"]) for p in layout.info) or "none"
        raise BadInput(f"no rank {rank} in this trace; ranks: {known}")
    if top < 0:
        raise BadInput(f"--top must be 0 (all) or more, got {top}")
    plan = plan_of(cols, phases=phases)
    views = rank_views(cols, plan, layout)
    att = attributed(cols, plan)
    labels = range_labels(cols.ranges)
    selection = _selection(cols, plan, att, layout, views, labels, phase, range_)
    name_kind = name_codes(cols)[0]
    kernel_name = name_kind == KERNEL
    nccl_name = kernel_name & is_nccl(np.array(cols.names, dtype=object))
    sums = add_up_ranks(cols, plan, att, layout.rank, len(views), nccl_name, selection)
    n_phases = len(plan.phase_names)
    seen = sums.seen.reshape(len(views), n_phases)
    for r, view in enumerate(views):
        elsewhere = np.flatnonzero((view.to_local < 0) & (seen[r] > 0))
        if len(elsewhere):
            name = plan.phase_names[int(elsewhere[0])]
            raise RanksUntold(f"rank {r}: {ACTIVITY_ELSEWHERE} ({name!r})")
    stats = kernel_statistics(sums.keys, len(cols.names), n_phases)
    frames = stat_frames(cols, sums.group, stats, len(views), n_phases)
    ranges_sums = by_range(sums, plan)
    scopes = [rank_scope(cols, plan, sums, v, r, ranges_sums, labels) for r, v in enumerate(views)]
    reports = [scope_report(cols, s, top, phase, range_) for s in scopes]
    starts = [first_steps(s, rep) for s, rep in zip(scopes, reports, strict=True)]
    found = second_pass(
        cols, layout.rank, sums.group, kernel_name & ~nccl_name, nccl_unions(sums.nccl), starts
    )
    names = np.array(cols.names, dtype=object)
    categories = name_codes(cols)[1]
    entries = []
    for r, (info, view, report) in enumerate(zip(layout.info, views, reports, strict=True)):
        per_phase, overall = frames.of_rank(r, view.to_local)
        report.kernels, report.overall = tables.kernel_tables(
            (per_phase, overall), cols, categories, view.names
        )
        comm = rank_comm(sums.nccl, r, found, names)
        read = kernels_reader(cols, layout.rank, r, starts[r], kernel_name, nccl_name)
        steps = rank_steps(r, sums.nccl, found, starts, read)
        totals = {key: report.totals[key] for key in ("kernels", "kernel_time_ms", "gpu_time_ms")}
        entries.append(RankEntry(info, report, comm, totals, steps))
    chosen = [e for e in entries if rank is None or e.info["rank"] == rank]
    if rank is not None:
        report_of_all = chosen[0].report
    else:
        whole = whole_scope(cols, plan, sums, ranges_sums, labels)
        report_of_all = scope_report(cols, whole, top, phase, range_)
        report_of_all.kernels, report_of_all.overall = tables.kernel_tables(
            frames.whole(), cols, categories, plan.phase_names
        )
    fields = KernelReport.__dataclass_fields__
    report = RankedReport(**{f: getattr(report_of_all, f) for f in fields})
    report.source = {**report_of_all.source, "ranks": len(layout.info), "rank": rank}
    report.ranks = chosen
    report.steps = step_table([e.steps for e in entries])
    report.world_size = max([p.get("world_size") or 0 for p in layout.info] + [len(layout.info)])
    return report


def _selection(
    cols: ActivityColumns,
    plan: Plan,
    att: Any,
    layout: Layout,
    views: list[RankView],
    labels: np.ndarray,
    phase: str | None,
    range_: str | None,
) -> RankSelection:
    """What ``--phase`` and ``--range`` keep, checked rank by rank then for the whole trace
    with the messages (and in the order) :func:`.ranks.analyze_ranks` gives them."""
    selection = RankSelection()
    n_phases = len(plan.phase_names)
    rows = np.zeros(0, dtype=np.int64)
    if range_ is not None:
        names = cols.ranges["name"].to_numpy(dtype=object)
        rows = np.flatnonzero((labels == range_) | (names == range_))
    if phase is not None:
        seen = _seen(cols, att, layout.rank, len(views), n_phases)
    chosen = np.full(len(views), -1, dtype=np.int64)
    for r, view in enumerate(views):
        if phase is not None:
            index = phase_index(view.names, bool(seen[r, -1]), phase)
            chosen[r] = plan.phase_names.index(view.names[index])
        if range_ is not None and not (layout.range_rank[rows] == r).any():
            own = labels[view.range_rows]
            known = ", ".join(list(dict.fromkeys(own.tolist()))[:12]) or "none"
            raise BadInput(f"no range named {range_!r} in this trace; ranges: {known}")
    if phase is not None:
        index = phase_index(plan.phase_names, bool(seen[:, -1].any()), phase)
        other = np.flatnonzero((chosen != index) & (seen[np.arange(len(views)), chosen] > 0))
        if len(other):  # names that differ in case only, each rank spelling its own
            r = int(other[0])
            raise RanksUntold(
                f"--phase {phase!r} is {plan.phase_names[index]!r} in the trace but "
                f"{plan.phase_names[int(chosen[r])]!r} on rank {r}: give the phase as it is "
                "spelled on every rank"
            )
        selection.phase_of_rank = chosen
    if range_ is not None:
        selection.inside = plan.slots_inside(plan.range_start[rows], plan.range_end[rows])
    return selection


def _seen(
    cols: ActivityColumns, att: Any, rank: np.ndarray, n_ranks: int, n_phases: int
) -> np.ndarray:
    """(rank, phase): how many activities, every one counted."""
    seen = np.zeros(n_ranks * n_phases, dtype=np.int64)

    def chunk(lo: int, hi: int) -> np.ndarray:
        key = rank[lo:hi].astype(np.int64) * n_phases + att["phase"][lo:hi]
        return np.bincount(key, minlength=len(seen))

    for part in map_chunks(chunk, len(cols), tables.CHUNK):
        seen += part
    return seen.reshape(n_ranks, n_phases)
