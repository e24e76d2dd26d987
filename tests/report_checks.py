"""Checks shared by the tests of the chunked analysis and of the cache."""

from __future__ import annotations

import pandas as pd

from profkit.analysis.report import KernelReport

TABLES = ("phases", "ranges", "kernels", "overall", "categories")


def assert_same_report(a: KernelReport, b: KernelReport) -> None:
    """Every table, total, note and source field equal (std to 1e-12: it is summed in
    another order, sorted instead of row order, so equal to the last ulps only)."""
    for table in TABLES:
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), rtol=1e-12)
    assert a.totals == b.totals
    assert a.notes == b.notes
    assert a.source == b.source
