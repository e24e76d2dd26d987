"""The kernel report of :class:`~profkit.traces.columns.ActivityColumns`, in bounded memory:
one process, or the ranks of a multi-process export (a one-process trace is a world of
one rank).

:func:`analyze_columns` gives the report of one process or of several ranks (tests/test_golden.py
holds its outputs on every fixture), without a per-activity frame:

1. the activities are attributed once for the whole trace (:mod:`.attribution`),
   and for several ranks each is told its rank and each rank its own phase names
   (:mod:`.rank_layout`);
2. one pass adds up per (rank, phase, category) sums, the notes' counts and, for several
   ranks, their NCCL kernels (:mod:`.sums`); the kernel statistics come from sorted keys
   in batches of names (:mod:`.kernel_stats`). The sums of every activity are kept with
   the columns, and so in the cache: a repeated query without ``--range`` reads them back
   (one process's then touches no per-activity array; its ``--phase`` keeps one phase's
   share of them);
3. each scope's report (each rank's, the whole trace's) is made from those sums
   (:mod:`.report_tables`); for several ranks a second pass finds the compute kernels
   that meet NCCL and each rank's step spans (:mod:`.rank_comm`).

Memory: the columns, the attribution (12 bytes an activity), the rank of each activity
for several ranks (2 bytes), one batch of sorted keys (8 bytes an activity of the batch;
for several ranks, 16 bytes more per distinct (rank, name, phase, duration), whose counts
make the whole trace's statistics), and chunk-sized temporaries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit.analysis import chunked
from profkit.analysis.attribution import Plan, attributed, plan_of
from profkit.analysis.chunked import map_chunks
from profkit.analysis.comm import is_nccl
from profkit.analysis.job_scope import FileWhole
from profkit.analysis.phase_marks import PhaseRanges
from profkit.analysis.phase_ranges import UNATTRIBUTED, PhaseMode
from profkit.analysis.rank_comm import (
    kernels_reader,
    nccl_unions,
    rank_comm,
    rank_steps,
    second_pass,
)
from profkit.analysis.rank_layout import (
    ACTIVITY_ELSEWHERE,
    Layout,
    RanksUntold,
    RankView,
    rank_views,
)
from profkit.analysis.report_tables import (
    Scope,
    rank_scope,
    scope_phases,
    scope_report,
    whole_scope,
)
from profkit.analysis.report_types import KernelReport, RankedReport, RankEntry
from profkit.analysis.selection import Selection, check_options, no_range, phase_index, range_labels
from profkit.analysis.steps import step_starts, step_table
from profkit.analysis.sums import (
    KERNEL,
    Sums,
    kept_sums,
    name_codes,
    whole_trace_sums,
    with_stats,
)
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns


def analyze_columns(
    cols: ActivityColumns,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    phase_domain: str | None = None,
    phases: PhaseMode = "auto",
    *,
    layout: Layout | None = None,
    rank: int | None = None,
    phase_ranges: PhaseRanges | None = None,
) -> KernelReport:
    """The kernel report of the columns: of one process, or with ``layout``
    (:func:`.rank_layout.ranks_of`) a :class:`~.report_types.RankedReport` of its ranks,
    ``rank`` narrowing its tables to one. Raises :class:`.rank_layout.RanksUntold` where
    the columns cannot tell it (no other reading is tried). ``phase_ranges``: the user's
    marks that are the phases (``--phase-ranges``)."""
    if layout is not None:
        check_rank(layout, rank)
    summed = _summed(cols, top, phase, range, phase_domain, phases, layout, phase_ranges)
    if layout is None:
        return scope_report(cols, summed.whole(), summed.categories, top, phase, range)
    entries = _rank_entries(summed, layout, top, phase, range)
    whole = None
    if rank is None:
        whole = scope_report(cols, summed.whole(), summed.categories, top, phase, range)
    return ranked_report(whole, layout, entries, rank)


def check_rank(layout: Layout, rank: int | None) -> None:
    """One line where ``rank`` is none of the layout's ranks."""
    if rank is not None and rank not in [p["rank"] for p in layout.info]:
        known = ", ".join(str(p["rank"]) for p in layout.info) or "none"
        raise BadInput(f"no rank {rank} in this trace; ranks: {known}")


