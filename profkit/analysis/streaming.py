"""The kernel report of :class:`~profkit.traces.columns.ActivityColumns`, in bounded memory.

:func:`analyze_columns` gives the same :class:`~profkit.analysis.report.KernelReport` as
:func:`~profkit.analysis.report.analyze` (tests compare them table by table), without a
per-activity frame, in three steps, the first two kept with the columns (and so in the
cache) once computed:

1. attribution (:mod:`.stream_attribution`): each activity's phase and the slots of its
   attribution points, chunk by chunk against the ranges, which are few;
2. sums per phase (:mod:`.stream_sums`): counts and ns per (phase, category) and per
   slot, the notes' counts, and the per-kernel statistics from one sorted int64 array of
   ``group << 40 | duration`` per table (:mod:`.stream_tables`); ``--phase`` keeps one
   phase's share of the whole trace's sums, ``--range`` adds up its activities again;
3. the tables and notes, from the sums.

Memory: the columns, the attribution (12 bytes an activity), the sorted keys (8 bytes),
and chunk-sized temporaries. A repeated query of a cached trace without ``--range`` reads
the kept sums and touches no per-activity array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from profkit.analysis import stream_tables as tables
from profkit.analysis.attribution import UNATTRIBUTED, PhaseMode, inference_sentence
from profkit.analysis.categories import CATEGORIES
from profkit.analysis.report_types import KernelReport, run_config, source_of
from profkit.analysis.selection import check_options, no_range, phase_index, range_labels
from profkit.analysis.stream_attribution import Plan, attributed, attribution_identity, plan_of
from profkit.analysis.stream_sums import KEPT_AS, VERSION, Selection, Sums, add_up, name_codes
from profkit.traces.columns import ActivityColumns
from profkit.traces.schema import KINDS


def analyze_columns(
    cols: ActivityColumns,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    phase_domain: str | None = None,
    phases: PhaseMode = "auto",
) -> KernelReport:
    """:func:`~profkit.analysis.report.analyze` for compact columns (the same report)."""
    check_options(top, phases)
    plan = plan_of(cols, phase_domain, phases)
    labels = range_labels(cols.ranges)
    selection = Selection()
    if range is not None:
        names = cols.ranges["name"].to_numpy(dtype=object)
        rows = np.flatnonzero((labels == range) | (names == range))
        if not len(rows):
            raise no_range(range, labels)
        selection.inside = plan.slots_inside(plan.range_start[rows], plan.range_end[rows])
    sums = whole_trace_sums(cols, plan) if range is None else None
    if sums is None:
        sums = add_up(cols, plan, attributed(cols, plan), selection)
    if phase is not None:  # the same check and message as analyze()
        index = phase_index(plan.phase_names, sums.unattributed_seen, phase)
        if sums.slot_phase is not None:
            sums = sums.restricted(index)
        else:  # slots mix phases (several processes): add this phase's activities up
            selection.phase = index
            sums = add_up(cols, plan, attributed(cols, plan), selection)
    report = _report(cols, plan, sums, labels, top, phase, range)
    report.source["phase_source"] = plan.phase_source
    return report


def whole_trace_sums(cols: ActivityColumns, plan: Plan) -> Sums:
    """The sums of every activity: kept with the columns, or added up and kept."""
    identity = {"version": VERSION, "attribution": attribution_identity(cols, plan)}
    kept = cols.derived.get(KEPT_AS)
    found = Sums.from_kept(kept, identity) if kept is not None else None
    if found is None:
        found = add_up(cols, plan, attributed(cols, plan), Selection())
        cols.remember(KEPT_AS, found.kept(identity))
    return found


def _report(
    cols: ActivityColumns,
    plan: Plan,
    sums: Sums,
    labels: np.ndarray,
    top: int,
    phase: str | None,
    range_: str | None,
) -> KernelReport:
    n_phases = len(plan.phase_names)
    by_phase = sums.by_phase_category.reshape(n_phases, len(CATEGORIES), -1).sum(axis=1)
    sidecar = cols.meta.get("sidecar") or {}
    config = run_config(sidecar, cols.meta)
    _, categories = name_codes(cols)
    stats = (sums.per_phase, sums.overall)
    per_phase, overall = tables.kernel_tables(stats, cols, categories, plan.phase_names)
    report = KernelReport(
        source=source_of(cols.meta, phase, range_, top, config),
        totals=tables.totals_of(sums.by_phase_category),
        phases=tables.phase_table(
            by_phase, plan.phase_names, plan.phase_spans(cols.ranges), sidecar, phase is not None
        ),
        ranges=tables.range_table(
            sums.by_range(plan), cols.ranges, labels, config, range_ or phase
        ),
        kernels=per_phase,
        overall=overall,
        categories=tables.category_table(sums.by_phase_category, plan.phase_names),
        top=top,
    )
    in_phase = by_phase[:, : len(KINDS)].sum(axis=1)
    inferred = inference_sentence(
        int(sums.inferred.sum()), plan.phase_source, plan.autograd_threads, cols.meta
    )
    report.notes = _notes(sums, cols.threads, plan, in_phase, cols.meta, inferred)
    return report


def _notes(
    sums: Sums,
    threads: np.ndarray,
    plan: Plan,
    in_phase: np.ndarray,
    meta: dict[str, Any],
    inferred: Sequence[str] = (),
) -> list[str]:
    """The sentences :func:`.report._notes` writes, from the sums' counts (``inferred``:
    the note on inferred phases, after the reader's warnings)."""
    notes = list(meta.get("warnings") or []) + list(inferred)
    names = meta.get("thread_names") or {}
    owners = ", ".join(sorted({names.get(t, f"thread {t}") for t in plan.owners.values()}))
    nsys = meta.get("format") == "nsys-sqlite"
    rule = "the rule of Nsight Systems' nvtx_gpu_proj_sum" if nsys else "a same-thread rule"
    same = sums.same.sum(axis=0)
    for index, name in enumerate(plan.phase_names):
        moved = int(sums.moved[index])
        if name == UNATTRIBUTED or not moved:
            continue
        launchers = threads[np.flatnonzero(sums.workers[index])].tolist()
        workers = sorted({names.get(t, f"thread {t}") for t in launchers})
        notes.append(
            f"{name}: {moved:,} of its {int(in_phase[index]):,} GPU activities were "
            f"launched from {', '.join(workers)} and attributed through the ranges open on "
            f"{owners} at launch; the launching thread alone ({rule}) would give it "
            f"{int(same[index]):,}."
        )
    outside, unlaunched = int(in_phase[-1]), int(sums.unlaunched.sum())
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
