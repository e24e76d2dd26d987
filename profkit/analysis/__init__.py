"""Analysis of traces: attribution of GPU activity to phases and ranges, and the tables.

Analysis never reads files: a command loads its traces once
(:func:`profkit.traces.job.load`) and hands the :class:`~profkit.traces.job.Job` here.
:func:`kernel_report` gives its kernel report (one process's, or per rank for the ranks of
a run, one file or several), :func:`side_by_side` each file's where they are compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from profkit.analysis.categories import CATEGORIES, categorize
from profkit.analysis.names import short_kernel_name
from profkit.analysis.phase_marks import PhaseRanges
from profkit.analysis.phase_ranges import PhaseMode
from profkit.analysis.presentation import display_tables, kernel_report_markdown
from profkit.analysis.report_types import KernelReport
from profkit.errors import BadInput
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT

if TYPE_CHECKING:
    from profkit.analysis.crosscheck import SideBySide
    from profkit.analysis.node_parts import NodeRanks
    from profkit.traces.columns import ActivityColumns
    from profkit.traces.host_calls import HostTrace
    from profkit.traces.job import Job

__all__ = [
    "CATEGORIES",
    "KernelReport",
    "categorize",
    "display_tables",
    "kernel_report",
    "kernel_report_markdown",
    "one_process",
    "short_kernel_name",
    "side_by_side",
]


def kernel_report(
    job: Job,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    rank: int | None = None,
    phases: PhaseMode = "auto",
    consume: bool = False,
    phase_ranges: PhaseRanges | None = None,
    hosts: list[HostTrace] | None = None,
    nodes: list[NodeRanks | None] | None = None,
) -> KernelReport:
    """The kernel report of a loaded job (:func:`profkit.traces.job.load`), from its files'
    compact columns, in bounded memory, phases annotated or inferred (``phases``).

    One trace of one process, a world of one rank: :func:`~.engine.analyze_columns`. One
    trace of several processes, the per-rank traces of one run, several nodes' exports of
    one job: their ranks (:func:`~.rank_layout.ranks_of`), joined where they are several
    files (:mod:`.joins`), give the same analysis's
    :class:`~profkit.analysis.report_types.RankedReport`; ``rank`` narrows its tables to
    one rank.
    ``consume``: a join gives each file's arrays up as it copies them (the job's columns
    are of no further use then). ``phase_ranges``: the user's marks that are the phases
    (``--phase-ranges``). Traces to compare side by side have no one report:
    :func:`side_by_side`. ``hosts`` (:func:`profkit.traces.host_calls.host_traces` of the
    job): the report gets its ``findings`` (:mod:`.findings`). ``nodes``: each file's ranks
    analysed where it lies (:func:`.node_parts.node_ranks`, ``rank_file_ranks``, on Dask
    workers), used where the job is several nodes' exports or per-rank traces and every
    one was analysed; with them, findings are
    made where ``hosts`` is given (any list: the nodes' host findings came with them).
    """
    from profkit.analysis.joins import analyze_node_columns, analyze_rank_file_columns

    report: KernelReport
    if job.kind in ("nodes", "ranks") and nodes is not None and all(n is not None for n in nodes):
        from profkit.analysis.node_parts import Options, join_node_ranks, join_rank_parts

        options = Options(top, phase, range, phases, phase_ranges)
        join = join_node_ranks if job.kind == "nodes" else join_rank_parts
        assert job.reread is not None, "files analysed where they lie: their activities too"
        report, host_found = join(job.files, [n for n in nodes if n], options, rank, job.reread)
        if hosts is not None:
            from profkit.analysis.findings import findings_of

            report.findings, notes, report.gap_marks = findings_of(
                report, job.files, [], host_found
            )
            report.notes.extend(notes)
        return report
    elif job.kind == "ranks":
        report = analyze_rank_file_columns(
            job.files, top, phase, range, rank, consume, phases, phase_ranges
        )
    elif job.kind == "nodes":
        report = analyze_node_columns(
            job.files, top, phase, range, rank, consume, phases, phase_ranges
        )
    elif job.kind != "trace":
        raise ValueError(f"a job of {job.kind} traces has no one report")
    else:
        report = _one_file(job.files[0], top, phase, range, rank, phases, phase_ranges)
    if hosts is not None:
        from profkit.analysis.findings import findings_of

        report.findings, notes, report.gap_marks = findings_of(
            report, job.files, hosts, phase_ranges=phase_ranges
        )
        report.notes.extend(notes)
    return report


def _one_file(
    cols: ActivityColumns,
    top: int,
    phase: str | None,
    range: str | None,
    rank: int | None,
    phases: PhaseMode,
    phase_ranges: PhaseRanges | None = None,
) -> KernelReport:
    """The report of one file's columns: ranked where several of its processes ran GPU
    work (an nsys export of a torchrun tree)."""
    from profkit.analysis.engine import analyze_columns
    from profkit.analysis.rank_layout import ranks_of

    layout = None if one_process(cols) else ranks_of(cols)
    if layout is None:
        if rank is not None:
            raise BadInput(_one_rank_message(cols))
        return analyze_columns(
            cols, top=top, phase=phase, range=range, phases=phases, phase_ranges=phase_ranges
        )
    return analyze_columns(
        cols, top, phase, range, phases=phases, layout=layout, rank=rank, phase_ranges=phase_ranges
    )


def side_by_side(
    job: Job,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    phases: PhaseMode = "auto",
    tolerance: float = 5.0,
    phase_ranges: PhaseRanges | None = None,
) -> SideBySide:
    """The files of a job compared side by side: each analysed alone as one trace (its
    processes together, not per rank: the phases of the run are compared) by
    :func:`~.engine.analyze_columns`, then their phases per step, each against the
    first's (:func:`~.crosscheck.compare_reports`)."""
    from profkit.analysis.crosscheck import compare_reports
    from profkit.analysis.engine import analyze_columns

    if len(job.files) < 2:
        raise BadInput("--compare needs two or more traces (e.g. run.sqlite run.json.gz)")
    reports = [analyze_columns(c, top=top, phase=phase, range=range, phases=phases,
                               phase_ranges=phase_ranges)
               for c in job.files]  # fmt: skip
    return compare_reports(reports, [p.stem for p in job.paths], tolerance)


def one_process(columns: ActivityColumns) -> bool:
    """Whether the columns hold one process's activities (one rank's trace included)."""
    if len(columns.meta.get("ranks") or ()) > 1:
        return False
    threads = np.asarray(columns.threads, dtype=np.int64)
    return len(np.unique((threads >> PROCESS_SHIFT) & PROCESS_MASK)) <= 1


def _one_rank_message(cols: ActivityColumns) -> str:
    """Why ``--rank`` cannot pick from a one-process trace; for one rank's trace of a larger
    run, how to give every rank's; for activities of several GPUs without the API calls
    that say which process launched each, that."""
    from profkit.traces.columns import DEVICE
    from profkit.traces.ranks import rank_of_meta

    meta = cols.meta
    name = Path(str(meta.get("path") or "the trace")).name
    if DEVICE in cols.arrays:
        device, launched = cols.arrays[DEVICE], cols.arrays["launch_thread"] >= 0
        # A device none of whose activities has its launch call: a process whose CUDA API
        # calls were not traced (one process driving several GPUs has them on every one).
        blind = np.setdiff1d(device[~launched], device[launched])
        if len(blind) and len(np.unique(device)) > 1:
            return (
                f"--rank: {name}'s GPU activities ran on {len(np.unique(device))} devices, "
                f"but those of device(s) {', '.join(map(str, blind.tolist()))} have no CUDA "
                "API calls, which say which process (rank) launched each; capture with the "
                "CUDA API traced (nsys profile -t cuda), or read the whole job without --rank"
            )
    info = rank_of_meta(meta)
    world = (info or {}).get("world_size") or 0
    if info is None or world < 2:
        return "--rank needs a multi-rank trace (several processes, or per-rank traces)"
    return (
        f"{name} is rank {info['rank']} of a {world}-rank run alone: give every rank's trace "
        "(e.g. profkit kernels profiles/NAME-rank*.json.gz) to pick a --rank"
    )