def ranked_report(
    whole: KernelReport | None, layout: Layout, entries: list[RankEntry], rank: int | None
) -> RankedReport:
    """The ranked report of the ranks' entries (in layout order): the whole trace's tables
    (``whole``), or with ``rank`` that rank's, its steps and its ranks."""
    chosen = [e for e in entries if rank is None or e.info["rank"] == rank]
    report_of_all = chosen[0].report if rank is not None else whole
    assert report_of_all is not None, "the whole trace's report, or a rank's"
    fields = KernelReport.__dataclass_fields__
    report = RankedReport(**{f: getattr(report_of_all, f) for f in fields})
    report.source = {**report_of_all.source, "ranks": len(layout.info), "rank": rank}
    report.ranks = chosen
    report.every_rank = [dict(info) for info in layout.info]
    report.steps = step_table([e.steps for e in entries])
    report.world_size = max([p.get("world_size") or 0 for p in layout.info] + [len(layout.info)])
    return report


def rank_entries(
    cols: ActivityColumns,
    layout: Layout,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    phases: PhaseMode = "auto",
    phase_ranges: PhaseRanges | None = None,
) -> tuple[list[RankEntry], pd.DataFrame, FileWhole]:
    """The ranks' entries of :func:`analyze_columns`, the whole trace's phase table and its
    share of its job's whole-trace tables (:mod:`.job_scope`), without the whole trace's
    own tables and steps: what a node of a job analysed alone gives (:mod:`.node_parts`;
    the job's own tables are made from every node's)."""
    summed = _summed(cols, top, phase, range, None, phases, layout, phase_ranges, counts=True)
    entries = _rank_entries(summed, layout, top, phase, range)
    first = int(layout.info[0]["pid"]) if layout.info else 0
    chosen = summed.selection.phase_of_rank
    share = FileWhole.of(cols, summed.plan, summed.sums, summed.by_range, first, chosen)
    return entries, scope_phases(cols, summed.whole(), phase), share


@dataclass
class _Summed:
    """The columns' sums as a query (its phase, range) keeps them, by rank."""

    cols: ActivityColumns
    plan: Plan
    views: list[RankView]
    att: _Attribution
    labels: np.ndarray
    selection: Selection
    sums: Sums
    by_range: np.ndarray
    categories: np.ndarray

    def whole(self) -> Scope:
        return whole_scope(self.cols, self.plan, self.sums, self.by_range, self.labels)


def _summed(
    cols: ActivityColumns,
    top: int,
    phase: str | None,
    range: str | None,
    phase_domain: str | None,
    phases: PhaseMode,
    layout: Layout | None,
    phase_ranges: PhaseRanges | None,
    *,
    counts: bool = False,
) -> _Summed:
    """The plan, the ranks' views and the sums of what ``phase``/``range`` keep, each
    refusal one line. ``counts``: the statistics with their duration counts (the sums kept
    with the columns have none)."""
    check_options(top, phases)
    plan = plan_of(cols, phase_domain, phases, phase_ranges)
    views = [RankView.whole(cols, plan)] if layout is None else rank_views(cols, plan, layout)
    rank_of, infos = (None, None) if layout is None else (layout.rank, layout.info)
    att = _Attribution(cols, plan)
    labels = range_labels(cols.ranges)
    whole = None
    if range is None and not counts:
        whole = kept_sums(cols, plan, infos)
        # One rank answers --phase with its share of every activity's sums; ranks add the
        # phase up again, so adding everything up (and sorting it) first would be wasted.
        if whole is None and (layout is None or phase is None):
            whole = whole_trace_sums(cols, plan, rank_of, infos)
    selection = _selection(cols, plan, att, layout, views, labels, whole, phase, range)
    if whole is not None and selection.everything:
        sums = whole
    elif whole is not None and layout is None and whole.slot_phase is not None:
        assert selection.phase_of_rank is not None
        sums = whole.restricted(int(selection.phase_of_rank[0]))
    else:  # slots mix phases (several processes), or --range: add these activities up
        sums = with_stats(cols, plan, att.arrays, selection, rank_of, len(views), counts)
    for r, view in enumerate(views):
        elsewhere = np.flatnonzero((view.to_local < 0) & (sums.seen[r] > 0))
        if len(elsewhere):
            name = plan.phase_names[int(elsewhere[0])]
            raise RanksUntold(f"rank {r}: {ACTIVITY_ELSEWHERE} ({name!r})")
    by_range = sums.by_range(plan)
    categories = name_codes(cols)[1]
    return _Summed(cols, plan, views, att, labels, selection, sums, by_range, categories)


