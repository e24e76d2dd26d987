"""A :class:`~.report_types.KernelReport` from the sums of one scope.

A *scope* is what one report is made of: the whole trace's sums (:func:`whole_scope`), or
one rank's share of them with its phases renumbered as the rank alone numbers them
(:func:`rank_scope`). :func:`scope_report` makes every table and note of a scope, the same
tables, columns and order as :mod:`profkit.analysis.tables` builds from a per-activity frame
(tests compare them), from a row of ``QUANTITIES`` per phase × category and per range
(:mod:`.sums`) and the kernel statistics (:mod:`.kernel_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.attribution import Plan
from profkit.analysis.categories import CATEGORIES
from profkit.analysis.frameworks import phase_story
from profkit.analysis.phase_ranges import UNATTRIBUTED, inference_sentence
from profkit.analysis.rank_layout import ACTIVITY_ELSEWHERE, RanksUntold, RankView
from profkit.analysis.report_types import KernelReport, run_config, source_of
from profkit.analysis.sums import QUANTITIES, Sums
from profkit.analysis.tables import (
    COUNT_COLUMNS,
    NS_PER_MS,
    count_columns,
    labelled_kernel_tables,
    phases_from_counts,
    ranges_from_counts,
)
from profkit.traces.columns import ActivityColumns
from profkit.traces.schema import KINDS


@dataclass
class Scope:
    """What one report (a rank's, or the whole trace's) is made of, in its phase codes."""

    names: list[str]  # its phases, ``unattributed`` last
    by_phase_category: np.ndarray  # (phases × categories, QUANTITIES)
    by_range: np.ndarray  # (its ranges, QUANTITIES)
    ranges: pd.DataFrame
    labels: np.ndarray
    is_phase: np.ndarray  # per range: a phase range
    stats: tuple[pd.DataFrame, pd.DataFrame]  # kernel statistics per (name, phase), per name
    moved: np.ndarray  # per phase: attributed through the owner thread
    same: np.ndarray  # (phase, the launching thread's own phase)
    unlaunched: np.ndarray  # per phase
    workers: np.ndarray  # (phase, thread code): threads that launched moved activities
    owners: dict[int, int]
    phase_source: str = "annotated"
    inferred_spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per inferred phase name: instances and summed launch spans (ns)."""
    inferred: int = 0
    """Activities whose phase was inferred."""
    autograd_threads: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    domain: str = ""
    """The plan's phase domain (``--phase-ranges ...`` where the user's marks were mapped)."""
    closures: int = 0
    """Forward/backward passes the inference found inside ``Optimizer.step`` ranges."""
    range_names: np.ndarray | None = None
    """Per range, its name as a phase where the plan renamed ranges (else None)."""


def whole_scope(
    cols: ActivityColumns, plan: Plan, sums: Sums, by_range: np.ndarray, labels: np.ndarray
) -> Scope:
    """The whole trace: every rank's sums added."""
    assert sums.stats is not None
    return Scope(
        names=plan.phase_names,
        by_phase_category=sums.by_phase_category.sum(axis=0),
        by_range=by_range,
        ranges=cols.ranges,
        labels=labels,
        is_phase=plan.is_phase,
        stats=sums.stats.whole(),
        moved=sums.moved.sum(axis=0),
        same=sums.same.sum(axis=0),
        unlaunched=sums.unlaunched.sum(axis=0),
        workers=sums.workers,
        owners=plan.owners,
        phase_source=plan.phase_source,
        inferred_spans=plan.inferred_spans,
        inferred=int(sums.inferred.sum()),
        autograd_threads=plan.autograd_threads,
        domain=plan.domain,
        closures=plan.closures,
        range_names=plan.range_names,
    )


def rank_scope(
    cols: ActivityColumns,
    plan: Plan,
    sums: Sums,
    view: RankView,
    r: int,
    by_range: np.ndarray,
    labels: np.ndarray,
) -> Scope:
    """Rank ``r``'s share (``view``: what it alone would call its phases and ranges)."""
    n_local, to_local = len(view.names), view.to_local
    assert sums.stats is not None
    by_pc = sums.by_phase_category[r].reshape(len(plan.phase_names), -1)
    workers = (sums.workers & view.threads[None, :]).astype(np.int64)
    return Scope(
        names=view.names,
        by_phase_category=_local(by_pc, to_local, n_local).reshape(-1, len(QUANTITIES)),
        by_range=by_range[view.range_rows],
        ranges=cols.ranges.iloc[view.range_rows].reset_index(drop=True),
        labels=labels[view.range_rows],
        is_phase=plan.is_phase[view.range_rows],
        stats=sums.stats.of_rank(r, to_local),
        moved=_local(sums.moved[r], to_local, n_local),
        same=_local(_local(sums.same[r], to_local, n_local).T, to_local, n_local).T,
        unlaunched=_local(sums.unlaunched[r], to_local, n_local),
        workers=_local(workers, to_local, n_local) > 0,
        owners=view.owners,
        phase_source=view.phase_source,
        inferred_spans=view.inferred_spans,
        inferred=int(sums.inferred[r].sum()),
        autograd_threads=plan.autograd_threads,
        domain=plan.domain,
        closures=plan.closures,
        range_names=None if plan.range_names is None else plan.range_names[view.range_rows],
    )


