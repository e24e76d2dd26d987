"""``profkit torch``: torch.profiler key_averages tables and Chrome traces for one config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from profkit.cli._common import (
    FormatOpt,
    OutDirOpt,
    OutOpt,
    WorkloadOptions,
    command,
    workload_options,
)
from profkit.cli.app import app
from profkit.cli.render import emit_tables, err_console, progress_bar
from profkit.errors import BadInput
from profkit.files import check_not_written
from profkit.torchprof.tables import SORT_CHOICES

if TYPE_CHECKING:  # the rest is imported where used: `--help` does not import pandas
    from rich.progress import TaskID

    from profkit.workload.config import WorkloadConfig

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
ROW_LIMIT = 25
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


@command(app, name="torch")
@workload_options(single=True, steps=1)
def torch_(
    workload: WorkloadOptions,
    record_shapes: RecordShapesOpt = False,
    with_stack: WithStackOpt = False,
    profile_memory: ProfileMemoryOpt = False,
    sort: SortOpt = None,
    row_limit: RowLimitOpt = ROW_LIMIT,
    group_by_shape: GroupByShapeOpt = False,
    name: NameOpt = None,
    out_dir: OutDirOpt = None,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """torch.profiler tables (key_averages) for a forward-only run and the full step.

    Records only the timed steps (--steps, default 1 as in the course's tables) after the warm-up, prints both tables, and writes the Chrome traces OUT_DIR/NAME-forward.json.gz and OUT_DIR/NAME-MODE.json.gz (open them in ui.perfetto.dev or chrome://tracing, or read them with `profkit kernels`) and the report NAME.md (in reports/, or OUT_DIR when given).
    """
    from profkit.formats import check_format
    from profkit.torchprof import profile as torchprof
    from profkit.torchprof.report import TABLE_DIGITS
    from profkit.torchprof.result import TorchOptions

    check_format(fmt)
    config = workload.config("torch")
    if out is not None:
        check_not_written(out, torchprof.written_paths(config, name, out_dir))
    if config.nproc > 1:
        one_process_options = {  # they shape torch.profiler's table of one process
            "--record-shapes": record_shapes,
            "--with-stack": with_stack,
            "--profile-memory": profile_memory,
            "--sort": sort is not None,
            "--row-limit": row_limit != ROW_LIMIT,
            "--group-by-shape": group_by_shape,
        }
        typed = [flag for flag, used in one_process_options.items() if used]
        if typed:
            raise BadInput(
                f"{', '.join(typed)}: torch.profiler's table of one process; with --nproc "
                f"{config.nproc} each rank writes a Chrome trace and profkit reads them as "
                "ranks, so leave it out"
            )
        _ranks(config, name, out_dir, fmt, out)
        return
    options = TorchOptions(
        record_shapes=record_shapes,
        with_stack=with_stack,
        profile_memory=profile_memory,
        sort=sort,
        row_limit=row_limit,
        group_by_shape=group_by_shape,
    )
    with progress_bar() as progress:
        tasks: dict[str, TaskID] = {}

        def on_step(run_mode: str, done: int, total: int) -> None:
            if run_mode not in tasks:
                tasks[run_mode] = progress.add_task(f"torch.profiler {run_mode}", total=total)
            progress.update(tasks[run_mode], completed=done)

        result = torchprof.profile_torch(
            config, options, name=name, out_dir=out_dir, on_step=on_step
        )
    emit_tables(result.tables(), fmt, out, json_value=result.to_dict(), digits=TABLE_DIGITS)
    for warning in result.warnings:
        err_console.print(f"[yellow]note:[/] {warning}", highlight=False)
    written = [str(run.trace_path) for run in result.runs] + [str(result.report_path)]
    err_console.print(f"wrote {', '.join(written)}", highlight=False, soft_wrap=True)


def _ranks(
    config: WorkloadConfig, name: str | None, out_dir: Path | None, fmt: str, out: Path | None
) -> None:
    """Several ranks: one trace per rank, then their per-rank kernel tables."""
    from profkit.analysis import display_tables, kernel_report, kernel_report_markdown
    from profkit.analysis.presentation import rank_tables
    from profkit.analysis.report_types import RankedReport
    from profkit.files import output_dirs
    from profkit.formats import file_format
    from profkit.torchprof import profile as torchprof
    from profkit.torchprof.ranks import profile_ranks, ranks_report_markdown
    from profkit.torchprof.report import title as report_title
    from profkit.traces.host_calls import host_traces
    from profkit.traces.job import load

    name = torchprof.check_name(name or torchprof.default_name(config))
    artefacts, reports = output_dirs(out_dir)
    with err_console.status(f"torch.profiler on {config.nproc} ranks"):
        run = profile_ranks(config, name, artefacts)
        job = load(list(run.traces))
        if job.kind != "ranks":  # each rank's trace names its rank: one without is no rank's
            names = ", ".join(Path(p).name for p in run.traces)
            raise BadInput(f"{names}: not the traces of one run's ranks (each names its own)")
        report = kernel_report(job, consume=True, hosts=host_traces(job.paths, job.files))
    title = report_title(config, name)
    markdown = ranks_report_markdown(config, run, kernel_report_markdown(report, title))
    report_path = reports / f"{name}.md"
    torchprof.write_report(report_path, markdown)
    terminal = file_format(fmt, out) == "table"
    tables = display_tables(report, terminal=terminal)
    if isinstance(report, RankedReport):
        tables = rank_tables(report, terminal) + tables
    emit_tables(tables, fmt, out, json_value=report.to_json())
    written = ", ".join(str(p) for p in [*run.traces, report_path])
    err_console.print(f"wrote {written}", highlight=False, soft_wrap=True)
