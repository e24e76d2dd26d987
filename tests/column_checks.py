"""Checks shared by the tests of the readers' compact columns."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.traces.columns import ActivityColumns


def assert_same_columns(a: ActivityColumns, b: ActivityColumns) -> None:
    """Every array (dtype included), lookup table, the ranges and the meta equal."""
    assert list(a.arrays) == list(b.arrays)
    for name, values in b.arrays.items():
        got = np.asarray(a.arrays[name])
        assert got.dtype == np.asarray(values).dtype, name
        np.testing.assert_array_equal(got, np.asarray(values), err_msg=name)
    assert (a.names, a.kinds, a.shapes) == (b.names, b.kinds, b.shapes)
    assert a.threads.dtype == b.threads.dtype
    np.testing.assert_array_equal(a.threads, b.threads)
    pd.testing.assert_frame_equal(a.ranges, b.ranges)
    assert a.meta == b.meta
