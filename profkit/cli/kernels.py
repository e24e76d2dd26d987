"""``profkit kernels``: per-kernel, per-phase, per-range and per-category tables of a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from profkit import analysis
from profkit.cli import app
from profkit.cli._common import FormatOpt, OutOpt, command
from profkit.render import check_format, console, emit_tables, err_console, write_text

PathArg = Annotated[
    Path,
    typer.Argument(
        help="Trace file: Nsight Systems .sqlite or .nsys-rep (exported with nsys and cached "
        "beside it), or a torch.profiler Chrome trace .json[.gz].",
        show_default=False,
    ),
]
PhaseOpt = Annotated[
    str | None,
    typer.Option("--phase", "-p", help="Only kernels of this phase (forward, backward, ...)."),
]
RangeOpt = Annotated[
    str | None,
    typer.Option(
        "--range", "-r", help="Only kernels inside ranges of this name ('domain:name' for others)."
    ),
]
TopOpt = Annotated[int, typer.Option("--top", "-n", help="Kernels per top table (0 = all).")]
NsysOpt = Annotated[
    str | None,
    typer.Option("--nsys", help="nsys to export a .nsys-rep with (else PROFKIT_NSYS, else PATH)."),
]


@command(app)
def kernels(
    path: PathArg,
    phase: PhaseOpt = None,
    range_: RangeOpt = None,
    top: TopOpt = 20,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
    nsys: NsysOpt = None,
) -> None:
    """Where the GPU time goes: phases, top kernels, ranges and categories of a trace.

    Backward kernels, which PyTorch launches from autograd threads, count in the backward phase (docs/ATTRIBUTION.md).
    """
    check_format(fmt)
    with err_console.status(f"reading {path.name}"):
        report = analysis.kernels(path, top=top, phase=phase, range=range_, nsys=nsys)
    if fmt == "md" or (fmt == "table" and out is not None):
        text = analysis.kernel_report_markdown(report, title=f"Kernels of {path.name}")
        if out is None:
            print(text, end="")
        else:
            write_text(out, text)
            err_console.print(f"wrote {out}")
        return
    emit_tables(analysis.display_tables(report), fmt, out, json_value=report.to_json())
    if fmt == "table":
        for note in report.notes:
            console.print(f"[dim]• {note}[/]", highlight=False)
