"""``profkit torch``: torch.profiler key_averages tables and Chrome traces for one config."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from profkit.cli._common import (
    AttentionOpt,
    BatchOpt,
    Bf16Opt,
    CompileOpt,
    CtxOpt,
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
    single_config,
    workload_configs,
)
from profkit.cli.app import app
from profkit.cli.render import emit_tables, err_console
from profkit.formats import check_format
from profkit.torchprof import profile as torchprof
from profkit.torchprof.report import TABLE_DIGITS
from profkit.torchprof.result import TorchOptions
from profkit.torchprof.tables import SORT_CHOICES

RecordShapesOpt = Annotated[
    bool, typer.Option("--record-shapes", help="Record input shapes (torch.profiler).")
]
WithStackOpt = Annotated[
    bool,
    typer.Option("--with-stack", help="Record Python stacks; rows split by their top call sites."),
]
ProfileMemoryOpt = Annotated[
    bool, typer.Option("--profile-memory", help="Add memory columns (allocated per op).")
]
SortOpt = Annotated[
    str | None,
    typer.Option(
        "--sort",
        help=f"Sort rows by: {' | '.join(SORT_CHOICES)}, or a key_averages name "
        "(self_device_time_total...). Default: self_cuda on CUDA, else self_cpu.",
        show_default=False,
    ),
]
RowLimitOpt = Annotated[int, typer.Option("--row-limit", help="Rows per table; 0 shows all.")]
GroupByShapeOpt = Annotated[
    bool,
    typer.Option(
        "--group-by-shape", help="One row per op and input shapes (turns on --record-shapes)."
    ),
]
NameOpt = Annotated[
    str | None,
    typer.Option(
        "--name",
        help="Run name for the files (default: torch-SIZE-ctxCTX, e.g. torch-large-ctx256).",
        show_default=False,
    ),
]
OutDirOpt = Annotated[
    Path, typer.Option("--out-dir", help="Where the Chrome traces (NAME-MODE.json.gz) go.")
]


@command(app, name="torch")
def torch_(
    size: SizeOpt = [],  # noqa: B006 - typer reads list defaults, never mutates them
    ctx: CtxOpt = [],  # noqa: B006
    batch: BatchOpt = [],  # noqa: B006
    mode: ModeOpt = [],  # noqa: B006
    dtype: DtypeOpt = [],  # noqa: B006
    bf16: Bf16Opt = False,
    compile: CompileOpt = "no",
    attention: AttentionOpt = [],  # noqa: B006
    warmup: WarmupOpt = [],  # noqa: B006
    steps: StepsOpt = 1,
    device: DeviceOpt = "auto",
    threads: ThreadsOpt = None,
    record_shapes: RecordShapesOpt = False,
    with_stack: WithStackOpt = False,
    profile_memory: ProfileMemoryOpt = False,
    sort: SortOpt = None,
    row_limit: RowLimitOpt = 25,
    group_by_shape: GroupByShapeOpt = False,
    name: NameOpt = None,
    out_dir: OutDirOpt = Path("profiles"),
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """torch.profiler tables (key_averages) for a forward-only run and the full step.

    Records only the timed steps (--steps, default 1 as in the course's tables) after the warm-up, prints both tables, and writes the Chrome traces OUT_DIR/NAME-forward.json.gz and OUT_DIR/NAME-MODE.json.gz (open them in ui.perfetto.dev or chrome://tracing, or read them with `profkit kernels`) and the report reports/NAME.md.
    """
    check_format(fmt)
    configs = workload_configs(
        size, ctx, batch, mode, dtype, bf16, compile, attention, warmup, steps, device
    )
    config = single_config(configs, "torch").replace(threads=threads)
    options = TorchOptions(
        record_shapes=record_shapes,
        with_stack=with_stack,
        profile_memory=profile_memory,
        sort=sort,
        row_limit=row_limit,
        group_by_shape=group_by_shape,
    )
    columns = (
        TextColumn("[bold]torch.profiler[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    # Off a terminal the bar is off: a transient bar there leaves a blank line on stderr.
    bar = Progress(
        *columns, console=err_console, transient=True, disable=not err_console.is_terminal
    )
    with bar as progress:
        tasks: dict[str, TaskID] = {}

        def on_step(run_mode: str, done: int, total: int) -> None:
            if run_mode not in tasks:
                tasks[run_mode] = progress.add_task(run_mode, total=total)
            progress.update(tasks[run_mode], completed=done)

        result = torchprof.profile_torch(
            config, options, name=name, out_dir=out_dir, on_step=on_step
        )
    emit_tables(result.tables(), fmt, out, json_value=result.to_dict(), digits=TABLE_DIGITS)
    for warning in result.warnings:
        err_console.print(f"[yellow]note:[/] {warning}", highlight=False)
    written = [str(run.trace_path) for run in result.runs] + [str(result.report_path)]
    err_console.print(f"wrote {', '.join(written)}", highlight=False, soft_wrap=True)
