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

__all__ = [
    "CATEGORIES",
    "Attribution",
    "KernelReport",
    "analyze",
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
    phases: PhaseMode = "auto",
) -> KernelReport:
    """Read the trace at ``path`` (any supported format) and build its kernel report."""
    from profkit.traces import load_trace

    trace = load_trace(path, nsys=nsys)
    return analyze(trace, top=top, phase=phase, range=range, phases=phases)
