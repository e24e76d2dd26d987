"""Trace readers: one per format, each returning the same compact columns.

``traces.job.load(paths)`` reads a command's files and says how they go together;
``traces.load.load_columns(path)`` reads one (see :mod:`profkit.traces.load`).
"""
