"""Where the CPU time of reading a multi-rank export goes: ``profkit kernels``' stages, timed.

Runs what ``profkit kernels EXPORT --format json --no-cache`` runs for a multi-process
Nsight Systems export whose phases are annotated, in this process, and prints the CPU
seconds (all threads: ``time.process_time``) of each stage. ``--path stream`` (the
default, what the command runs): the imports, the columns' read, the ranks, the one
attribution, the one pass adding up every rank's sums, the kernel statistics (one sort,
three merges), their longest activities and shapes, the reports' other tables, the
second pass (compute kernels meeting NCCL, step spans), the NCCL overlap, the job and
the JSON. ``--path full`` (the full tables, what inferred phases take): the imports,
``load_trace``, the one attribution,
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
STREAM_ORDER = [
    "import",
    "read_nsys_columns",
    "analysis",
    "ranks (numbering)",
    "attribution (once)",
    "one pass: sums per rank",
    "kernel statistics",
    "  longest and shapes",
    "reports' tables",
    "second pass: NCCL, steps",
    "  NCCL overlap per rank",
    "job across ranks (steps)",
    "json",
]
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
    parser.add_argument("--path", choices=("stream", "full"), default="stream")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.path == "stream":
        return stream(args.export)
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
    return summary(args.export, report, ORDER)


def stream(export: Path) -> int:
    """The stages of the streaming path (``analysis.stream_ranks``)."""
    started = time.process_time()
    from profkit.analysis import stream_rank_tables, stream_ranks
    from profkit.formats import dumps
    from profkit.traces.nsys_stream import read_nsys_columns

    CPU["import"] = time.process_time() - started
    s, t = stream_ranks, stream_rank_tables
    s.attributed = timed("attribution (once)", s.attributed)
    s.add_up_ranks = timed("one pass: sums per rank", s.add_up_ranks)
    s.kernel_statistics = timed("kernel statistics", s.kernel_statistics)
    s.stat_frames = timed("  longest and shapes", s.stat_frames)
    s.scope_report = timed("reports' tables", s.scope_report)
    s.second_pass = timed("second pass: NCCL, steps", s.second_pass)
    s.rank_comm = timed("  NCCL overlap per rank", s.rank_comm)
    s.step_table = timed("job across ranks (steps)", s.step_table)
    assert t  # the tables' module is imported for its functions above
    cols = timed("read_nsys_columns", read_nsys_columns)(export)
    layout = timed("ranks (numbering)", s.ranks_of)(cols)
    report = timed("analysis", s.analyze_rank_columns)(cols, layout)
    timed("json", lambda: dumps(report.to_json()))()
    return summary(export, report, STREAM_ORDER)


def summary(export: Path, report: Any, order: list[str]) -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    whole = report.totals["kernels"]
    print(f"{export.name}: {whole:,} kernels, {len(report.ranks)} ranks")
    for stage in order:
        print(f"  {stage:36s} {CPU.get(stage, 0.0):6.2f} s CPU")
    print(
        f"  {'total (this process)':36s} {usage.ru_utime + usage.ru_stime:6.2f} s CPU "
        f"({usage.ru_stime:.2f} s system), peak RSS {usage.ru_maxrss / 1024**2:.2f} GiB, "
        f"{usage.ru_minflt:,} minor page faults; load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
