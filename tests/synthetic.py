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

import numpy as np
import pandas as pd

from profkit.analysis import kernel_report
from profkit.analysis.report_types import KernelReport
from profkit.traces.columns import (
    DEVICE,
    DEVICE_LIMIT,
    KEPT,
    SHAPE,
    START,
    ActivityColumns,
    check_threads,
)
from profkit.traces.job import load, together


def report(
    paths: str | os.PathLike[str] | list[str | os.PathLike[str]] | list[Path], **options: Any
) -> KernelReport:
    """The kernel report of these files, as ``profkit kernels`` makes it (no cache)."""
    given = paths if isinstance(paths, list) else [paths]
    return kernel_report(load(given, cache=False), **options)


def columns_from_tables(
    kernels: pd.DataFrame, ranges: pd.DataFrame, meta: dict[str, Any], timed: bool = False
) -> ActivityColumns:
    """One file's compact columns from a table of activities (``name``, ``kind``, ``start``,
    ``end``, ``device``, ``grid``, ``block``, ``launch_start``, ``launch_thread``; NA
    where the launch is unknown) and a ranges table (``profkit.traces.schema.RANGE_COLUMNS``):
    the columns a reader would give for the same activities, in the same order. ``timed``:
    with each activity's GPU start and device, where every device fits their 16 bits."""
    k = kernels
    name_codes, names = pd.factorize(k["name"].to_numpy(dtype=object))
    first = np.unique(name_codes, return_index=True)[1]
    kinds = k["kind"].to_numpy(dtype=object)[first].tolist()
    pairs = pd.MultiIndex.from_arrays([k["grid"].fillna(""), k["block"].fillna("")])
    shape_codes, shapes = pd.factorize(pairs)
    launch = k["launch_start"].to_numpy(dtype=np.int64, na_value=-1)
    thread = k["launch_thread"].to_numpy(dtype=np.int64, na_value=-1)
    thread_codes, threads = pd.factorize(thread[launch >= 0])
    check_threads(len(threads))
    codes = np.full(len(k), -1, dtype=np.int64)
    codes[launch >= 0] = thread_codes
    arrays = {
        "name": name_codes,
        SHAPE: shape_codes,
        "duration": (k["end"].to_numpy(np.int64) - k["start"].to_numpy(np.int64)),
        "launch_start": np.where(launch >= 0, launch, -1),
        "launch_thread": codes,
    }
    device = k["device"].to_numpy(np.int64)
    if timed and ((device >= -DEVICE_LIMIT - 1) & (device <= DEVICE_LIMIT)).all():
        arrays.update({START: k["start"].to_numpy(np.int64), DEVICE: device})
    return ActivityColumns(
        arrays={n: np.asarray(arrays[n]).astype(t) for n, t in KEPT.items() if n in arrays},
        names=[str(n) for n in names],
        kinds=[str(x) for x in kinds],
        shapes=[(str(g), str(b)) for g, b in shapes],
        threads=np.asarray(threads, dtype=np.int64),
        ranges=ranges,
        meta=meta,
    )


def report_of_columns(files: list[ActivityColumns], **options: Any) -> KernelReport:
    """The kernel report of files already read (``columns_from_tables``)."""
    paths = [Path(f.meta.get("path", f"file{i}")) for i, f in enumerate(files)]
    return kernel_report(together(paths, files), **options)
