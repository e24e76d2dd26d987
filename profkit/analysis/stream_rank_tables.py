"""The tables of each rank and of the whole trace, from :mod:`.stream_rank_sums`' sums.

A *scope* is what one report is made of: the whole trace's sums, or a rank's share of them
with its phases renumbered as the rank alone numbers them (:func:`rank_scope`).
:func:`scope_report` makes the report's tables as :func:`.streaming.analyze_columns` does
for one process; :class:`StatFrames` holds the kernel statistics of every rank and of the
whole trace, each row with the launch shape of its group's first longest activity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis import stream_tables as tables
from profkit.analysis.attribution import UNATTRIBUTED, inference_sentence
from profkit.analysis.categories import CATEGORIES
from profkit.analysis.report_types import KernelReport, run_config, source_of
from profkit.analysis.steps import step_starts
from profkit.analysis.stream_attribution import Plan
from profkit.analysis.stream_rank_stats import (
    KernelStatistics,
    Stats,
    coarse_longest,
    first_longest,
)
from profkit.analysis.stream_rank_sums import RankSums
from profkit.analysis.stream_stats import STAT_COLUMNS
from profkit.analysis.stream_sums import QUANTITIES
from profkit.analysis.streaming import _notes
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns
from profkit.traces.schema import KINDS


class RanksUntold(BadInput):
    """What the ranked report cannot tell from a trace's columns, said in one line: a rank
    with GPU activity in a phase only another rank marks, say. The attribution works per
    process, so real traces do not do it; no other reading of the trace is tried."""


ACTIVITY_ELSEWHERE = (
    "a rank's GPU activity falls in a phase that only another rank marks: its tables "
    "cannot be split from the other ranks'"
)


@dataclass
class Scope:
    """What one report (a rank's, or the whole trace's) is made of."""

    names: list[str]
    by_phase_category: np.ndarray  # (phases × categories, QUANTITIES)
    by_range: np.ndarray  # (its ranges, QUANTITIES)
    ranges: pd.DataFrame
    labels: np.ndarray
    is_phase: np.ndarray
    notes: SimpleNamespace  # moved, same, unlaunched, workers (as stream_sums.Sums has them)
    owners: dict[int, int]
    phase_source: str = "annotated"
    inferred_spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per inferred phase name: instances and summed launch spans (ns)."""
    inferred: int = 0
    """Activities whose phase was inferred."""
    autograd_threads: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def by_range(sums: RankSums, plan: Plan) -> np.ndarray:
    """(ranges, QUANTITIES) of the whole trace: :meth:`.stream_sums.Sums.by_range`."""
    prefix = np.zeros((len(sums.by_slot) + 1, len(QUANTITIES)), dtype=np.int64)
    np.cumsum(sums.by_slot, axis=0, out=prefix[1:])
    return prefix[plan.slot(plan.range_end)] - prefix[plan.slot(plan.range_start)]


def whole_scope(
    cols: ActivityColumns, plan: Plan, sums: RankSums, ranges_sums: np.ndarray, labels: np.ndarray
) -> Scope:
    """The whole trace: every rank's sums added."""
    n = len(plan.phase_names)
    n_ranks = len(sums.moved) // n
    notes = SimpleNamespace(
        moved=sums.moved.reshape(n_ranks, n).sum(axis=0),
        same=sums.same.reshape(n_ranks, n, n).sum(axis=0),
        unlaunched=sums.unlaunched.reshape(n_ranks, n).sum(axis=0),
        workers=sums.workers,
    )
    by_pc = sums.by_phase_category.reshape(n_ranks, -1, len(QUANTITIES)).sum(axis=0)
    return Scope(plan.phase_names, by_pc, ranges_sums, cols.ranges, labels, plan.is_phase,
                 notes, plan.owners, plan.phase_source, plan.inferred_spans,
                 int(sums.inferred.sum()), plan.autograd_threads)  # fmt: skip


def _local(values: np.ndarray, to_local: np.ndarray, n_local: int) -> np.ndarray:
    """Rows indexed by whole-trace phase codes, added up by the rank's phase codes."""
    keep = to_local >= 0
    if (values[~keep] != 0).any():
        raise RanksUntold(ACTIVITY_ELSEWHERE)
    out = np.zeros((n_local, *values.shape[1:]), dtype=values.dtype)
    np.add.at(out, to_local[keep], values[keep])
    return out


def rank_scope(
    cols: ActivityColumns,
    plan: Plan,
    sums: RankSums,
    view: Any,
    r: int,
    ranges_sums: np.ndarray,
    labels: np.ndarray,
) -> Scope:
    """Rank ``r``'s share (``view``: its :class:`.stream_ranks.RankView`)."""
    n, n_local, to_local = len(plan.phase_names), len(view.names), view.to_local
    n_ranks = len(sums.moved) // n
    by_pc = sums.by_phase_category.reshape(n_ranks, n, -1)[r]
    same = sums.same.reshape(n_ranks, n, n)[r]
    workers = (sums.workers & view.threads[None, :]).astype(np.int64)
    notes = SimpleNamespace(
        moved=_local(sums.moved.reshape(n_ranks, n)[r], to_local, n_local),
        same=_local(_local(same, to_local, n_local).T, to_local, n_local).T,
        unlaunched=_local(sums.unlaunched.reshape(n_ranks, n)[r], to_local, n_local),
        workers=_local(workers, to_local, n_local) > 0,
    )
    return Scope(
        names=view.names,
        by_phase_category=_local(by_pc, to_local, n_local).reshape(-1, len(QUANTITIES)),
        by_range=ranges_sums[view.range_rows],
        ranges=cols.ranges.iloc[view.range_rows].reset_index(drop=True),
        labels=labels[view.range_rows],
        is_phase=plan.is_phase[view.range_rows],
        notes=notes,
        owners=view.owners,
        phase_source=view.phase_source,
        inferred_spans=view.inferred_spans,
        inferred=int(sums.inferred.reshape(n_ranks, n)[r].sum()),
        autograd_threads=plan.autograd_threads,
    )


