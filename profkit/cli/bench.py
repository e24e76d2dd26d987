"""``profkit bench``: the timing sweep, one process per config, rows into the results DB."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from profkit.cli._common import (
    DbOpt,
    FormatOpt,
    OutOpt,
    TimeoutOpt,
    WorkloadOptions,
    command,
    workload_options,
)
from profkit.cli.app import app
from profkit.cli.render import err_console
from profkit.cli.views import render_comparison, render_rows, step_progress
from profkit.errors import ProfkitError
from profkit.files import DEFAULT_DB

if TYPE_CHECKING:
    from profkit.workload.config import WorkloadConfig

ResumeOpt = Annotated[
    bool, typer.Option("--resume", help="Skip configs the DB already holds (ok or oom).")
]
CompareOpt = Annotated[
    str | None,
    typer.Option(
        "--compare",
        help="Print the sweep as a comparison of this field instead: "
        "dtype | compile | warmup | attention | mode | nproc (see `profkit compare`).",
    ),
]


@command(app)
@workload_options()
def bench(
    workload: WorkloadOptions,
    db: DbOpt = DEFAULT_DB,
    resume: ResumeOpt = False,
    timeout: TimeoutOpt = None,
    compare: CompareOpt = None,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """Time forward, backward and optimizer over the cross product of the options.

    Each config runs in its own process: an OOM or a crash becomes a row with status
    oom|error and the sweep goes on (if every config ends in error, the exit status is 2).
    Every finished row is committed to the results DB at once (Ctrl-C keeps them); --resume
    skips configs already there. --compare dtype prints fp32 and bf16 side by side with
    Δ ms and Δ % instead of the rows.

    Example: profkit bench --size small medium --ctx 128 256 --mode forward train --bf16
    """
    # Imported here, not at the top: `--help` must not import pandas (tests/test_startup.py).
    from profkit.analysis import compare as compare_lib
    from profkit.formats import check_format
    from profkit.run import bench as bench_lib
    from profkit.run.results import check_db

    check_format(fmt)
    configs = workload.configs()
    if compare is not None:  # a sweep with one dtype has nothing to compare: say so now
        compare_lib.check_sweep(compare, (getattr(c, compare, None) for c in configs))
    # `--device cuda` without CUDA, a corrupt DB: one line, before the bar or any child.
    bench_lib.resolve_devices(configs)
    check_db(db)
    _hint_on_cpu(configs)
    with step_progress(configs) as (on_start, on_row, on_step):
        rows = bench_lib.bench(configs, db, resume, timeout, on_start, on_row, on_step)
    err_console.print(f"results database: {db}", highlight=False)
    if compare is not None:
        render_comparison(compare_lib.compare(rows, compare), fmt, out)
    else:
        render_rows(rows, fmt, out)
    if rows and all(row.get("status") == "error" for row in rows):  # nothing measured
        raise ProfkitError(
            f"every config failed ({len(rows)} with status error); the rows, with their "
            f"errors, are in {db}"
        )


def _hint_on_cpu(configs: list[WorkloadConfig]) -> None:
    """A CPU sweep of anything but `tiny` takes minutes: say so before it starts."""
    from profkit.run import bench as bench_lib

    devices = bench_lib.resolve_devices(configs)
    slow = [c for c in configs if devices[c.device] == "cpu" and c.size != "tiny"]
    if slow:
        sizes = ", ".join(dict.fromkeys(c.size for c in slow))
        err_console.print(
            f"[dim]note: on a CPU, {sizes} takes seconds to minutes per step "
            f"({sum((c.warmup + c.steps) for c in slow)} steps in all); "
            "`--size tiny` (or `profkit demo`) runs in seconds[/]",
            highlight=False,
            soft_wrap=True,
        )
