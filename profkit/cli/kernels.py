"""``profkit kernels``: per-kernel, per-phase, per-range and per-category tables of a trace."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from profkit.cli._common import FormatOpt, NsysOpt, OutOpt, PhaseRangesOpt, command
from profkit.cli.app import app
from profkit.cli.render import console, emit_tables, err_console, read_progress
from profkit.errors import BadInput

if TYPE_CHECKING:  # the rest is imported where used: `--help` does not import pandas
    from profkit.analysis.node_parts import NodeRanks, Options
    from profkit.analysis.phase_marks import PhaseRanges
    from profkit.analysis.phase_ranges import PhaseMode
    from profkit.analysis.report_types import KernelReport
    from profkit.traces.host_calls import HostTrace
    from profkit.traces.job import Job

PathArg = Annotated[
    list[Path],
    typer.Argument(
        metavar="TRACE...",
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
FindingsOpt = Annotated[
    bool,
    typer.Option(
        "--findings",
        help="Print only the findings: what to fix first, with the milliseconds it would "
        "give back and the evidence (docs/FINDINGS.md).",
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
        "of one run), show this rank's tables only. Of a job of more than 8 ranks the "
        "terminal shows distributions across ranks; with --rank, this rank's rows too.",
    ),
]
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        "--plot",
        help="Of a multi-rank trace: draw one step per rank as lanes (compute vs NCCL) and "
        "per-rank phase bars into this PNG; of more than 8 ranks, those of the slowest, a "
        "median and the fastest rank, and heatmaps of every rank's step time and exposed NCCL.",
    ),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="Read the files on N local Dask worker processes, each node's ranks analysed "
        "where it is read (pip install 'profkit[dask]'; docs/MULTI_GPU.md).",
        show_default=False,
    ),
]
SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        help="Read the files on an existing Dask cluster: its scheduler's address "
        "(tcp://HOST:8786) or scheduler file. Paths are the workers' (a shared filesystem).",
        show_default=False,
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
    phase_ranges: PhaseRangesOpt = None,
    no_cache: NoCacheOpt = False,
    findings: FindingsOpt = False,
    workers: WorkersOpt = None,
    scheduler: SchedulerOpt = None,
) -> None:
    """Where the GPU time goes: phases, top kernels, ranges and categories of a trace.

    Backward kernels, which PyTorch launches from autograd threads, count in the backward phase (docs/ATTRIBUTION.md). A multi-GPU trace (one nsys report of torchrun, several nodes' reports of one job, or the per-rank torch traces of one run) is reported per rank, with NCCL time and its overlap with compute (docs/MULTI_GPU.md). Library NVTX ranges (NCCL, CUB, cuDNN, PyTorch's op ranges) are never phases; your own marks in any domain are, with `--phase-ranges`. Steps without forward/backward/optimizer ranges get their phases inferred, marked (inferred); `--phases` forces one source. Other sets of traces are compared side by side (`--compare`).
    """
    from profkit import analysis
    from profkit.analysis.findings import findings_markdown
    from profkit.analysis.job_view import (
        HOW_TO_SEE_ALL,
        job_tables,
        many_ranks,
        one_rank_tables,
    )
    from profkit.analysis.phase_marks import PhaseRanges
    from profkit.analysis.presentation import rank_tables
    from profkit.analysis.report_types import RankedReport
    from profkit.formats import check_format, file_format, write_text
    from profkit.memory.plot import check_image_path
    from profkit.traces.host_calls import host_traces
    from profkit.traces.job import load

    check_format(fmt)
    if not tolerance >= 0:  # also catches nan
        raise BadInput(f"--tolerance must be >= 0 (a percentage); got {tolerance:g}")
    if plot is not None:
        check_image_path(plot)
    mode = _mode(phases)
    marks = PhaseRanges.parse(phase_ranges)
    paths = list(path)
    label = paths[0].name if len(paths) == 1 else f"{len(paths)} traces"
    cache = False if no_cache else None
    if workers is None and scheduler is None:
        with read_progress(label) as progress:
            job = load(paths, nsys, cache, progress, side_by_side=compare)
        nodes, hosts = None, None
    else:
        from profkit.analysis.node_parts import Options

        options = Options(top, phase, range_, mode, marks, rank_tables=rank is not None)
        job, nodes, hosts = _read_on_dask(workers, scheduler, paths, nsys, cache, compare, options)
    if compare or job.kind == "side_by_side":
        if rank is not None:
            raise BadInput(f"--rank picks a rank of one job's traces; {_apart(job)}")
        _compare(job, top, phase, range_, mode, tolerance, fmt, out, plot, marks)
        return
    if hosts is None:
        hosts = host_traces(job.paths, job.files)
    report = analysis.kernel_report(
        job, top, phase, range_, rank, mode, consume=True, phase_ranges=marks, hosts=hosts,
        nodes=nodes,
    )  # fmt: skip
    names = ", ".join(p.name for p in paths)
    if findings:
        _findings_only(report, file_format(fmt, out), out)
        return
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
    if fmt == "table" and report.findings:
        console.print("[bold]Findings[/] (docs/FINDINGS.md; all of them: --findings -f json)")
        for line in findings_markdown(report.findings).splitlines()[2:]:
            console.print(line, highlight=False, markup=False)
    terminal = fmt == "table"  # md, csv, json (and --out) keep every row
    tables = [] if fmt == "json" else analysis.display_tables(report, fmt == "csv", terminal)
    if isinstance(report, RankedReport) and fmt != "json":
        # A person reads a job of many ranks as distributions; files keep every rank.
        if fmt == "table" and out is None and many_ranks(report):
            many = job_tables(report) if rank is None else one_rank_tables(report, rank)
            tables = many + tables
            console.print(
                f"[dim]{report.world_size:,} ranks, shown as one job. {HOW_TO_SEE_ALL}[/]"
            )
        else:
            tables = rank_tables(report, terminal) + tables
    emit_tables(tables, fmt, out, json_value=report.to_json() if fmt == "json" else None)
    if fmt == "table":
        for note in report.notes:
            console.print(f"[dim]• {note}[/]", highlight=False)


def _read_on_dask(
    workers: int | None,
    scheduler: str | None,
    paths: list[Path],
    nsys: str | None,
    cache: bool | None,
    compare: bool,
    options: Options,
) -> tuple[Job, list[NodeRanks | None], list[HostTrace] | None]:
    """``--workers``/``--scheduler``: the job read on Dask workers, each node's ranks
    analysed where its file lies, and the host traces its findings need (an empty list
    where the nodes brought their host findings; None: read them here, as in one
    process, where a file's part lacks them)."""
    from profkit.cluster.client import dask_client
    from profkit.cluster.tasks import load_on

    label = paths[0].name if len(paths) == 1 else f"{len(paths)} traces"
    with dask_client(workers, scheduler) as client, read_progress(label) as progress:
        job, parts = load_on(client, paths, nsys, cache, progress, side_by_side=compare,
                             options=options, findings=True)  # fmt: skip
    nodes = [p.node for p in parts]
    if job.kind in ("nodes", "ranks") and all(n is not None for n in nodes):
        return job, nodes, []  # each file's host findings came with its ranks
    hosts = [p.host for p in parts if p.host is not None]
    return job, nodes, hosts if len(hosts) == len(parts) else None


def _findings_only(report: KernelReport, fmt: str, out: Path | None) -> None:
    """``--findings``: the findings alone (JSON: the list; else one line each)."""
    import pandas as pd

    from profkit.analysis.findings import findings_markdown
    from profkit.formats import write_text

    found = report.findings or []
    if fmt == "json":
        emit_tables([], fmt, out, json_value=found)
        return
    if fmt == "csv":  # one row a finding, its evidence left to the JSON
        columns = ["kind", "severity", "recoverable_ms", "share", "rank", "phase", "advice"]
        table = pd.DataFrame([{c: f[c] for c in columns} for f in found], columns=columns)
        emit_tables([("findings", table)], fmt, out)
        return
    text = findings_markdown(found, top=len(found) or 1)
    if fmt == "table":
        text = "\n".join(line.removeprefix("- ") for line in text.splitlines()[2:]) + "\n"
    if out is None:
        print(text, end="")
    else:
        write_text(out, text)
        err_console.print(f"wrote {out}")


def _apart(job: Job) -> str:
    """How a side-by-side set is told apart from one job, for refusals."""
    why = f" ({job.why_apart})" if job.why_apart else ""
    return f"these traces are compared side by side{why}"


def _compare(
    job: Job,
    top: int,
    phase: str | None,
    range_: str | None,
    phases: PhaseMode,
    tolerance: float,
    fmt: str,
    out: Path | None,
    plot: Path | None,
    marks: PhaseRanges | None = None,
) -> None:
    """Traces side by side: their phases per step, each against the first."""
    from profkit import analysis
    from profkit.analysis.presentation import TERMINAL_ROWS
    from profkit.formats import file_format

    if job.why_apart is not None:
        err_console.print(
            f"[dim]compared side by side, not read as one job: {job.why_apart}[/]", highlight=False
        )
    if plot is not None:
        raise BadInput(
            "--plot draws the ranks of one multi-GPU run; these traces are compared "
            "side by side instead"
        )
    compared = analysis.side_by_side(job, top, phase, range_, phases, tolerance, marks)
    for label, p in zip(compared.labels, job.paths, strict=True):
        err_console.print(f"{label} = {p}", highlight=False)
    title = (
        "Per step: kernel launches and GPU ms (kernels, memcpy, memset) of each phase, "
        f"each trace against {compared.labels[0]}"
    )
    table = compared.table
    if file_format(fmt, out) == "table":  # md, csv, json keep every phase
        table, cut = compared.terminal_table()
        if cut:
            title += (
                f" (the {TERMINAL_ROWS} phases with most GPU time; all: -f md/csv/json or --out)"
            )
    emit_tables([(title, table)], fmt, out, json_value=compared.table)


def _mode(phases: str) -> PhaseMode:
    from profkit.analysis.phase_ranges import PHASE_MODES

    if phases not in PHASE_MODES:
        raise BadInput(f"--phases must be one of {', '.join(PHASE_MODES)}, got {phases!r}")
    return cast("PhaseMode", phases)
