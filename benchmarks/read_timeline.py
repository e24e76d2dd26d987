"""Where the wall time of an nsys read goes, thread by thread: ``read_nsys_columns`` timed.

Reads an Nsight Systems export ``--runs`` times in this process (after one read that warms
the imports and the page cache, not shown) and prints, for each run, every step of the
read with where it ran: each reader thread's chunks per table (``thr  chunk KERNEL``) and
the NVTX ranges' read and build, and the main thread's steps (adding the calls, sealing
them, adding the activities' chunks). Per step: how many times, the wall and CPU seconds
summed over them (CPU of that thread: ``time.thread_time``), and the span from the first
start to the last end, in seconds from the read's start. A step whose span runs past its
neighbour's start ran alongside it; the main thread is the read's bottleneck where its
steps' wall nears their span, the reader threads where their CPU over the thread count
does (``sqlite_scan.MAX_READ_THREADS``). A path profkit cannot read ends with one line and
exit status 2.

    python benchmarks/kernels_scale.py --ranks 300 --runs 1 --keep --workdir /tmp/k
    python benchmarks/read_timeline.py /tmp/k/ranks2-x300.sqlite --runs 3
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
Event = tuple[str, str, float, float, float]  # thread, step, start, end, thread CPU


class Timeline:
    """Steps timed on whatever thread runs them, from a common origin."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.events: list[Event] = []
        self.lock = threading.Lock()

    def timed(self, label: Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, each call recorded under ``label(*args)``."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                thread = "main" if threading.current_thread() is threading.main_thread() else "thr"
                event = (thread, label(*args), start, end, time.thread_time() - cpu)
                with self.lock:
                    self.events.append(event)

        return wrapper

    def reset(self) -> None:
        self.origin = time.perf_counter()
        self.events.clear()

    def table(self) -> list[str]:
        steps: dict[tuple[str, str], list[float]] = collections.defaultdict(
            lambda: [0, 0.0, 0.0, float("inf"), 0.0]
        )
        for thread, label, start, end, cpu in self.events:
            step = steps[(thread, label)]
            step[0] += 1
            step[1] += end - start
            step[2] += cpu
            step[3] = min(step[3], start - self.origin)
            step[4] = max(step[4], end - self.origin)
        lines = [f"  {'step':40s} {'n':>4s} {'wall':>8s} {'CPU':>8s}   span (s from the start)"]
        for (thread, label), (n, wall, cpu, first, last) in sorted(
            steps.items(), key=lambda item: item[1][3]
        ):
            lines.append(
                f"  {thread:4s} {label:35s} {int(n):4d} {wall:6.3f} s {cpu:6.3f} s"
                f"   {first:6.3f} - {last:6.3f}"
            )
        return lines


def instrument(timeline: Timeline) -> Callable[[Path], Any]:
    """Wrap the read's steps; the read itself."""
    from profkit.traces import nsys_columns, sqlite_scan

    read_chunk = sqlite_scan._read_chunk
    sqlite_scan._read_chunk = timeline.timed(
        lambda conn, query, bounds: "chunk " + query.table.rsplit("_", 1)[-1], read_chunk
    )
    for owner, name in [
        (nsys_columns._Calls, "add"),
        (nsys_columns._Calls, "seal"),
        (nsys_columns._Builder, "add"),
        (nsys_columns._Builder, "fill_unmatched"),
    ]:
        label = f"{owner.__name__}.{name}"
        setattr(owner, name, timeline.timed(lambda *a, _l=label: _l, getattr(owner, name)))
    for name in ("nvtx_rows", "build_ranges", "_trace_end"):
        setattr(
            nsys_columns, name, timeline.timed(lambda *a, _l=name: _l, getattr(nsys_columns, name))
        )
    return nsys_columns.read_nsys_columns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="an Nsight Systems export (.sqlite)")
    parser.add_argument("--runs", type=int, default=1, help="timed reads (default 1)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from profkit.errors import ProfkitError

    timeline = Timeline()
    read = instrument(timeline)
    try:
        read(args.export)  # imports, page cache
        for _ in range(max(args.runs, 1)):
            timeline.reset()
            cpu = time.process_time()
            columns = read(args.export)
            wall = time.perf_counter() - timeline.origin
            cpu = time.process_time() - cpu
            print(
                f"{args.export.name}: {len(columns):,} activities read in {wall:.2f} s wall, "
                f"{cpu:.2f} s CPU (all threads)"
            )
            print("\n".join(timeline.table()))
    except ProfkitError as e:  # a user's error: one line, as the CLI gives it
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
