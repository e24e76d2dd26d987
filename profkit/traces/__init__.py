"""Trace readers: one per format, each returning the same plain tables (a :class:`Trace`)."""

from profkit.traces.schema import KERNEL_COLUMNS, RANGE_COLUMNS, Trace

__all__ = ["KERNEL_COLUMNS", "RANGE_COLUMNS", "Trace"]