def scope_report(
    cols: ActivityColumns, scope: Scope, top: int, phase: str | None, range_: str | None
) -> KernelReport:
    """The report of a scope, but its kernel tables (they need the longest activities)."""
    n = len(scope.names)
    by_phase = scope.by_phase_category.reshape(n, len(CATEGORIES), -1).sum(axis=1)
    sidecar = cols.meta.get("sidecar") or {}
    config = run_config(sidecar, cols.meta)
    source = {
        **source_of(cols.meta, phase, range_, top, config),
        "phase_source": scope.phase_source,
    }
    instances, wall = tables.range_spans(scope.ranges[scope.is_phase])
    extra = pd.DataFrame.from_dict(scope.inferred_spans, orient="index",
                                   columns=["instances", "wall"])  # fmt: skip
    spans = (
        instances.add(extra["instances"], fill_value=0).astype(np.int64),
        wall.add(extra["wall"], fill_value=0),
    )
    report = KernelReport(
        source=source,
        totals=tables.totals_of(scope.by_phase_category),
        phases=tables.phase_table(by_phase, scope.names, spans, sidecar, phase is not None),
        ranges=tables.range_table(
            scope.by_range, scope.ranges, scope.labels, config, range_ or phase
        ),
        kernels=pd.DataFrame(),
        overall=pd.DataFrame(),
        categories=tables.category_table(scope.by_phase_category, scope.names),
        top=top,
    )
    in_phase = by_phase[:, : len(KINDS)].sum(axis=1)
    plan_like: Any = SimpleNamespace(owners=scope.owners, phase_names=scope.names)
    inferred = inference_sentence(
        scope.inferred, scope.phase_source, scope.autograd_threads, cols.meta
    )
    report.notes = _notes(scope.notes, cols.threads, plan_like, in_phase, cols.meta, inferred)  # type: ignore[arg-type]
    return report


def first_steps(scope: Scope, report: KernelReport) -> np.ndarray:
    """Step starts as :meth:`.steps.RankSteps.of` takes them: the instances of the first
    phase of the rank's phase table."""
    names = [p for p in report.phases["phase"] if p != UNATTRIBUTED]
    return step_starts(scope.ranges, names[0] if names else "")


@dataclass
class StatFrames:
    """The kernel statistics (``stream_stats.STAT_COLUMNS``, plus ``rank`` where per rank)."""

    rank_phase: pd.DataFrame
    rank_name: pd.DataFrame
    name_phase: pd.DataFrame
    name: pd.DataFrame

    def of_rank(self, r: int, to_local: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Rank ``r``'s per (name, phase) and per name tables, in its own phase codes."""
        per_phase = self.rank_phase[self.rank_phase["rank"] == r].reset_index(drop=True)
        per_phase["phase"] = to_local[per_phase["phase"].to_numpy()]
        overall = self.rank_name[self.rank_name["rank"] == r].reset_index(drop=True)
        return per_phase[STAT_COLUMNS], overall[STAT_COLUMNS]

    def whole(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self.name_phase[STAT_COLUMNS], self.name[STAT_COLUMNS]


def stat_frames(
    cols: ActivityColumns, group: np.ndarray, stats: KernelStatistics, n_ranks: int, n_phases: int
) -> StatFrames:
    """The four tables, each row with its group's first longest activity's shape."""
    n_names = len(cols.names)
    per_rank = n_names * n_phases
    fine = stats.rank_phase
    first = first_longest(cols, group, fine, n_ranks * per_rank)
    longest = [
        first,
        coarse_longest(fine, first, stats.rank_name, lambda g: g // n_phases),
        coarse_longest(fine, first, stats.name_phase, lambda g: g % per_rank),
        coarse_longest(fine, first, stats.name, lambda g: (g % per_rank) // n_phases),
    ]
    rows = np.unique(np.concatenate(longest))
    shape_of = dict(zip(rows.tolist(), cols.shapes_at(rows), strict=True))
    g = [s.group for s in (fine, stats.rank_name, stats.name_phase, stats.name)]
    codes: list[dict[str, Any]] = [
        {"rank": g[0] // per_rank, "name": (g[0] // n_phases) % n_names, "phase": g[0] % n_phases},
        {"rank": g[1] // n_names, "name": g[1] % n_names, "phase": -1},
        {"name": g[2] // n_phases, "phase": g[2] % n_phases},
        {"name": g[3], "phase": -1},
    ]
    frames = [
        _frame(s, c, rows_of, shape_of)
        for s, c, rows_of in zip(
            (fine, stats.rank_name, stats.name_phase, stats.name), codes, longest, strict=True
        )
    ]
    return StatFrames(*frames)


def _frame(
    stats: Stats, codes: dict[str, Any], longest: np.ndarray, shape_of: dict[int, tuple[str, str]]
) -> pd.DataFrame:
    shapes = [shape_of[i] for i in longest.tolist()]
    frame = pd.DataFrame(codes, index=stats.frame.index)
    for column in stats.frame.columns:
        frame[column] = stats.frame[column]
    frame["grid"] = [s for s, _ in shapes]
    frame["block"] = [b for _, b in shapes]
    return frame