def _local(values: np.ndarray, to_local: np.ndarray, n_local: int) -> np.ndarray:
    """Rows indexed by whole-trace phase codes, added up by the rank's phase codes."""
    keep = to_local >= 0
    if (values[~keep] != 0).any():
        raise RanksUntold(ACTIVITY_ELSEWHERE)
    out = np.zeros((n_local, *values.shape[1:]), dtype=values.dtype)
    np.add.at(out, to_local[keep], values[keep])
    return out


def scope_report(
    cols: ActivityColumns,
    scope: Scope,
    categories: np.ndarray,
    top: int,
    phase: str | None,
    range_: str | None,
) -> KernelReport:
    """Every table and note of a scope's report (``categories``: per name code, the index
    of its category, :func:`.sums.name_codes`)."""
    by_phase = _by_phase(scope)
    sidecar = cols.meta.get("sidecar") or {}
    config = run_config(sidecar, cols.meta)
    source = {**query_source(cols.meta, phase, range_, top), "phase_source": scope.phase_source}
    per_phase, overall = kernel_tables(scope.stats, cols, categories, scope.names)
    report = KernelReport(
        source=source,
        totals=totals_of(scope.by_phase_category),
        phases=scope_phases(cols, scope, phase, by_phase),
        ranges=range_table(scope.by_range, scope.ranges, scope.labels, config, range_ or phase),
        kernels=per_phase,
        overall=overall,
        categories=category_table(scope.by_phase_category, scope.names),
        top=top,
    )
    report.notes = notes(scope, cols.threads, by_phase[:, : len(KINDS)].sum(axis=1), cols.meta)
    story = phase_story(
        per_phase,
        report.phases,
        scope.ranges[scope.is_phase],
        scope.phase_source,
        scope.domain,
        scope.closures,
    )
    report.source["phases_from"] = story.phases_from
    report.source["patterns"] = story.patterns
    said = [] if scope.phase_source == "inferred" else [story.phases_from]  # else: notes' own
    report.notes = [*said, *story.notes, *report.notes]
    return report


def scope_phases(
    cols: ActivityColumns, scope: Scope, phase: str | None, by_phase: np.ndarray | None = None
) -> pd.DataFrame:
    """The scope's phase table alone (:func:`scope_report`'s ``phases``)."""
    by_phase = _by_phase(scope) if by_phase is None else by_phase
    instances, wall = range_spans(phase_ranges_of(scope))
    extra = pd.DataFrame.from_dict(scope.inferred_spans, orient="index",
                                   columns=["instances", "wall"])  # fmt: skip
    spans = (
        instances.add(extra["instances"], fill_value=0).astype(np.int64),
        wall.add(extra["wall"], fill_value=0),
    )
    sidecar = cols.meta.get("sidecar") or {}
    return phase_table(by_phase, scope.names, spans, sidecar, phase is not None)


def _by_phase(scope: Scope) -> np.ndarray:
    """(phase, QUANTITIES): the scope's sums over categories."""
    n = len(scope.names)
    return scope.by_phase_category.reshape(n, len(CATEGORIES), -1).sum(axis=1)


def query_source(
    meta: dict[str, Any], phase: str | None, range_: str | None, top: int
) -> dict[str, Any]:
    """What a report's ``source`` says of its trace (its meta and run config) and query."""
    return source_of(meta, phase, range_, top, run_config(meta.get("sidecar") or {}, meta))


