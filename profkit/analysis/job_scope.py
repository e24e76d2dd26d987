"""A job's whole-trace report from its files' shares: the reduce of a job read on Dask
workers (:mod:`.node_parts`) makes the job's own tables without its activities.

Each file, analysed alone where it lies, keeps what its whole-trace scope adds up to
(:class:`FileWhole`): its sums per (phase, category) and per range, the notes' counts,
its phases as its own plan names them and its kernel statistics' share
(:class:`.job_stats.FileStats`). The job's phases are its files' (:func:`job_phases`: the
phase ranges' names in join order, then the inferred phases, as one plan of the joined
files orders them), and its scope (:func:`job_scope`) is its files' added up under those
names: what one process attributing the joined activities adds up, since an activity's
phase and ranges are its own process's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit.analysis.attribution import Plan
from profkit.analysis.categories import CATEGORIES
from profkit.analysis.inference import TraceHints, autograd_threads
from profkit.analysis.job_stats import FileStats, job_stats
from profkit.analysis.phase_marks import PhaseRanges
from profkit.analysis.phase_ranges import default_phase_domain, ordered_phase_names
from profkit.analysis.rank_layout import RanksUntold
from profkit.analysis.report_tables import Scope
from profkit.analysis.selection import phase_index, range_labels
from profkit.analysis.sums import QUANTITIES, Sums
from profkit.traces.columns import ActivityColumns
from profkit.traces.schema import PROCESS_SHIFT
from profkit.workload.names import PHASES


@dataclass
class FileWhole:
    """One file's whole-trace scope as its job adds it up: in its own phase codes (those
    of ``stats.phases``), its thread ids as its own join numbered them (its first rank's
    process key: ``first_process``)."""

    stats: FileStats
    by_phase_category: np.ndarray
    by_range: np.ndarray
    is_phase: np.ndarray
    range_names: np.ndarray | None
    moved: np.ndarray
    same: np.ndarray
    unlaunched: np.ndarray
    workers: np.ndarray
    owners: list[int]
    inferred: int
    inferred_spans: dict[str, tuple[int, int]]
    closures: int
    phase_source: str
    first_process: int
    chosen: list[tuple[int, int]]
    """With ``--phase``: per rank, the phase it took for it (its code here) and how many
    activities that phase holds, selected or not (the job checks every rank took one)."""
    unattributed_seen: bool

    @classmethod
    def of(
        cls,
        cols: ActivityColumns,
        plan: Plan,
        sums: Sums,
        by_range: np.ndarray,
        first: int,
        chosen: np.ndarray | None,
    ) -> FileWhole:
        """A file's, from its plan and its sums (statistics with their counts); ``chosen``:
        with ``--phase``, the phase code each rank took."""
        assert sums.stats is not None
        n = len(plan.phase_names)
        seen = sums.seen.reshape(-1, n)
        taken = [] if chosen is None else [(int(c), int(seen[r, c])) for r, c in enumerate(chosen)]
        return cls(
            stats=FileStats.of(cols.names, plan, sums.stats),
            by_phase_category=sums.by_phase_category.sum(axis=0),
            by_range=by_range,
            is_phase=plan.is_phase,
            range_names=plan.range_names,
            moved=sums.moved.reshape(-1, n).sum(axis=0),
            same=sums.same.reshape(-1, n, n).sum(axis=0),
            unlaunched=sums.unlaunched.reshape(-1, n).sum(axis=0),
            workers=sums.workers,
            owners=sorted(set(plan.owners.values())),
            inferred=int(sums.inferred.sum()),
            inferred_spans=dict(plan.inferred_spans),
            closures=plan.closures,
            phase_source=plan.phase_source,
            first_process=first,
            chosen=taken,
            unattributed_seen=bool(seen[:, -1].any()),
        )


def job_phases(files: list[FileStats]) -> tuple[list[str], np.ndarray]:
    """The job's phase names (``unattributed`` last) and each ``PHASES`` index's code among
    them, from its files' (in join order)."""
    annotated = list(dict.fromkeys(n for f in files for n in f.phases[: f.annotated]))
    present = sorted({c for f in files for c, own in enumerate(f.remap[: len(PHASES)]) if own >= 0})
    return ordered_phase_names(annotated, np.array(present, dtype=np.int64))


