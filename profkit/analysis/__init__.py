"""Analysis of traces: attribution of GPU activity to phases and ranges, and the tables.

Analysis never reads files itself: :func:`analyze` takes a :class:`~profkit.traces.Trace`
from a reader; :func:`kernels` is the one-call facade (read, then analyze) the CLI uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from profkit.analysis.attribution import Attribution, PhaseMode, attribute
from profkit.analysis.categories import CATEGORIES, categorize
from profkit.analysis.names import short_kernel_name
from profkit.analysis.presentation import display_tables, kernel_report_markdown
from profkit.analysis.report import KernelReport, analyze
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT, Trace
from profkit.workload.names import PHASES

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

    An nsys export whose steps carry phase ranges is read and analysed in bounded memory,
    from compact columns, through the columnar cache unless ``cache`` is False or
    ``$PROFKIT_CACHE=0`` (:mod:`profkit.traces.cache`): one process by
    :func:`~.streaming.analyze_columns`, several (ranks) by
    :func:`~.stream_ranks.analyze_rank_columns` where its rule holds. Phases to infer and
    the odd cases take the full tables (:func:`analyze_any`); ``phases="inferred"`` is
    known before reading, so that trace is read once, whole. A multi-process trace gives a
    :class:`~profkit.analysis.ranks.RankedReport`; ``rank`` narrows its tables to one rank.
    """
    from profkit.analysis.streaming import analyze_columns
    from profkit.traces import load_trace
    from profkit.traces.load import load_columns

    # Inferred phases need the full tables: read them once, whole.
    if phases == "inferred":
        return analyze_any(load_trace(path, nsys, progress), top, phase, range, rank, phases)
    columns = load_columns(path, nsys=nsys, cache=cache, progress=progress)
    if _streamable(columns, rank, phases):
        return analyze_columns(columns, top=top, phase=phase, range=range)
    ranked = _ranks_streamed(columns, top, phase, range, rank)
    if ranked is not None:
        return ranked
    return analyze_any(load_trace(path, nsys, progress), top, phase, range, rank, phases)


def _ranks_streamed(
    columns: ActivityColumns, top: int, phase: str | None, range: str | None, rank: int | None
) -> KernelReport | None:
    """The ranked report of a multi-process export from its columns, where they can give
    it (:mod:`.stream_ranks`: the rule); None where the full tables must."""
    from profkit.analysis.stream_rank_tables import NotStreamable
    from profkit.analysis.stream_ranks import analyze_rank_columns, ranks_of

    layout = ranks_of(columns)
    if layout is None:
        return None
    try:
        return analyze_rank_columns(columns, layout, top, phase, range, rank)
    except NotStreamable:
        return None


def _streamable(columns: ActivityColumns, rank: int | None, phases: PhaseMode) -> bool:
    """Whether the bounded-memory analysis gives what :func:`analyze` would: one process,
    its phases annotated (the streaming path neither infers phases nor splits ranks)."""
    if rank is not None or phases == "inferred" or len(columns.meta.get("ranks") or ()) > 1:
        return False
    threads = np.asarray(columns.threads, dtype=np.int64)
    if len(np.unique((threads >> PROCESS_SHIFT) & PROCESS_MASK)) > 1:
        return False
    return bool(columns.ranges["name"].isin(PHASES).any())  # no Python loop over the ranges


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
    from profkit.errors import BadInput

    if is_multi_rank(trace):
        return analyze_ranks(trace, top=top, phase=phase, range=range, rank=rank, phases=phases)
    if rank is not None:
        raise BadInput(_one_rank_message(trace))
    return analyze(trace, top=top, phase=phase, range=range, phases=phases)


def _one_rank_message(trace: Trace) -> str:
    """Why ``--rank`` cannot pick from ``trace``; for one rank's trace of a larger run, how
    to give every rank's."""
    from profkit.traces.ranks import rank_info

    info = rank_info(trace)
    world = (info or {}).get("world_size") or 0
    if info is None or world < 2:
        return "--rank needs a multi-rank trace (several processes, or per-rank traces)"
    name = Path(str(info.get("path") or "the trace")).name
    return (
        f"{name} is rank {info['rank']} of a {world}-rank run alone: give every rank's trace "
        "(e.g. profkit kernels profiles/NAME-rank*.json.gz) to pick a --rank"
    )
