"""Checks shared by the tests of the chunked analysis, the cache and the streamed ranks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from nsys_data import sql_kernel_rows

from profkit.analysis.names import short_kernel_name
from profkit.analysis.report_types import EXTRA, KernelReport
from profkit.traces.columns import ActivityColumns

TABLES = ("phases", "ranges", "kernels", "overall", "categories")
STORY_KEYS = ("phases_from", "patterns")
"""What the columns' report says of its phases' origin and the framework patterns (issue
25), which the full tables' engine, kept only as a reference until it is deleted, lacks."""
STORY_NOTES = ("Phases from ", "Recognized: ")
ADDED_COLUMNS = {column for columns in EXTRA.values() for column in columns} | {"findings"}
"""The columns every JSON table row carries since issue 27 (beyond the contract's keys),
and the report's ``findings`` since issue 28, which outputs frozen before them lack."""


def _without_story(report: KernelReport) -> tuple[list[str], dict[str, Any]]:
    notes = [n for n in report.notes if not n.startswith(STORY_NOTES)]
    return notes, {k: v for k, v in report.source.items() if k not in STORY_KEYS}


def assert_same_report(a: KernelReport, b: KernelReport) -> None:
    """Every table, total, note and source field equal (std to 1e-12: it is summed in
    another order, sorted instead of row order, so equal to the last ulps only), the phase
    story aside where one of them lacks it (:data:`STORY_KEYS`)."""
    for table in TABLES:
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), rtol=1e-12)
    assert a.totals == b.totals
    if "patterns" in a.source and "patterns" in b.source:
        assert a.notes == b.notes
        assert a.source == b.source
    else:
        assert _without_story(a) == _without_story(b)


def close_json(a: Any, b: Any, where: str = "") -> None:
    """JSON values equal, floats to 1e-12 relative (std is summed in another order)."""
    if isinstance(b, dict):
        if where.endswith("source") and isinstance(a, dict):  # the story: see STORY_KEYS
            a = {k: v for k, v in a.items() if k not in STORY_KEYS or k in b}
            b = {k: v for k, v in b.items() if k not in STORY_KEYS or k in a}
        if isinstance(a, dict):  # columns the JSON gained after an output was frozen
            a = {k: v for k, v in a.items() if k in b or k not in ADDED_COLUMNS}
        assert isinstance(a, dict) and list(a) == list(b), where
        for key in b:
            if key == "short_name" and "name" in b:  # shortened by today's rule, whenever frozen
                assert a[key] == short_kernel_name(str(b["name"])), f"{where}.{key}"
                continue
            close_json(a[key], b[key], f"{where}.{key}")
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close_json(x, y, f"{where}[{i}]")
    elif isinstance(b, float) and not isinstance(a, bool):
        # a count frozen as a float (1436.0) is an int since issue 27: the same number
        whole = isinstance(a, int) and b.is_integer()
        assert isinstance(a, float) or whole, where
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15), where
    else:
        assert a == b and type(a) is type(b), where


def option_id(options: dict[str, Any]) -> str:
    """A parametrized test's id for a set of keyword options (``all`` for none)."""
    return ",".join(f"{k}={v}" for k, v in options.items()) or "all"


def assert_columns_are_the_export(columns: ActivityColumns, path: Path) -> None:
    """The kernels' columns (the first activities, in row order) say what plain SQL reads
    from the export at ``path``: name, duration, launch call's start and thread, and shape
    (the other activities have none)."""
    rows = sql_kernel_rows(path)
    kernels = len(rows)
    arrays = columns.arrays
    assert [columns.names[i] for i in arrays["name"][:kernels]] == [r[0] for r in rows]
    assert arrays["duration"][:kernels].tolist() == [r[1] for r in rows]
    assert arrays["launch_start"][:kernels].tolist() == [r[2] for r in rows]
    threads = columns.launch_threads(arrays["launch_thread"][:kernels])
    assert np.asarray(threads).tolist() == [r[3] for r in rows]
    shapes = columns.shapes_at(np.arange(len(columns)))
    assert shapes == [(r[4], r[5]) for r in rows] + [("", "")] * (len(columns) - kernels)