def check_phase(files: list[FileWhole], phase: str | None) -> None:
    """One line where ``--phase`` is no phase of the job, or where ranks took it under
    names that differ (in case only: each rank alone accepts its own spelling), as one
    process checking the joined files' ranks says it."""
    if phase is None:
        return
    names, remap = job_phases([f.stats for f in files])
    index = phase_index(names, any(f.unattributed_seen for f in files), phase)
    r = 0
    for f in files:
        code = f.stats.phase_codes(names, remap)
        for own, seen in f.chosen:
            if code[own] != index and seen > 0:
                raise RanksUntold(
                    f"--phase {phase!r} is {names[index]!r} in the trace but "
                    f"{names[code[own]]!r} on rank {r}: give the phase as it is spelled on "
                    "every rank"
                )
            r += 1


def job_scope(
    cols: ActivityColumns,
    files: list[FileWhole],
    first_processes: list[int],
    phase_ranges: PhaseRanges | None,
) -> Scope:
    """The job's whole-trace scope: its files' (in join order) added up. ``cols``: the
    joined files' names, threads, ranges and meta (no activity is read);
    ``first_processes``: each file's first rank's process key in the join."""
    names, remap = job_phases([f.stats for f in files])
    n = len(names)
    n_categories = len(CATEGORIES)
    by_pc = np.zeros((n * n_categories, len(QUANTITIES)), np.int64)
    moved, unlaunched = np.zeros(n, np.int64), np.zeros(n, np.int64)
    same = np.zeros((n, n), np.int64)
    workers = np.zeros((n, len(cols.threads)), dtype=bool)
    owners: list[int] = []
    spans: dict[str, tuple[int, int]] = {}
    thread_at = 0
    for f, process in zip(files, first_processes, strict=True):
        code = f.stats.phase_codes(names, remap)
        rows = (code[:, None] * n_categories + np.arange(n_categories)).reshape(-1)
        np.add.at(by_pc, rows, f.by_phase_category)
        np.add.at(moved, code, f.moved)
        np.add.at(unlaunched, code, f.unlaunched)
        np.add.at(same, (code[:, None], code[None, :]), f.same)
        own_threads = f.workers.shape[1]
        workers[code, thread_at : thread_at + own_threads] |= f.workers  # codes distinct
        thread_at += own_threads
        shift = (process - f.first_process) << PROCESS_SHIFT
        owners += [t + shift for t in f.owners]
        for name, (instances, wall) in f.inferred_spans.items():
            job_name = names[code[f.stats.phases.index(name)]]
            had = spans.get(job_name, (0, 0))
            spans[job_name] = (had[0] + instances, had[1] + wall)
    inferred = sum(f.inferred for f in files)
    ranges = cols.ranges
    return Scope(
        names=names,
        by_phase_category=by_pc,
        by_range=np.concatenate([f.by_range for f in files]),
        ranges=ranges,
        labels=range_labels(ranges),
        is_phase=np.concatenate([f.is_phase for f in files]),
        stats=job_stats([f.stats for f in files], cols.names, names, remap).whole(),
        moved=moved,
        same=same,
        unlaunched=unlaunched,
        workers=workers,
        owners={t: t for t in dict.fromkeys(owners)},
        phase_source=_source([f.phase_source for f in files]),
        inferred_spans=spans,
        inferred=inferred,
        autograd_threads=autograd_threads(TraceHints.of(cols.meta), ranges)
        if inferred
        else np.zeros(0, np.int64),
        domain=default_phase_domain(ranges)
        if phase_ranges is None
        else f"--phase-ranges {phase_ranges}",
        closures=sum(f.closures for f in files),
        range_names=_range_names(files, ranges),
    )


def _source(sources: list[str]) -> str:
    """Where the job's phases came from: its files' one source, or ``mixed``."""
    found = set(sources)
    return found.pop() if len(found) == 1 else "mixed"


def _range_names(files: list[FileWhole], ranges: pd.DataFrame) -> np.ndarray | None:
    """Each range's name as a phase, where some file's plan renamed its ranges (the others'
    keep their own; None where none did)."""
    if all(f.range_names is None for f in files):
        return None
    names = ranges["name"].to_numpy(dtype=object).copy()
    at = 0
    for f in files:
        if f.range_names is not None:
            names[at : at + len(f.is_phase)] = f.range_names
        at += len(f.is_phase)
    return names
