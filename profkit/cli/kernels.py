"""``profkit kernels``: per-kernel, per-phase, per-range and per-category tables of a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from profkit import analysis
from profkit.cli._common import FormatOpt, OutOpt, command
from profkit.cli.app import app
from profkit.cli.render import console, emit_tables, err_console, read_progress
from profkit.errors import BadInput
from profkit.formats import check_format, file_format, write_text

PathArg = Annotated[
    list[Path],
    typer.Argument(
        help="Trace file(s): Nsight Systems .sqlite or .nsys-rep (exported with nsys and cached "
        "beside it), or a torch.profiler Chrome trace .json[.gz]. Two or more paths compare "
        "them (as with --compare).",
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


NoCacheOpt = Annotated[
    bool,
    typer.Option(
        "--no-cache",
        help="Read the trace itself, neither using nor writing the columnar cache kept in "
        "PROFKIT_CACHE_DIR or ~/.cache/profkit (or set PROFKIT_CACHE=0).",
    ),
]
CompareOpt = Annotated[
    bool,
    typer.Option(
        "--compare",
        help="Several traces of one config (e.g. nsys .sqlite and torch .json.gz): phase "
        "times per step side by side, each against the first. Implied by two or more paths.",
    ),
]
ToleranceOpt = Annotated[
    float,
    typer.Option("--tolerance", help="With --compare: agreement threshold in % (>= 0)."),
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
    compare: CompareOpt = False,
    tolerance: ToleranceOpt = 5.0,
    no_cache: NoCacheOpt = False,
) -> None:
    """Where the GPU time goes: phases, top kernels, ranges and categories of a trace.

    Backward kernels, which PyTorch launches from autograd threads, count in the backward phase (docs/ATTRIBUTION.md). Two or more traces are compared side by side (`--compare`).
    """
    check_format(fmt)
    if not tolerance >= 0:  # also catches nan
        raise BadInput(f"--tolerance must be >= 0 (a percentage); got {tolerance:g}")
    paths = list(path)
    cache = False if no_cache else None
    if compare or len(paths) > 1:
        _compare(paths, top, phase, range_, nsys, tolerance, fmt, out, cache)
        return
    single = paths[0]
    with read_progress(single.name) as progress:
        report = analysis.kernels(
            single, top=top, phase=phase, range=range_, nsys=nsys, cache=cache, progress=progress
        )
    fmt = file_format(fmt, out)
    if fmt == "md":
        text = analysis.kernel_report_markdown(report, title=f"Kernels of {single.name}")
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


def _compare(
    paths: list[Path],
    top: int,
    phase: str | None,
    range_: str | None,
    nsys: str | None,
    tolerance: float,
    fmt: str,
    out: Path | None,
    cache: bool | None,
) -> None:
    from profkit.analysis.crosscheck import compare_phases, per_step

    if len(paths) < 2:
        raise BadInput("--compare needs two or more traces (e.g. run.sqlite run.json.gz)")
    reports = []
    for p in paths:
        with err_console.status(f"reading {p.name}"):
            report = analysis.kernels(p, top=top, phase=phase, range=range_, nsys=nsys, cache=cache)
        reports.append((BACKENDS.get(report.source.get("format", ""), p.stem), report.phases))
    # Short labels keep the table readable: the backend, numbered if two traces share one.
    labels = [label for label, _ in reports]
    labels = [
        f"{x}#{labels[:i].count(x) + 1}" if labels.count(x) > 1 else x for i, x in enumerate(labels)
    ]
    for label, p in zip(labels, paths, strict=True):
        err_console.print(f"{label} = {p}", highlight=False)
    steps = [(label, per_step(phases)) for label, (_, phases) in zip(labels, reports, strict=True)]
    table = compare_phases(steps, tolerance_pct=tolerance)
    title = (
        "Per step: kernel launches and GPU ms (kernels, memcpy, memset) of each phase, "
        f"each trace against {labels[0]}"
    )
    emit_tables([(title, table)], fmt, out, json_value=table)


BACKENDS = {"nsys-sqlite": "nsys", "chrome": "torch"}
