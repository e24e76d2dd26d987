"""Analysis of traces: attribution of GPU activity to phases and ranges, and the tables.

Analysis never reads files itself: :func:`analyze` takes a :class:`~profkit.traces.Trace`
from a reader; :func:`kernels` is the one-call facade (read, then analyze) the CLI uses.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from profkit.analysis.attribution import Attribution, attribute
from profkit.analysis.categories import CATEGORIES, categorize
from profkit.analysis.names import short_kernel_name
from profkit.analysis.presentation import display_tables, kernel_report_markdown
from profkit.analysis.report import KernelReport, analyze

if TYPE_CHECKING:
    from profkit.traces.columns import Progress

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
    cache: bool | None = None,
    progress: Progress | None = None,
) -> KernelReport:
    """Read the trace at ``path`` (any supported format) and build its kernel report.

    In bounded memory for Nsight Systems exports, through the columnar cache unless
    ``cache`` is False or ``$PROFKIT_CACHE=0`` (:mod:`profkit.traces.cache`).
    """
    from profkit.analysis.streaming import analyze_columns
    from profkit.traces.load import load_columns

    columns = load_columns(path, nsys=nsys, cache=cache, progress=progress)
    return analyze_columns(columns, top=top, phase=phase, range=range)
