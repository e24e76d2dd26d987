"""Where the CPU time of reading a multi-rank export goes: ``profkit kernels``' stages, timed.

Runs what ``profkit kernels EXPORT --format json --no-cache`` runs for a multi-process
Nsight Systems export, in this process, and prints the CPU seconds (all threads:
``time.process_time``) of each stage: the imports, ``load_trace``, the one attribution,
each rank's entry (its tables from that attribution, its NCCL time and overlap, its
steps; the first one also adds up the range totals of the one attribution), the whole
trace's tables, the job across ranks, and the JSON. Peak RSS and minor page faults
come from ``getrusage``. Each stage is timed by wrapping the function that does it, so the
stages sum to a little less than the whole.

    python benchmarks/kernels_scale.py --ranks 100 --runs 3 --keep --workdir /tmp/k
    python benchmarks/ranks_stages.py /tmp/k/ranks2-x100.sqlite
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CPU: dict[str, float] = {}
ORDER = [
    "import",
    "load_trace",
    "analysis",
    "attribution (once)",
    "each rank's entry",
    "  its tables",
    "    range totals (once)",
    "  its NCCL time and overlap",
    "whole-trace tables",
    "job across ranks (steps)",
    "json",
]


def timed(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, adding its CPU seconds to ``CPU[stage]`` at each call."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            CPU[stage] = CPU.get(stage, 0.0) + time.process_time() - started

    return wrapper


def _in_rank() -> bool:
    """Whether the caller runs inside a rank's entry (``ranks._rank_entry``)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_rank_entry":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="a multi-process nsys export (.sqlite)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    started = time.process_time()
    from profkit.analysis import ranks
    from profkit.formats import dumps
    from profkit.traces import load_trace

    CPU["import"] = time.process_time() - started
    ranks.attribute = timed("attribution (once)", ranks.attribute)
    ranks._rank_entry = timed("each rank's entry", ranks._rank_entry)
    tables_of = ranks.tables_of
    rank_tables = timed("  its tables", tables_of)
    whole_tables = timed("whole-trace tables", tables_of)
    ranks.tables_of = lambda *a, **k: (rank_tables if _in_rank() else whole_tables)(*a, **k)
    ranks.comm_stats_of = timed("  its NCCL time and overlap", ranks.comm_stats_of)
    whole = ranks._Whole
    whole.counts_of_all = timed("    range totals (once)", whole.counts_of_all)  # type: ignore[method-assign]
    ranks.step_table = timed("job across ranks (steps)", ranks.step_table)
    trace = timed("load_trace", load_trace)(args.export)
    report = timed("analysis", ranks.analyze_ranks)(trace)
    timed("json", lambda: dumps(report.to_json()))()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    whole = report.totals["kernels"]
    print(f"{args.export.name}: {whole:,} kernels, {len(report.ranks)} ranks")
    for stage in ORDER:
        print(f"  {stage:36s} {CPU.get(stage, 0.0):6.2f} s CPU")
    print(
        f"  {'total (this process)':36s} {usage.ru_utime + usage.ru_stime:6.2f} s CPU "
        f"({usage.ru_stime:.2f} s system), peak RSS {usage.ru_maxrss / 1024**2:.2f} GiB, "
        f"{usage.ru_minflt:,} minor page faults; load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
