"""What tests build traces and reports with, through the one columnar engine.

``report(paths, **options)`` is what ``profkit kernels`` computes for those files
(:func:`profkit.traces.job.load`, then :func:`profkit.analysis.kernel_report`);
``columns_from_tables(kernels, ranges, meta)`` makes one file's compact columns from small
hand-written tables, for the rules no real capture shows (ties, odd ids, ...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.analysis import kernel_report
from profkit.analysis.report_types import KernelReport
from profkit.traces.columns import ActivityColumns, from_trace
from profkit.traces.job import load, together
from profkit.traces.schema import Trace


def report(
    paths: str | os.PathLike[str] | list[str | os.PathLike[str]] | list[Path], **options: Any
) -> KernelReport:
    """The kernel report of these files, as ``profkit kernels`` makes it (no cache)."""
    given = paths if isinstance(paths, list) else [paths]
    return kernel_report(load(given, cache=False), **options)


def columns_from_tables(
    kernels: pd.DataFrame, ranges: pd.DataFrame, meta: dict[str, Any], timed: bool = False
) -> ActivityColumns:
    """One file's compact columns from a kernels table and a ranges table (the columns
    a reader would give for the same activities, in the same order)."""
    return from_trace(Trace(kernels=kernels, ranges=ranges, meta=meta), timed=timed)


def report_of_columns(files: list[ActivityColumns], **options: Any) -> KernelReport:
    """The kernel report of files already read (``columns_from_tables``)."""
    paths = [Path(f.meta.get("path", f"file{i}")) for i, f in enumerate(files)]
    return kernel_report(together(paths, files), **options)
