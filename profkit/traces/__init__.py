"""Trace readers: one per format, each returning the same plain tables (a :class:`Trace`).

``load_trace(path)`` picks the reader for a file (see :mod:`profkit.traces.load`).
"""

from profkit.traces.load import load_trace, register
from profkit.traces.schema import KERNEL_COLUMNS, RANGE_COLUMNS, Trace

__all__ = ["KERNEL_COLUMNS", "RANGE_COLUMNS", "Trace", "load_trace", "register"]
