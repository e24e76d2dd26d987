"""How the chunked nsys read spends its time: wall, all-thread CPU and the main thread's CPU
of ``read_nsys_columns`` with 1, 2, 4 and 8 reader threads, then the analysis stages.

The main thread joins each chunk to its launch and codes its names while the reader
threads run SQLite; when its CPU time is close to the read's wall time, the read waits on
the main thread, not on SQLite, and more reader threads cannot shorten it.

    python benchmarks/read_threads.py EXPORT [--threads 1 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clocks() -> tuple[float, float, float]:
    return time.perf_counter(), time.process_time(), time.thread_time()


def since(start: tuple[float, float, float]) -> dict[str, float]:
    now = clocks()
    names = ("wall_s", "cpu_s", "main_thread_cpu_s")
    return {name: round(b - a, 3) for name, a, b in zip(names, start, now, strict=True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from profkit.analysis import attribution, kernel_stats, sums
    from profkit.analysis.selection import Selection
    from profkit.traces import sqlite_scan
    from profkit.traces.nsys_columns import read_nsys_columns

    result: dict[str, object] = {}
    cols = None
    for threads in args.threads:
        sqlite_scan.MAX_READ_THREADS = threads
        start = clocks()
        cols = read_nsys_columns(args.export)
        result[f"read, {threads} threads"] = since(start)
        print(f"read, {threads} threads", result[f"read, {threads} threads"], flush=True)
    assert cols is not None
    start = clocks()
    plan = attribution.plan_of(cols)
    att = attribution.attributed(cols, plan)
    result["attribution"] = since(start)
    start = clocks()
    sums.with_stats(cols, plan, att, Selection())
    result["sums and kernel statistics"] = since(start)
    start = clocks()
    groups = kernel_stats.Groups(cols, att, None, 1, len(plan.phase_names), Selection())
    kernel_stats.kernel_stats(groups)
    result["kernel statistics alone"] = since(start)
    result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
