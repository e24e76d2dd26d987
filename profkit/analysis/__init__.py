"""Analysis of traces: attribution of GPU activity to phases and ranges, and the tables.

Analysis never reads files itself: :func:`analyze` takes a :class:`~profkit.traces.Trace`
from a reader; :func:`kernels` (one trace) and :func:`rank_kernels` (the per-rank traces of
one run) are the one-call facades (read, then analyze) the CLI uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from profkit.analysis.attribution import Attribution, PhaseMode, attribute
from profkit.analysis.categories import CATEGORIES, categorize
from profkit.analysis.names import short_kernel_name
from profkit.analysis.presentation import display_tables, kernel_report_markdown
from profkit.analysis.report import KernelReport, analyze
from profkit.errors import BadInput
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT, Trace

if TYPE_CHECKING:
    from profkit.traces.columns import ActivityColumns, Progress

__all__ = [
    "CATEGORIES",
    "Attribution",
    "KernelReport",
    "analyze",
    "analyze_any",
    "attribute",
    "categorize",
    "display_tables",
    "kernel_report_markdown",
    "kernels",
    "rank_kernels",
    "short_kernel_name",
]


def kernels(
    path: str | os.PathLike[str],
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    nsys: str | os.PathLike[str] | None = None,
    rank: int | None = None,
    phases: PhaseMode = "auto",
    cache: bool | None = None,
    progress: Progress | None = None,
) -> KernelReport:
    """Read the trace at ``path`` (any supported format) and build its kernel report.

    The trace is read as compact columns, through the columnar cache unless ``cache`` is
    False or ``$PROFKIT_CACHE=0`` (:mod:`profkit.traces.cache`), and one process's report is
    built from them in bounded memory by :func:`~.streaming.analyze_columns`, its phases
    annotated or inferred. Several processes (ranks) go to
    :func:`~.stream_ranks.analyze_rank_columns` where its rule holds, else to the full
    tables (:func:`analyze_any`). A multi-process trace gives a
    :class:`~profkit.analysis.ranks.RankedReport`; ``rank`` narrows its tables to one rank.
    """
    from profkit.analysis.stream_rank_tables import NotStreamable
    from profkit.analysis.stream_ranks import analyze_rank_columns, ranks_of
    from profkit.analysis.streaming import analyze_columns
    from profkit.traces import load_trace
    from profkit.traces.load import load_columns

    columns = load_columns(path, nsys=nsys, cache=cache, progress=progress)
    layout = None if _one_process(columns) else ranks_of(columns)
    if layout is None and not columns.meta.get("ranks"):  # one process ran GPU work
        if rank is not None:
            raise BadInput(_one_rank_message(columns.meta))
        return analyze_columns(columns, top=top, phase=phase, range=range, phases=phases)
    if layout is not None:
        try:
            return analyze_rank_columns(columns, layout, top, phase, range, rank, phases)
        except NotStreamable:
            pass
    return analyze_any(load_trace(path, nsys, progress), top, phase, range, rank, phases)


def rank_kernels(
    paths: list[Path],
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    nsys: str | os.PathLike[str] | None = None,
    rank: int | None = None,
    phases: PhaseMode = "auto",
    cache: bool | None = None,
    progress: Progress | None = None,
) -> KernelReport | None:
    """The ranked report of the per-rank traces of one run at ``paths`` (torch.profiler's,
    each naming a distinct rank; several hosts' put on one clock), or None where they are
    not that (nsys exports, traces that name no rank or one rank twice): the caller
    compares them instead. Raises :class:`~profkit.errors.BadInput` where they name ranks
    but cannot be one run's (world sizes differ, too many of them).

    Each trace is read as compact columns, through the columnar cache unless ``cache`` is
    False or ``$PROFKIT_CACHE=0``, and the ranks are joined and analysed from them
    (:mod:`.stream_rank_files`), their phases annotated or inferred. What the columns
    cannot tell (traces without GPU activity, say) takes the full tables
    (:func:`~.nodes.merge_ranks_of_hosts`, :func:`analyze_any`). ``rank`` narrows the
    tables to one rank.
    """
    from profkit.analysis.stream_rank_files import analyze_rank_file_columns, rank_infos
    from profkit.errors import BadInput
    from profkit.traces.load import is_nsys_export, load_columns_of
    from profkit.traces.ranks import names_distinct_ranks

    if len(paths) < 2 or any(is_nsys_export(p) for p in paths):
        return None  # an export names no rank: its processes are numbered, not named
    try:
        columns = load_columns_of(paths, nsys, cache, progress)
    except BadInput:  # the full tables' read says what is wrong (or reads what these cannot)
        return _ranks_of_tables(paths, top, phase, range, nsys, rank, phases, progress)
    if not names_distinct_ranks(rank_infos(columns)):
        return None
    report = analyze_rank_file_columns(columns, top, phase, range, rank, True, phases)
    if report is not None:
        return report
    return _ranks_of_tables(paths, top, phase, range, nsys, rank, phases, progress)


def _ranks_of_tables(
    paths: list[Path],
    top: int,
    phase: str | None,
    range: str | None,
    nsys: str | os.PathLike[str] | None,
    rank: int | None,
    phases: PhaseMode,
    progress: Progress | None,
) -> KernelReport | None:
    """:func:`rank_kernels` from the full tables: where the streaming analysis cannot."""
    from profkit.analysis.nodes import merge_ranks_of_hosts
    from profkit.traces.load import load_traces
    from profkit.traces.ranks import is_rank_set

    traces = load_traces(paths, nsys, progress)
    if not is_rank_set(traces):
        return None
    return analyze_any(merge_ranks_of_hosts(traces), top, phase, range, rank, phases)


def _one_process(columns: ActivityColumns) -> bool:
    """Whether the columns hold one process's activities (one rank's trace included)."""
    if len(columns.meta.get("ranks") or ()) > 1:
        return False
    threads = np.asarray(columns.threads, dtype=np.int64)
    return len(np.unique((threads >> PROCESS_SHIFT) & PROCESS_MASK)) <= 1


def analyze_any(
    trace: Trace,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    rank: int | None = None,
    phases: PhaseMode = "auto",
) -> KernelReport:
    """:func:`analyze` for one process; per rank and across ranks for several."""
    from profkit.analysis.ranks import analyze_ranks, is_multi_rank

    if is_multi_rank(trace):
        return analyze_ranks(trace, top=top, phase=phase, range=range, rank=rank, phases=phases)
    if rank is not None:
        raise BadInput(_one_rank_message(trace.meta))
    return analyze(trace, top=top, phase=phase, range=range, phases=phases)


def _one_rank_message(meta: dict[str, Any]) -> str:
    """Why ``--rank`` cannot pick from a one-process trace; for one rank's trace of a larger
    run, how to give every rank's."""
    from profkit.traces.ranks import rank_of_meta

    info = rank_of_meta(meta)
    world = (info or {}).get("world_size") or 0
    if info is None or world < 2:
        return "--rank needs a multi-rank trace (several processes, or per-rank traces)"
    name = Path(str(meta.get("path") or "the trace")).name
    return (
        f"{name} is rank {info['rank']} of a {world}-rank run alone: give every rank's trace "
        "(e.g. profkit kernels profiles/NAME-rank*.json.gz) to pick a --rank"
    )
