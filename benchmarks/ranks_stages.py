"""Where the time of reading a multi-rank export goes: ``profkit kernels``' stages, timed.

Runs what ``profkit kernels EXPORT --format json --no-cache`` runs for a multi-process
Nsight Systems export whose phases are annotated, in this process, and prints the wall
seconds and the CPU seconds (all threads: ``time.process_time``) of each stage: the
analysis runs its chunks on up to four threads, so wall and CPU differ. The stages: the
imports, the columns' read (``traces.nsys_columns``), the ranks, the one attribution, the
one pass adding up every rank's sums, the kernel statistics (sorted keys in batches of
names), their longest activities and shapes, the reports' other tables, the second pass
(compute kernels meeting NCCL, step spans), the NCCL overlap, the job and the JSON. An
export of one CUDA process (a world of one rank) gets the same stages but the second
pass's. Peak RSS and minor page faults come from ``getrusage``. Each stage is timed by
wrapping the function that does it, so the stages sum to a little less than the whole. A
path that is not an export profkit reads ends with one line and exit status 2.

The old engine's stages (``--path full``: ``load_trace``, each rank's entry of
``analysis.ranks``, ...) are timed by this script as of commit 1f38560, run from a
checkout of that commit; their figures are docs/PERFORMANCE.md's history.

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
STARTED = time.perf_counter()  # the whole run's wall, imports included
CPU: dict[str, float] = {}
WALL: dict[str, float] = {}
STREAM_ORDER = [
    "import",
    "read_nsys_columns",
    "analysis",
    "ranks (numbering)",
    "attribution (once)",
    "one pass: sums",
    "kernel statistics",
    "  longest and shapes",
    "reports' tables",
    "second pass: NCCL, steps",
    "  NCCL overlap per rank",
    "job across ranks (steps)",
    "json",
]
SECOND_PASS = ("second pass: NCCL, steps", "  NCCL overlap per rank", "job across ranks (steps)")
ONE_PROCESS_ORDER = [s for s in STREAM_ORDER if s not in SECOND_PASS]


def timed(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, adding its CPU and wall seconds to ``CPU[stage]`` and ``WALL[stage]``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            CPU[stage] = CPU.get(stage, 0.0) + time.process_time() - cpu
            WALL[stage] = WALL.get(stage, 0.0) + time.perf_counter() - wall

    return wrapper


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="a multi-process nsys export (.sqlite)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    imported = timed("import", _import_profkit)
    errors = imported()
    try:
        return stream(args.export)
    except errors as e:  # a user's error: one line, as the CLI gives it
        print(f"error: {e}", file=sys.stderr)
        return 2


def _import_profkit() -> tuple[type[Exception], ...]:
    """The modules the stages wrap, imported (timed as ``import``); the user errors."""
    from profkit.analysis import engine  # noqa: F401
    from profkit.errors import ProfkitError
    from profkit.traces.nsys_columns import read_nsys_columns  # noqa: F401

    return (ProfkitError,)


def stream(export: Path) -> int:
    """The stages of the analysis of columns (``analysis.engine``); one line and exit
    status 2 for columns of several processes without GPU starts (which only a Chrome
    trace that names no rank gives)."""
    from profkit.analysis import engine, kernel_stats, one_process, rank_layout, sums
    from profkit.formats import dumps
    from profkit.traces.nsys_columns import read_nsys_columns

    attributed = timed("attribution (once)", engine.attributed)
    engine.attributed = sums.attributed = attributed
    sums.add_up = timed("one pass: sums", sums.add_up)
    sums.kernel_stats = timed("kernel statistics", sums.kernel_stats)
    kernel_stats._add_shapes = timed("  longest and shapes", kernel_stats._add_shapes)
    engine.scope_report = timed("reports' tables", engine.scope_report)
    engine.second_pass = timed("second pass: NCCL, steps", engine.second_pass)
    engine.rank_comm = timed("  NCCL overlap per rank", engine.rank_comm)
    engine.step_table = timed("job across ranks (steps)", engine.step_table)
    cols = timed("read_nsys_columns", read_nsys_columns)(export)
    layout = timed("ranks (numbering)", rank_layout.ranks_of)(cols)
    if layout is None and not one_process(cols):
        print(f"{export}: several processes, but no GPU starts to rank them", file=sys.stderr)
        return 2
    report = timed("analysis", engine.analyze_columns)(cols, layout=layout)
    timed("json", lambda: dumps(report.to_json()))()
    return summary(export, report, STREAM_ORDER if layout else ONE_PROCESS_ORDER)


def summary(export: Path, report: Any, order: list[str]) -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    whole = report.totals["kernels"]
    ranks = getattr(report, "ranks", None)
    what = f"{len(ranks)} ranks" if ranks else "one CUDA process: no ranks' stages"
    print(f"{export.name}: {whole:,} kernels, {what}")
    print(f"  {'stage':36s} {'wall':>8s} {'CPU':>8s}")
    for stage in order:
        print(f"  {stage:36s} {WALL.get(stage, 0.0):6.2f} s {CPU.get(stage, 0.0):6.2f} s")
    print(
        f"  {'total (this process)':36s} {time.perf_counter() - STARTED:6.2f} s "
        f"{usage.ru_utime + usage.ru_stime:6.2f} s ({usage.ru_stime:.2f} s system CPU), "
        f"peak RSS {usage.ru_maxrss / 1024**2:.2f} GiB, {usage.ru_minflt:,} minor page "
        f"faults; load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
