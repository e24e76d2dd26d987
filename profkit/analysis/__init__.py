"""Analysis of traces: attribution of GPU activity to phases and ranges, and the tables.

Analysis never reads files itself: :func:`analyze` takes a :class:`~profkit.traces.Trace`
from a reader; :func:`kernels` is the one-call facade (read, then analyze) the CLI uses.
"""

from __future__ import annotations

import os

from profkit.analysis.attribution import Attribution, PhaseMode, attribute
from profkit.analysis.categories import CATEGORIES, categorize
from profkit.analysis.names import short_kernel_name
from profkit.analysis.presentation import display_tables, kernel_report_markdown
from profkit.analysis.report import KernelReport, analyze
from profkit.traces.schema import Trace

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
) -> KernelReport:
    """Read the trace at ``path`` (any supported format) and build its kernel report.

    A multi-process trace (several ranks) gives a :class:`~profkit.analysis.ranks.RankedReport`;
    ``rank`` narrows its tables to one rank.
    """
    from profkit.traces import load_trace

    return analyze_any(load_trace(path, nsys=nsys), top, phase, range, rank, phases)


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
        raise BadInput("--rank needs a multi-rank trace (several processes, or per-rank traces)")
    return analyze(trace, top=top, phase=phase, range=range, phases=phases)
