"""The report's trace sections: Nsight Systems exports and torch.profiler traces.

Each trace gets a short part — phases, the top kernels, the attention sub-ranges — and a
link to its full kernel report (``reports/NAME.md``, which ``profkit nsys`` writes; written
here when it is missing or older than the trace). One unreadable trace costs its own part.

A multi-rank trace (one nsys export of a ``torchrun`` tree, or the per-rank torch.profiler
traces of one run, ``NAME-rank0.json.gz`` ...: one part for them all) adds its rank table
and its picture: one step per rank as lanes, compute vs NCCL, and per-rank phase bars
(``ranks-NAME.png``, :mod:`profkit.report.rank_plots`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.analysis.phase_marks import PhaseRanges
from profkit.analysis.report_types import RankedReport
from profkit.errors import ProfkitError
from profkit.formats import markdown_table, write_text
from profkit.report.collect import Inventory
from profkit.report.sections import Pictures, Section, image, skipped
from profkit.workload.names import ATTENTION_RANGES

TOP_KERNELS = 10
TRACE_SUFFIXES = (".nsys-rep", ".sqlite", ".pt.trace.json", ".json.gz", ".json")
KERNEL_COLUMNS = {
    "short_name": "kernel",
    "category": "category",
    "share %": "share %",
    "total_ms": "total ms",
    "instances": "calls",
    "avg_us": "avg µs",
}
COUNTED = ["kernels", "memcpy", "memset", "graphs", "kernel_time_ms", "gpu_time_ms"]
"""The columns that count GPU work: a CPU-only trace's tables leave them out."""
Analyzer = Callable[[Path], Any]


def trace_stem(path: Path) -> str:
    """``run`` for ``run.sqlite``, ``torch-small-ctx128-train`` for ``...-train.json.gz``."""
    name = path.name
    for suffix in TRACE_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def trace_groups(paths: list[Path]) -> list[tuple[str, list[Path]]]:
    """(stem, traces): each trace on its own, but the per-rank traces of one run together,
    in rank order, under the run's stem."""
    from profkit.run.trace_capture import rank_trace_stem

    groups: dict[str, list[tuple[int, Path]]] = {}
    for path in paths:
        stem, rank = rank_trace_stem(path) or (trace_stem(path), -1)
        groups.setdefault(stem, []).append((rank, path))
    return [
        (stem if len(group) > 1 else trace_stem(group[0][1]), [p for _, p in sorted(group)])
        for stem, group in groups.items()
    ]


def nsys_section(
    inv: Inventory, out_dir: Path, pictures: Pictures, marks: PhaseRanges | None = None
) -> Section:
    title = "Nsight Systems profiles"
    if not inv.nsys:
        return skipped(
            title,
            f"no Nsight Systems exports in `{inv.profiles_dir}` (`profkit nsys --size small "
            "--ctx 128` makes one; it needs CUDA and nsys)",
        )
    intro = (
        "Each kernel is attributed to the phase whose range was open when it was launched, "
        "backward kernels included (docs/ATTRIBUTION.md). GPU time is summed over the "
        "captured steps."
    )
    parts = [_trace_part(trace_stem(p), [p], out_dir, pictures, marks) for p in inv.nsys]
    return Section(title, "\n\n".join([intro, *parts]))


def torch_section(
    inv: Inventory, out_dir: Path, pictures: Pictures, marks: PhaseRanges | None = None
) -> Section:
    title = "torch.profiler traces"
    if not inv.torch:
        return skipped(
            title,
            f"no torch.profiler traces in `{inv.profiles_dir}` (`profkit torch --size small "
            "--ctx 128` makes them)",
        )
    intro = (
        "The Chrome traces of `profkit torch` read into the same tables as an nsys export "
        "(open them in https://ui.perfetto.dev for the timeline)."
    )
    parts = [
        _trace_part(stem, group, out_dir, pictures, marks)
        for stem, group in trace_groups(inv.torch)
    ]
    return Section(title, "\n\n".join([intro, *parts]))


def _read(paths: list[Path], marks: PhaseRanges | None = None) -> Any:
    """The kernel report of one trace, or of the per-rank traces of one run (several hosts'
    on one clock), as `profkit kernels` reads them (cache too); None when these traces are
    not the ranks of one run."""
    from profkit.analysis import kernel_report
    from profkit.traces.host_calls import host_traces
    from profkit.traces.job import load

    job = load(paths)
    if job.kind == "side_by_side":
        return None
    hosts = host_traces(job.paths, job.files)  # for the findings
    return kernel_report(job, top=TOP_KERNELS, consume=True, phase_ranges=marks, hosts=hosts)


def _trace_part(
    stem: str,
    paths: list[Path],
    out_dir: Path,
    pictures: Pictures,
    marks: PhaseRanges | None = None,
) -> str:
    """One trace's (or one run's ranks') part of its section; what goes wrong with these
    files (unreadable, bad headers, clocks that cannot be joined, a file that cannot be
    written) is said in the part, and the rest of the report is written."""
    try:
        return _trace_body(stem, paths, out_dir, pictures, marks)
    except ProfkitError as exc:
        return f"### {stem}\n\n_Could not read `{', '.join(p.name for p in paths)}`: {exc}._"


