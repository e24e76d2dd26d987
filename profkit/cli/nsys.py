"""``profkit nsys``: the built-in workload, or your own program, under Nsight Systems."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from profkit.cli._common import NsysOpt, OutDirOpt, WorkloadOptions, command, workload_options
from profkit.cli.app import app
from profkit.cli.render import console, err_console
from profkit.errors import BadInput
from profkit.nsys.argv import DEFAULT_TRACE, NsysOptions

if TYPE_CHECKING:  # imported where used: `--help` does not import pandas (test_startup)
    from profkit.nsys import profile as nsys_lib

FORMATS = ("table", "md", "json")

ProgramArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Your program and its arguments, after `--` (e.g. `-- python train.py --lr 3e-4`). "
        "Without one, the built-in model runs.",
        show_default=False,
    ),
]
NameOpt = Annotated[
    str | None,
    typer.Option(
        "--name",
        help="File name of the run (default: the config label, e.g. large-ctx256-train-fp32, "
        "or your script's stem). Files of an earlier run with this name are overwritten.",
        show_default=False,
    ),
]
TraceOpt = Annotated[str, typer.Option("--trace", help="APIs nsys traces, comma-separated.")]
CudaMemoryOpt = Annotated[
    bool, typer.Option("--cuda-memory", help="Track GPU memory use (--cuda-memory-usage=true).")
]
BacktraceOpt = Annotated[
    bool,
    typer.Option(
        "--python-backtrace", help="Python stacks on CUDA API calls (--python-backtrace=cuda)."
    ),
]
SampleOpt = Annotated[
    bool,
    typer.Option(
        "--sample",
        help="Keep CPU sampling and context-switch tracing on (off by default: they make a "
        "run minutes slower and its report gigabytes larger).",
    ),
]
CaptureOpt = Annotated[
    str,
    typer.Option(
        "--capture-range",
        help="auto: only the timed steps of the built-in model (cudaProfilerApi), the whole "
        "program otherwise; or an nsys value: cudaProfilerApi | none | nvtx | hotkey.",
    ),
]
NsysArgOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--nsys-arg",
        help="One more nsys flag, passed through verbatim; repeatable. Write it with '=': "
        "--nsys-arg=--osrt-threshold=10000.",
        show_default=False,
    ),
]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format", "-f", help="table | md (the report) | json (the run record: the sidecar)."
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print the exact nsys command line and exit (with --format json: its argv and "
        "the files a run writes). Needs no nsys installed.",
    ),
]


@command(app)
@workload_options()
def nsys(
    program: ProgramArg = None,
    *,
    workload: WorkloadOptions,
    name: NameOpt = None,
    nsys: NsysOpt = None,
    trace: TraceOpt = DEFAULT_TRACE,
    cuda_memory: CudaMemoryOpt = False,
    python_backtrace: BacktraceOpt = False,
    sample: SampleOpt = False,
    capture_range: CaptureOpt = "auto",
    nsys_arg: NsysArgOpt = None,
    out_dir: OutDirOpt = None,
    fmt: FormatOpt = "table",
    dry_run: DryRunOpt = False,
) -> None:
    """Profile under Nsight Systems, export SQLite, print and write the kernel report.

    `profkit nsys --size large --ctx 256` runs the built-in model (CUDA needed) and captures
    only its timed steps; `profkit nsys -- python train.py ARGS` profiles your own program
    (mark its phases with `profkit.phase("forward")`). Writes OUT_DIR/NAME.nsys-rep, .sqlite,
    .profkit.json (config, Python phase times, timings) and .nsys.log, and NAME.md (in reports/, or OUT_DIR when given).
    """
    if fmt not in FORMATS:
        raise BadInput(f"unknown --format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    from profkit.nsys import profile as nsys_lib

    options = NsysOptions(
        trace=trace,
        capture_range=capture_range,
        cuda_memory=cuda_memory,
        python_backtrace=python_backtrace,
        sample=sample,
        extra_args=tuple(nsys_arg or ()),
    )
    target = _target(program, workload)
    if dry_run:
        plan = nsys_lib.plan(target, name, out_dir, options=options, nsys=nsys, require_nsys=False)
        _print_plan(plan, fmt)
        return
    _render(_profile(target, name, out_dir, options, nsys), fmt)


def _target(program: list[str] | None, workload: WorkloadOptions) -> nsys_lib.Target:
    """The user's program, or the built-in model's one config."""
    if not program:
        return workload.config("nsys")
    if workload.given:
        flags = ", ".join(f"--{p}" for p in workload.given)
        raise BadInput(f"{flags}: workload options apply to the built-in model, not a program")
    return program


def _print_plan(plan: nsys_lib.Plan, fmt: str) -> None:
    from profkit.formats import dumps

    if not plan.nsys_found:
        err_console.print(
            "note: nsys is not on PATH; the command shows it as `nsys`",
            highlight=False,
            soft_wrap=True,
        )
    print(dumps(plan.to_json()) if fmt == "json" else shlex.join(plan.argv))


def _profile(
    target: nsys_lib.Target,
    name: str | None,
    out_dir: Path | None,
    options: NsysOptions,
    nsys: str | None,
) -> nsys_lib.NsysRun:
    """Run nsys with progress on stderr; Ctrl-C says which files were kept."""
    from profkit.nsys import profile as nsys_lib
    from profkit.workload.config import WorkloadConfig

    try:
        if isinstance(target, WorkloadConfig):
            with err_console.status("starting") as status:
                return nsys_lib.profile(
                    target, name, out_dir, options=options, nsys=nsys, progress=status.update
                )
        # A program's own output streams through, to stderr: stdout is ours.
        return nsys_lib.profile(
            target, name, out_dir, options=options, nsys=nsys, echo=sys.stderr,
            progress=lambda message: err_console.print(f"[dim]profkit:[/] {message}"),
        )  # fmt: skip
    except nsys_lib.Interrupted as stop:
        kept = ", ".join(str(path) for path in stop.kept) or "nothing"
        err_console.print(f"stopped; kept {kept}", highlight=False, soft_wrap=True)
        raise KeyboardInterrupt from None


def _render(run: nsys_lib.NsysRun, fmt: str) -> None:
    from profkit.formats import dumps

    if fmt == "json":
        print(dumps(run.record))
    elif fmt == "md":
        print(run.report_markdown, end="")
    else:
        from rich.markdown import Markdown

        console.print(Markdown(run.report_markdown))
    files = run.files
    timings = run.record["timings_s"]
    parts = ", ".join(
        f"{label} {timings[key]:.1f} s"
        for key, label in (("nsys_profile", "nsys profile"), ("export", "export"),
                           ("analysis", "analysis"), ("total", "total"))
        if key in timings
    )  # fmt: skip
    err_console.print(
        f"wrote {files.report}, {files.sqlite}, {files.sidecar}, {files.markdown} ({parts})",
        highlight=False,
        soft_wrap=True,
    )
