"""The report's trace sections: Nsight Systems exports and torch.profiler traces.

Each trace gets a short part — phases, the top kernels, the attention sub-ranges — and a
link to its full kernel report (``reports/NAME.md``, which ``profkit nsys`` writes; written
here when it is missing or older than the trace). One unreadable trace costs its own part.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.errors import ProfkitError
from profkit.formats import markdown_table, write_text
from profkit.report.collect import Inventory
from profkit.report.sections import Section, skipped
from profkit.workload.names import ATTENTION_RANGES

TOP_KERNELS = 10
TRACE_SUFFIXES = (".nsys-rep", ".sqlite", ".pt.trace.json", ".json.gz", ".json")
KERNEL_COLUMNS = {
    "short_name": "kernel",
    "category": "category",
    "time_%": "time %",
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


def nsys_section(inv: Inventory, out_dir: Path) -> Section:
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
    return Section(title, "\n\n".join([intro, *(_trace_part(p, out_dir) for p in inv.nsys)]))


def torch_section(inv: Inventory, out_dir: Path) -> Section:
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
    return Section(title, "\n\n".join([intro, *(_trace_part(p, out_dir) for p in inv.torch)]))


def _trace_part(path: Path, out_dir: Path) -> str:
    from profkit.analysis import kernel_report_markdown, kernels

    heading = f"### {trace_stem(path)}"
    try:
        report = kernels(path, top=TOP_KERNELS)  # as `profkit kernels` reads it, cache too
    except ProfkitError as exc:
        return f"{heading}\n\n_Could not read `{path.name}`: {exc}._"
    full = out_dir / f"{trace_stem(path)}.md"
    if not full.exists() or full.stat().st_mtime < path.stat().st_mtime:
        write_text(full, kernel_report_markdown(report, f"Kernels: {trace_stem(path)}"))
    config = report.source.get("config")  # the sidecar's, or the trace's own
    lines = [heading, _describe(report, config, path, full, out_dir)]
    phases = report.phases.copy()
    if report.activities:
        phases.insert(list(phases.columns).index("share"), "time_%", 100 * phases["share"])
        lines.append(markdown_table(phases.drop(columns=["share"])))
        top = report.top_kernels().rename(columns=KERNEL_COLUMNS)
        top["time %"] = 100 * report.top_kernels()["share"]
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


def _describe(
    report: Any, config: dict[str, Any] | None, path: Path, full: Path, out_dir: Path
) -> str:
    source = report.source
    facts = []
    if config:
        facts.append(
            f"{config.get('size')}, ctx {config.get('ctx')}, {config.get('mode')}, "
            f"{config.get('dtype')}" + (", compiled" if config.get("compile") else "")
        )
    steps = int(report.phases["instances"].max()) if len(report.phases) else 0
    if steps:
        facts.append(f"{steps} captured step{'s' if steps != 1 else ''}")
    tool = f"{source.get('tool', '')} {source.get('tool_version', '')}".strip()
    facts += [f for f in (source.get("gpu"), tool) if f]
    totals = report.totals
    facts.append(
        f"{totals['kernels']:,} kernels, {totals['memcpy']:,} memcpy, {totals['memset']:,} memset"
    )
    link = _relative(full, out_dir)
    return (
        f"{' · '.join(facts)}. Trace `{path}`; full kernel report: [{full.name}]({link})"
        + (
            f"; torch.profiler tables: [{t.name}]({_relative(t, out_dir)})"
            if (t := _torch_report(path, out_dir))
            else ""
        )
        + "."
    )


def _torch_report(path: Path, out_dir: Path) -> Path | None:
    """``reports/torch-small-ctx128.md`` (the key_averages tables) for one of its traces."""
    stem = trace_stem(path)
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
