"""A pass over per-activity arrays, chunk by chunk, on a few threads.

The analysis of compact columns (attribution, sums, kernel statistics, the ranks' second
pass: :mod:`.engine`) is a loop over chunks of :data:`CHUNK` activities, each chunk's work
independent of the others'. Its work is numpy's binary searches, gathers and
arithmetic, which release the GIL, so :func:`map_chunks` runs chunks on up to
:data:`MAX_THREADS` threads and hands their results back in chunk order, with at most one
chunk per thread (plus one) in flight: memory holds a few chunks' temporaries, whatever
the trace's size. On the GPU host (16 cores) this takes the analysis of a 30 M-kernel
export from one core to four (docs/PERFORMANCE.md).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from profkit.cores import cores

T = TypeVar("T")
CHUNK = 1 << 17  # activities per analysis chunk: ~15 MB of temporaries, a few in flight
MAX_THREADS = 4
"""Threads of a pass, whatever the core count: each holds a chunk's temporaries (tens of
MB), and the reader's threads (``traces.sqlite_scan.MAX_READ_THREADS``) stop at four too."""


def threads() -> int:
    """How many threads a pass uses here."""
    return max(1, min(MAX_THREADS, cores()))


def map_chunks(fn: Callable[[int, int], T], count: int, size: int) -> Iterator[T]:
    """``fn(lo, hi)`` for each chunk ``[lo, hi)`` of ``range(count)`` (``size`` rows
    each), in chunk order; on several threads where there are several chunks and cores.

    ``fn`` may write to disjoint slices of shared arrays; whatever it returns is handed
    back in order, so the caller adds chunk results up as a serial loop would.
    """
    bounds = [(lo, min(lo + size, count)) for lo in range(0, count, size)]
    workers = threads()
    if workers == 1 or len(bounds) <= 1:
        for lo, hi in bounds:
            yield fn(lo, hi)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="profkit-chunk") as pool:
        window: deque[Future[T]] = deque()
        for lo, hi in bounds:
            window.append(pool.submit(fn, lo, hi))
            if len(window) > workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