class _Attribution:
    """The attribution's arrays, computed (or read from the columns) when first asked for:
    a query answered from the kept sums needs none."""

    def __init__(self, cols: ActivityColumns, plan: Plan) -> None:
        self.cols, self.plan = cols, plan
        self._arrays: Mapping[str, np.ndarray] | None = None

    @property
    def arrays(self) -> Mapping[str, np.ndarray]:
        if self._arrays is None:
            self._arrays = attributed(self.cols, self.plan)
        return self._arrays


def _selection(
    cols: ActivityColumns,
    plan: Plan,
    att: _Attribution,
    layout: Layout | None,
    views: list[RankView],
    labels: np.ndarray,
    whole: Sums | None,
    phase: str | None,
    range_: str | None,
) -> Selection:
    """What ``--phase`` and ``--range`` keep, checked rank by rank then for the whole
    trace, each refusal one line."""
    selection = Selection()
    n_phases = len(plan.phase_names)
    rows = np.zeros(0, dtype=np.int64)
    if range_ is not None:
        names = cols.ranges["name"].to_numpy(dtype=object)
        rows = np.flatnonzero((labels == range_) | (names == range_))
    range_rank = np.zeros(len(cols.ranges), np.int64) if layout is None else layout.range_rank
    seen = np.zeros((len(views), n_phases), np.int64)
    if phase is not None:
        rank_of = None if layout is None else layout.rank
        seen = whole.seen if whole is not None else _seen(cols, att, rank_of, len(views), n_phases)
    chosen = np.full(len(views), -1, dtype=np.int64)
    for r, view in enumerate(views):
        if phase is not None:
            index = phase_index(view.names, bool(seen[r, -1]), phase)
            chosen[r] = plan.phase_names.index(view.names[index])
        if range_ is not None and not (range_rank[rows] == r).any():
            raise no_range(range_, labels[view.range_rows])
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
    cols: ActivityColumns, att: _Attribution, rank: np.ndarray | None, n_ranks: int, n_phases: int
) -> np.ndarray:
    """(rank, phase): how many activities, every one counted."""
    seen = np.zeros(n_ranks * n_phases, dtype=np.int64)
    phase_of = att.arrays["phase"]

    def chunk(lo: int, hi: int) -> np.ndarray:
        r = 0 if rank is None else rank[lo:hi].astype(np.int64)
        return np.bincount(r * n_phases + phase_of[lo:hi], minlength=len(seen))

    for part in map_chunks(chunk, len(cols), chunked.CHUNK):
        seen += part
    return seen.reshape(n_ranks, n_phases)


def _rank_entries(
    summed: _Summed, layout: Layout, top: int, phase: str | None, range_: str | None
) -> list[RankEntry]:
    """Each rank's entry: its report, its NCCL overlap and its steps (the second pass)."""
    cols, plan, sums = summed.cols, summed.plan, summed.sums
    scopes = [
        rank_scope(cols, plan, sums, v, r, summed.by_range, summed.labels)
        for r, v in enumerate(summed.views)
    ]
    reports = [scope_report(cols, s, summed.categories, top, phase, range_) for s in scopes]
    kernel_name = name_codes(cols)[0] == KERNEL
    names = np.array(cols.names, dtype=object)
    nccl_name = kernel_name & is_nccl(names)
    starts = [_first_steps(s, rep) for s, rep in zip(scopes, reports, strict=True)]
    arrays = {} if summed.selection.everything else summed.att.arrays
    unions = nccl_unions(sums.nccl)
    found = second_pass(
        cols, layout.rank, arrays, summed.selection, kernel_name & ~nccl_name, unions, starts
    )
    entries = []
    for r, (info, report) in enumerate(zip(layout.info, reports, strict=True)):
        comm = rank_comm(sums.nccl, r, found, names)
        read = kernels_reader(cols, layout.rank, r, starts[r], kernel_name, nccl_name)
        steps = rank_steps(r, sums.nccl, found, starts, read)
        totals = {key: report.totals[key] for key in ("kernels", "kernel_time_ms", "gpu_time_ms")}
        entries.append(RankEntry(info, report, comm, totals, steps))
    return entries


def _first_steps(scope: Scope, report: KernelReport) -> np.ndarray:
    """Step starts: the instances of the first phase of the rank's phase table, ranges
    under the names the plan gave them (a ``truth:forward`` mark, or one ``--phase-ranges``
    maps, is a ``forward``)."""
    phases = [p for p in report.phases["phase"] if p != UNATTRIBUTED]
    ranges = scope.ranges
    if scope.range_names is not None:
        ranges = ranges.assign(name=scope.range_names)
    return step_starts(ranges, phases[0] if phases else "")