def notes(
    scope: Scope, threads: np.ndarray, in_phase: np.ndarray, meta: dict[str, Any]
) -> list[str]:
    """Plain sentences on how a scope's activities were attributed (for humans, not the
    JSON): the reader's warnings, the inferred phases, activities attributed through
    another thread's ranges, and those outside every phase or without a launch call."""
    notes = list(meta.get("warnings") or [])
    notes += inference_sentence(scope.inferred, scope.phase_source, scope.autograd_threads, meta)
    names = meta.get("thread_names") or {}
    owners = ", ".join(sorted({names.get(t, f"thread {t}") for t in scope.owners.values()}))
    nsys = meta.get("format") == "nsys-sqlite"
    rule = "the rule of Nsight Systems' nvtx_gpu_proj_sum" if nsys else "a same-thread rule"
    same = scope.same.sum(axis=0)
    for index, name in enumerate(scope.names):
        moved = int(scope.moved[index])
        if name == UNATTRIBUTED or not moved:
            continue
        launchers = threads[np.flatnonzero(scope.workers[index])].tolist()
        workers = sorted({names.get(t, f"thread {t}") for t in launchers})
        notes.append(
            f"{name}: {moved:,} of its {int(in_phase[index]):,} GPU activities were "
            f"launched from {', '.join(workers)} and attributed through the ranges open on "
            f"{owners} at launch; the launching thread alone ({rule}) would give it "
            f"{int(same[index]):,}."
        )
    outside, unlaunched = int(in_phase[-1]), int(scope.unlaunched.sum())
    if outside > unlaunched:
        notes.append(
            f"{outside - unlaunched:,} GPU activities were launched outside every phase "
            "range (unattributed)."
        )
    if unlaunched:
        notes.append(
            f"{unlaunched:,} GPU activities have no launch call in the trace (their API "
            "call was not traced): they are unattributed and in no range."
        )
    return notes


def counts(sums: np.ndarray, rows: np.ndarray | slice = slice(None)) -> dict[str, np.ndarray]:
    """Per row of QUANTITIES sums: a count column per kind (``graphs`` only where some
    graph was counted), then ``kernel_ns`` and ``gpu_ns``."""
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
    spans: tuple[pd.Series, pd.Series],
    sidecar: dict[str, Any],
    filtered: bool,
) -> pd.DataFrame:
    """Activities of each kind, kernel and GPU time, share per phase; wall and Python time,
    from per-phase sums; ``spans``: per phase name, its
    instances and wall ns."""
    found = counts(by_phase)
    instances, cpu_ns = spans
    active = by_phase[:, : len(KINDS)].sum(axis=1) > 0
    return phases_from_counts(phase_names, found, instances, cpu_ns, active, sidecar, filtered)


def phase_ranges_of(scope: Scope) -> pd.DataFrame:
    """The scope's phase ranges, each under its phase's name."""
    found = scope.ranges[scope.is_phase]
    if scope.range_names is None:
        return found
    return found.assign(name=scope.range_names[scope.is_phase])


def range_spans(phase_ranges: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per phase name: how many of ``phase_ranges`` it has, and their summed wall ns."""
    wall = (phase_ranges["end"] - phase_ranges["start"]).groupby(phase_ranges["name"]).sum()
    return phase_ranges.groupby("name").size(), wall


def range_table(
    by_range: np.ndarray,
    ranges: pd.DataFrame,
    labels: np.ndarray,
    config: dict[str, Any] | None,
    filtered: str | None,
) -> pd.DataFrame:
    """Activities and times per range name and domain (:func:`.tables.ranges_from_counts`),
    from per-range sums."""
    found = counts(by_range)
    columns = {c: found[c] for c in found if c not in ("kernel_ns", "gpu_ns")}
    columns["kernel_ns"] = by_range[:, len(KINDS)]
    columns["gpu_ns"] = by_range[:, len(KINDS) + 1]
    return ranges_from_counts(columns, ranges, labels, config, filtered)


def category_table(by_phase_category: np.ndarray, phase_names: list[str]) -> pd.DataFrame:
    """Activities and GPU time per (phase, category), each phase's categories by time, from
    per (phase, category) sums."""
    n_categories = len(CATEGORIES)
    present = np.flatnonzero(by_phase_category[:, : len(KINDS)].sum(axis=1))
    phase, category = present // n_categories, present % n_categories
    found = counts(by_phase_category)
    gpu_ns = found["gpu_ns"][present]
    phase_total = np.bincount(phase, weights=gpu_ns, minlength=len(phase_names))
    columns = count_columns(found, present)
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


def kernel_tables(
    stats: tuple[pd.DataFrame, pd.DataFrame],
    cols: ActivityColumns,
    categories: np.ndarray,
    phase_names: list[str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (name, phase) and per name statistics, with the launch shape of the longest run,
    from a scope's statistics (by name and phase code)."""
    names = np.array(cols.names, dtype=object)
    kinds = np.array(cols.kinds, dtype=object)
    per_phase, overall = (table.copy() for table in stats)
    labels = np.array(phase_names, dtype=object)
    category_names = np.array(CATEGORIES, dtype=object)[categories]
    return labelled_kernel_tables(per_phase, overall, names, category_names, kinds, labels)
