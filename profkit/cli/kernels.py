"""``profkit kernels``: per-kernel, per-phase, per-range and per-category tables of a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer

from profkit import analysis
from profkit.analysis.attribution import PHASE_MODES, PhaseMode
from profkit.analysis.nodes import (
    NodeFacts,
    is_nccl_trace,
    merge_node_traces,
    not_one_job,
    why_not_one_job,
)
from profkit.analysis.ranks import RankedReport, rank_tables
from profkit.analysis.report import KernelReport
from profkit.analysis.stream_nodes import analyze_node_columns, node_facts
from profkit.cli._common import FormatOpt, NsysOpt, OutOpt, command
from profkit.cli.app import app
from profkit.cli.render import console, emit_tables, err_console, read_progress
from profkit.errors import BadInput
from profkit.formats import check_format, file_format, write_text
from profkit.memory.plot import check_image_path
from profkit.traces import Trace
from profkit.traces.load import load_columns_of, load_traces
from profkit.traces.nsys_stream import keeps_start_times

PathArg = Annotated[
    list[Path],
    typer.Argument(
        help="Trace file(s): Nsight Systems .sqlite or .nsys-rep (exported with nsys and cached "
        "beside it), or a torch.profiler Chrome trace .json[.gz]. Several paths: the per-rank "
        "torch traces of one run, or several nodes' nsys reports of one job, are read as one "
        "job; other sets are compared (as with --compare).",
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
PhasesOpt = Annotated[
    str,
    typer.Option(
        "--phases",
        help="Where phases come from: auto (phase ranges where a step has them, else inferred "
        "from autograd threads and optimizer kernels), annotated, or inferred.",
    ),
]
TopOpt = Annotated[int, typer.Option("--top", "-n", help="Kernels per top table (0 = all).")]


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
        "times per step side by side, each against the first. Implied by two or more paths, "
        "unless they are the ranks or nodes of one job.",
    ),
]
RankOpt = Annotated[
    int | None,
    typer.Option(
        "--rank",
        help="Of a multi-rank trace (a multi-process nsys export, or per-rank torch traces "
        "of one run), show this rank's tables only.",
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="Of a multi-rank trace: draw one step per rank as lanes (compute vs NCCL) and "
        "per-rank phase bars into this PNG.",
    ),
]
ToleranceOpt = Annotated[
    float,
    typer.Option("--tolerance", help="With --compare: agreement threshold in % (>= 0)."),
]


@command(app, outputs=("out", "plot"))
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
    rank: RankOpt = None,
    plot: PlotOpt = None,
    phases: PhasesOpt = "auto",
    no_cache: NoCacheOpt = False,
) -> None:
    """Where the GPU time goes: phases, top kernels, ranges and categories of a trace.

    Backward kernels, which PyTorch launches from autograd threads, count in the backward phase (docs/ATTRIBUTION.md). A multi-GPU trace (one nsys report of torchrun, several nodes' reports of one job, or the per-rank torch traces of one run) is reported per rank, with NCCL time and its overlap with compute (docs/MULTI_GPU.md). Steps without forward/backward/optimizer ranges get their phases inferred, marked (inferred); `--phases` forces one source. Other sets of traces are compared side by side (`--compare`).
    """
    check_format(fmt)
    if not tolerance >= 0:  # also catches nan
        raise BadInput(f"--tolerance must be >= 0 (a percentage); got {tolerance:g}")
    if plot is not None:
        check_image_path(plot)
    paths = list(path)
    report: KernelReport | None = None
    cache = False if no_cache else None
    if len(paths) > 1 and not compare:
        report = _nodes_streamed(paths, nsys, no_cache, top, phase, range_, rank, _mode(phases))
        if report is None:
            with read_progress(f"{len(paths)} traces") as progress:
                report = analysis.rank_kernels(
                    paths, top, phase, range_, nsys, rank, _mode(phases), cache, progress
                )
    if report is None and (len(paths) > 1 or compare):
        with read_progress(f"{len(paths)} traces") as progress:
            traces = load_traces(paths, nsys, progress)
        merged = None if compare or len(traces) < 2 else _one_job(traces)
        if merged is not None:
            report = analysis.analyze_any(merged, top, phase, range_, rank, _mode(phases))
        else:
            if plot is not None:
                raise BadInput(
                    "--plot draws the ranks of one multi-GPU run; these traces are compared "
                    "side by side instead"
                )
            _compare(paths, traces, top, phase, range_, tolerance, fmt, out, phases)
            return
    elif report is None:
        with read_progress(paths[0].name) as progress:
            report = analysis.kernels(
                paths[0], top, phase, range_, nsys, rank, _mode(phases),
                cache=cache, progress=progress,
            )  # fmt: skip
    names = ", ".join(p.name for p in paths)
    if plot is not None:
        if not isinstance(report, RankedReport):
            raise BadInput("--plot draws the ranks of a multi-GPU trace; this one has one process")
        from profkit.report.rank_plots import plot_ranks

        err_console.print(f"wrote {plot_ranks(report, plot)}", highlight=False)
    fmt = file_format(fmt, out)
    if fmt == "md":
        text = analysis.kernel_report_markdown(report, title=f"Kernels of {names}")
        if out is None:
            print(text, end="")
        else:
            write_text(out, text)
            err_console.print(f"wrote {out}")
        return
    tables = analysis.display_tables(report, as_data=fmt == "csv")
    if isinstance(report, RankedReport):
        tables = rank_tables(report) + tables
    emit_tables(tables, fmt, out, json_value=report.to_json())
    if fmt == "table":
        for note in report.notes:
            console.print(f"[dim]• {note}[/]", highlight=False)


def _nodes_streamed(
    paths: list[Path],
    nsys: str | None,
    no_cache: bool,
    top: int,
    phase: str | None,
    range_: str | None,
    rank: int | None,
    phases: PhaseMode,
) -> RankedReport | None:
    """Several nodes' multi-GPU exports of one job, read as compact columns (each through
    the cache) and analysed in bounded memory; None where the full tables must read them:
    other files, a node of one GPU, inferred phases, or what the columns cannot settle."""
    if phases == "inferred" or not all(keeps_start_times(p) for p in paths):
        return None
    try:
        with read_progress(f"{len(paths)} traces") as progress:
            columns = load_columns_of(paths, nsys, False if no_cache else None, progress)
    except BadInput:  # the full tables' read says what is wrong (or reads what these cannot)
        return None
    facts = [node_facts(c) for c in columns]
    if any(f is None for f in facts) or why_not_one_job(cast(list[NodeFacts], facts)):
        return None
    return analyze_node_columns(columns, top, phase, range_, rank, consume=True)


def _one_job(traces: list[Trace]) -> Trace | None:
    """The traces merged where they are the nodes (nsys) of one job (the ranks of one run
    were read by :func:`analysis.rank_kernels` before); else None (they are compared),
    saying why where they are all multi-GPU nsys exports."""
    why = not_one_job(traces)
    if why is None:
        return merge_node_traces(traces)
    if all(t.meta.get("format") == "nsys-sqlite" and is_nccl_trace(t) for t in traces):
        err_console.print(
            f"[dim]compared side by side, not read as one job: {why}[/]", highlight=False
        )
    return None


def _compare(
    paths: list[Path],
    traces: list[Trace],
    top: int,
    phase: str | None,
    range_: str | None,
    tolerance: float,
    fmt: str,
    out: Path | None,
    phases: str,
) -> None:
    from profkit.analysis.crosscheck import compare_phases, per_step

    if len(paths) < 2:
        raise BadInput("--compare needs two or more traces (e.g. run.sqlite run.json.gz)")
    reports = []
    for trace, p in zip(traces, paths, strict=True):
        report = analysis.analyze(trace, top=top, phase=phase, range=range_, phases=_mode(phases))
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


def _mode(phases: str) -> PhaseMode:
    if phases not in PHASE_MODES:
        raise BadInput(f"--phases must be one of {', '.join(PHASE_MODES)}, got {phases!r}")
    return cast(PhaseMode, phases)
