"""``profkit bench``: the timing sweep, one process per config, rows into the results DB."""

from __future__ import annotations

from typing import Annotated

import typer

from profkit.analysis import compare as compare_lib
from profkit.cli._common import (
    AttentionOpt,
    BatchOpt,
    Bf16Opt,
    CompileOpt,
    CtxOpt,
    DbOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    ModeOpt,
    OutOpt,
    SizeOpt,
    StepsOpt,
    ThreadsOpt,
    WarmupOpt,
    command,
    workload_configs,
)
from profkit.cli.app import app
from profkit.cli.render import err_console
from profkit.cli.views import render_comparison, render_rows, sweep_progress
from profkit.errors import BadInput
from profkit.formats import check_format
from profkit.run import bench as bench_lib
from profkit.run.results import DEFAULT_DB, check_db

ResumeOpt = Annotated[
    bool, typer.Option("--resume", help="Skip configs the DB already holds (ok or oom).")
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", help="Seconds per config before its process is killed."),
]
CompareOpt = Annotated[
    str | None,
    typer.Option(
        "--compare",
        help="Print the sweep as a comparison of this field instead: "
        "dtype | compile | warmup | attention | mode (see `profkit compare`).",
    ),
]


@command(app)
def bench(
    size: SizeOpt = [],  # noqa: B006 - typer reads list defaults, never mutates them
    ctx: CtxOpt = [],  # noqa: B006
    batch: BatchOpt = [],  # noqa: B006
    mode: ModeOpt = [],  # noqa: B006
    dtype: DtypeOpt = [],  # noqa: B006
    bf16: Bf16Opt = False,
    compile: CompileOpt = "no",
    attention: AttentionOpt = [],  # noqa: B006
    warmup: WarmupOpt = [],  # noqa: B006
    steps: StepsOpt = 10,
    device: DeviceOpt = "auto",
    threads: ThreadsOpt = None,
    db: DbOpt = DEFAULT_DB,
    resume: ResumeOpt = False,
    timeout: TimeoutOpt = None,
    compare: CompareOpt = None,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """Time forward, backward and optimizer over the cross product of the options.

    Each config runs in its own process: an OOM or a crash becomes a row with status
    oom|error and the sweep goes on. Every finished row is committed to the results DB at
    once (Ctrl-C keeps them); --resume skips configs already there. --compare dtype
    prints fp32 and bf16 side by side with Δ ms and Δ % instead of the rows.

    Example: profkit bench --size small medium --ctx 128 256 --mode forward train --bf16
    """
    check_format(fmt)
    if timeout is not None and timeout <= 0:
        raise BadInput(f"--timeout must be positive, got {timeout:g}")
    configs = workload_configs(
        size, ctx, batch, mode, dtype, bf16, compile, attention, warmup, steps, device
    )
    configs = [c.replace(threads=threads) for c in configs]
    if compare is not None:  # a sweep with one dtype has nothing to compare: say so now
        compare_lib.check_sweep(compare, (getattr(c, compare, None) for c in configs))
    # `--device cuda` without CUDA, a corrupt DB: one line, before the bar or any child.
    bench_lib.resolve_devices(configs)
    check_db(db)
    with sweep_progress(configs) as (on_start, on_row):
        rows = bench_lib.bench(configs, db, resume, timeout, on_start, on_row)
    err_console.print(f"results database: {db}", highlight=False)
    if compare is not None:
        render_comparison(compare_lib.compare(rows, compare), fmt, out)
    else:
        render_rows(rows, fmt, out)