def _trace_body(
    stem: str, paths: list[Path], out_dir: Path, pictures: Pictures, marks: PhaseRanges | None
) -> str:
    from profkit.analysis import kernel_report_markdown

    heading = f"### {stem}"
    report = _read(paths, marks)
    if report is None:  # same stem, yet not the ranks of one run: each on its own
        return "\n\n".join(_trace_part(trace_stem(p), [p], out_dir, pictures, marks) for p in paths)
    full = out_dir / f"{stem}.md"
    if not full.exists() or full.stat().st_mtime < max(p.stat().st_mtime for p in paths):
        write_text(full, kernel_report_markdown(report, f"Kernels: {stem}"))
    config = report.source.get("config")  # the sidecar's, or the trace's own
    lines = [heading, _describe(report, config, paths, full, out_dir)]
    if report.findings:
        from profkit.analysis.findings import findings_markdown

        lines.append(findings_markdown(report.findings).replace("## Findings", "Findings:", 1))
    if isinstance(report, RankedReport):
        lines += _ranks_part(report, stem, out_dir, pictures)
    phases = report.phases.copy()
    if report.activities:
        phases.insert(list(phases.columns).index("share"), "share %", 100 * phases["share"])
        lines.append(markdown_table(phases.drop(columns=["share"])))
        top = report.top_kernels().rename(columns=KERNEL_COLUMNS)
        top["share %"] = 100 * report.top_kernels()["share"]
        lines.append(
            f"Top {len(top)} by GPU time (kernels, memcpy, memset), all phases:\n\n"
            + markdown_table(top[list(KERNEL_COLUMNS.values())])
        )
    else:
        lines.append(
            "No GPU kernels in this trace (a CPU run): the phases' CPU time only.\n\n"
            + markdown_table(phases[["phase", "instances", "cpu_time_ms"]])
        )
    attention = _attention_ranges(report.ranges)
    if attention is not None and not report.activities:
        attention = attention.drop(columns=COUNTED, errors="ignore")
    if attention is not None:
        from profkit.analysis.presentation import attention_sentence

        sentence = attention_sentence(report.ranges)
        lines.append("Attention sub-ranges:\n\n" + markdown_table(attention))
        if sentence:
            lines.append(sentence)
    return "\n\n".join(lines)


def _ranks_part(report: RankedReport, stem: str, out_dir: Path, pictures: Pictures) -> list[str]:
    """The rank table and the lanes picture (a note instead when it cannot be drawn)."""
    from profkit.analysis.presentation import rank_tables
    from profkit.report.rank_plots import plot_ranks

    (caption, table), *rest = rank_tables(report)
    lines = [
        f"{caption}: NCCL kernels, and how much of their time compute hides (docs/MULTI_GPU.md). "
        "The tables after the picture are of all ranks together (instances: every rank's "
        "phase ranges).\n\n" + markdown_table(table)
    ]
    if report.nodes:  # several hosts: how each one's clock was put on the first's
        (nodes_caption, nodes), *_ = rest
        lines.append(f"{nodes_caption}:\n\n" + markdown_table(nodes))
    name = f"ranks-{stem}.png"
    try:
        plot_ranks(report, out_dir / name)
    except ProfkitError as exc:
        pictures.notes.append(f"{name}: {exc}")
        return lines
    pictures.ranks[stem] = name
    return [*lines, image(name, f"One step per rank and per-rank phases of {stem}")]


def _describe(
    report: Any, config: dict[str, Any] | None, paths: list[Path], full: Path, out_dir: Path
) -> str:
    source = report.source
    facts = []
    if config:
        facts.append(
            f"{config.get('size')}, ctx {config.get('ctx')}, {config.get('mode')}, "
            f"{config.get('dtype')}" + (", compiled" if config.get("compile") else "")
        )
    ranks = [e.report for e in report.ranks] if isinstance(report, RankedReport) else [report]
    steps = max((int(r.phases["instances"].max()) for r in ranks if len(r.phases)), default=0)
    if len(ranks) > 1:
        facts.append(f"{len(ranks)} ranks")
    if steps:
        each = " each" if len(ranks) > 1 else ""
        facts.append(f"{steps} captured step{'s' if steps != 1 else ''}{each}")
    tool = f"{source.get('tool', '')} {source.get('tool_version', '')}".strip()
    facts += [f for f in (source.get("gpu"), tool) if f]
    totals = report.totals
    facts.append(
        f"{totals['kernels']:,} kernels, {totals['memcpy']:,} memcpy, {totals['memset']:,} memset"
    )
    link = _relative(full, out_dir)
    traces = ", ".join(f"`{p}`" for p in paths)
    return (
        f"{' · '.join(facts)}. Trace{'s' if len(paths) > 1 else ''} {traces}; full kernel "
        f"report: [{full.name}]({link})"
        + (
            f"; torch.profiler tables: [{t.name}]({_relative(t, out_dir)})"
            if (t := _torch_report(paths[0], out_dir))
            else ""
        )
        + "."
    )


def _torch_report(path: Path, out_dir: Path) -> Path | None:
    """``reports/torch-small-ctx128.md`` (the key_averages tables) for one of its traces."""
    from profkit.run.trace_capture import rank_trace_stem

    stem = (rank_trace_stem(path) or (trace_stem(path), 0))[0]
    run, _, _mode = stem.rpartition("-")
    candidate = out_dir / f"{run}.md"
    return candidate if run and candidate.is_file() and path.name.endswith(".json.gz") else None


def _attention_ranges(ranges: pd.DataFrame) -> pd.DataFrame | None:
    if ranges.empty:
        return None
    chosen = ranges[ranges["range"].isin(ATTENTION_RANGES)]
    if chosen.empty:
        return None
    return chosen.drop(columns=["domain"], errors="ignore").reset_index(drop=True)


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()
