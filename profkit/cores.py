"""How many threads one read or one analysis pass may use.

Readers and passes (``traces.sqlite_scan``, ``analysis.chunked``) run on a few threads of
their own, up to the cores there are. Where many of them run side by side in one process —
a Dask worker's tasks, each reading and analysing one file (:mod:`profkit.cluster`) — the
parallelism is the tasks': each task takes one thread (:func:`limited`), so that 15 workers
on 16 cores do not start 60 threads of numpy and SQLite.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_here = threading.local()


def cores() -> int:
    """The threads a read or pass started on this thread may use: the cores, or what
    :func:`limited` set for this thread."""
    return getattr(_here, "limit", None) or max(1, os.cpu_count() or 1)


@contextmanager
def limited(threads: int) -> Iterator[None]:
    """Reads and passes started on this thread use at most ``threads`` threads."""
    before = getattr(_here, "limit", None)
    _here.limit = max(1, threads)
    try:
        yield
    finally:
        _here.limit = before
