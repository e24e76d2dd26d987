"""The report's sections from the results DB: one function per section, each returning markdown.

A section whose data is missing comes back ``skipped``, with one line saying what would
fill it. Tables come from the modules that own them (``bench.table``, ``compare.tables``,
``memory.capture.capture_tables``, ``studies.attention_tables``), so the report shows
the same numbers as the commands.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profkit import __version__
from profkit.analysis import compare as compare_lib
from profkit.errors import BadInput
from profkit.formats import markdown_table
from profkit.report.collect import Inventory, Row, group_by, where
from profkit.report.figures import SpeedupPanel
from profkit.run import bench as bench_lib
from profkit.run.stability import MIN_STABLE_STEPS, UNSTABLE_CV
from profkit.workload import specs
from profkit.workload.config import DTYPES, MODES

COMPARISONS = (
    ("dtype", "Mixed precision"),
    ("compile", "torch.compile"),
    ("warmup", "Warm-up steps"),
    ("attention", "Attention implementation"),
    ("nproc", "Scaling across GPUs"),
)
MODE_TITLES = {
    "forward": "Forward pass (mode forward)",
    "forward-backward": "Forward and backward (mode forward-backward)",
    "train": "Training step (mode train)",
}


@dataclass
class Section:
    title: str
    body: str
    skipped: str | None = None
    """Why the section has no data (its body is then that one line)."""

    @property
    def anchor(self) -> str:
        """GitHub's anchor for the heading: lower case, punctuation dropped, spaces as -."""
        return re.sub(r"[^\w\- ]", "", self.title.lower()).replace(" ", "-")


def skipped(title: str, why: str) -> Section:
    return Section(title, f"_Skipped: {why}._", skipped=why)


@dataclass
class Pictures:
    """The PNGs written for this report, per machine, as paths relative to the report."""

    step_time: dict[str, str] = field(default_factory=dict)
    speedups: dict[str, str] = field(default_factory=dict)
    speedup_panels: dict[str, list[SpeedupPanel]] = field(default_factory=dict)
    peak_memory: dict[str, str] = field(default_factory=dict)
    timelines: dict[Path, str] = field(default_factory=dict)
    """Snapshot -> its timeline picture."""
    ranks: dict[str, str] = field(default_factory=dict)
    """Multi-rank trace (its stem) -> its lanes and phase bars (drawn by the trace sections)."""
    notes: list[str] = field(default_factory=list)


def image(path: str, alt: str) -> str:
    return f"![{alt}]({path})"


def header(inv: Inventory, db_label: str, profiles_label: str) -> str:
    """Title, where and when the numbers were measured, and with which code."""
    rows = [*inv.bench, *inv.attention, *inv.memory]
    machines = list(dict.fromkeys(where(r) for r in rows))
    dates = sorted({d[:10] for r in rows if (d := r.get("finished_at") or r.get("timestamp_utc"))})
    torch = _distinct(
        f"{r['torch_version']}" + (f" (CUDA {r['cuda_version']})" if r.get("cuda_version") else "")
        for r in rows
        if r.get("torch_version")
    )
    code = _distinct(_code_version(r) for r in rows if r.get("profkit_version"))
    lines = ["# profkit report", ""]
    if rows:
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}" if dates else "?"
        lines.append(
            f"Measured on **{', '.join(machines)}** · {when} · torch {torch or '?'} · "
            f"{code or 'profkit ?'}."
        )
    lines.append(
        f"Built by `profkit report` (profkit {__version__}) from `{db_label}` and "
        f"`{profiles_label}`; `profkit report --run` measures what is missing first. "
        "Times are milliseconds; GiB = 1024³ bytes."
    )
    return "\n".join(lines)


def _distinct(values: Iterable[str]) -> str:
    return ", ".join(dict.fromkeys(values))


def _code_version(row: Row) -> str:
    commit = row.get("git_commit")
    text = f"profkit {row['profkit_version']}"
    if commit:
        text += f" (commit {str(commit)[:10]}{', modified' if row.get('git_dirty') else ''})"
    return text


def sizes_section() -> Section:
    table = pd.DataFrame(specs.sizes())
    return Section(
        "Model sizes",
        "The CS336 `BasicsTransformerLM` in every size (`profkit sizes`): vocabulary 10,000, "
        "parameters counted without allocating weights.\n\n" + markdown_table(table),
    )


def _sorted_bench(rows: list[Row]) -> list[Row]:
    def key(r: Row) -> tuple[Any, ...]:
        size = list(specs.SIZES).index(r["size"]) if r["size"] in specs.SIZES else 99
        dtype = DTYPES.index(r["dtype"]) if r["dtype"] in DTYPES else 9
        return (size, r["ctx"], r["batch"], dtype, bool(r["compile"]), r["attention"], r["warmup"])

    return sorted(rows, key=key)


def bench_section(inv: Inventory, pictures: Pictures) -> Section:
    """Per machine and mode: every config's phases, rates, MFU and peak memory; OOM rows kept."""
    title = "Benchmark"
    if not inv.bench:
        return skipped(title, "no bench rows in the results DB (`profkit bench` makes them)")
    parts = [
        "`profkit bench`: each config in its own process; each phase timed with the device "
        "synchronized at its boundaries. Times are means over the timed steps (`std`: their "
        "sample std); MFU is against the GPU's dense peak for the dtype (docs/FLOPS.md); "
        "peak GiB is `torch.cuda.max_memory_allocated`, in an `oom` row the peak before it ran out."
    ]
    for machine, rows in group_by(inv.bench, where).items():
        if machine in pictures.step_time:
            parts.append(image(pictures.step_time[machine], f"Training step time, {machine}"))
        by_mode = group_by(rows, lambda r: r["mode"])
        for mode in sorted(by_mode, key=lambda m: MODES.index(m) if m in MODES else 9):
            chosen = _sorted_bench(by_mode[mode])
            table = bench_lib.table(chosen).drop(columns=["mode"])
            first = chosen[0]
            warmups = "/".join(map(str, sorted({r["warmup"] for r in chosen})))
            steps = "/".join(map(str, sorted({r["steps"] for r in chosen})))
            parts.append(
                f"### {MODE_TITLES.get(mode, mode)} · {machine}\n\n"
                f"torch {first.get('torch_version', '?')} · {warmups} warm-up + {steps} timed "
                f"steps\n\n" + markdown_table(table)
            )
    return Section(title, "\n\n".join(parts))


def comparisons_section(inv: Inventory, pictures: Pictures) -> Section:
    """fp32 vs bf16, eager vs compiled, warm-up counts, naive vs sdpa: where the DB has pairs."""
    title = "Comparisons"
    if not inv.bench:
        return skipped(title, "no bench rows to compare")
    parts = [
        "Bench rows that differ in one setting only, side by side (`profkit compare FIELD`): "
        "Δ against the baseline (fp32, eager, the fewest warm-up steps, naive attention, "
        "one process). `OOM`/`failed` stand where a variant produced no time. Across GPUs "
        "each rank keeps the one-GPU batch, so `efficiency` is the one-GPU step time over "
        "the N-rank one (1.0: perfect weak scaling)."
    ]
    for machine, path in pictures.speedups.items():
        parts.append(image(path, f"Speed-ups, {machine}"))
        parts.append(_speedup_table(pictures.speedup_panels.get(machine, [])))
    for name, heading in COMPARISONS:
        try:
            comparison = compare_lib.compare(inv.bench, name)
        except BadInput as exc:
            parts.append(f"### {heading}\n\n_Skipped: {_unquote(exc)}._")
            continue
        tables = "\n\n".join(
            f"#### {caption}\n\n{markdown_table(table)}"
            for caption, table in compare_lib.tables(comparison)
        )
        parts.append(f"### {heading}\n\n{tables}")
    return Section(title, "\n\n".join(parts))


def _unquote(exc: BaseException) -> str:
    return str(exc).removeprefix("nothing to compare: ").rstrip(".")


def _speedup_table(panels: list[SpeedupPanel]) -> str:
    records = [
        {
            "comparison": panel.title,
            "config": bar.label,
            "timed": bar.measure,
            "baseline ms": bar.baseline_ms,
            "variant ms": bar.variant_ms,
            # An unstable timing gives a ratio, not a finding: say so instead of printing it.
            "speed-up ×": "unstable" if bar.unstable else bar.speedup,
        }
        for panel in panels
        for bar in panel.bars
    ]
    if not records:
        return ""
    shaky = sum(bar.unstable for panel in panels for bar in panel.bars)
    note = (
        f"\n\n_{shaky} of {len(records)} speed-ups rest on unstable timings (step times "
        f"spread more than {UNSTABLE_CV:.0%}, or fewer than {MIN_STABLE_STEPS} timed steps): "
        "they are not findings; measure again with more steps on a quieter machine._"
        if shaky
        else ""
    )
    return markdown_table(pd.DataFrame(records)) + note


def memory_section(inv: Inventory, pictures: Pictures) -> Section:
    """Memory after each phase and the peaks (``profkit memory`` rows), peak vs context, and
    each snapshot's timeline with the call sites holding the peak."""
    from profkit.memory.capture import capture_tables

    title = "Memory"
    if not (inv.memory or inv.snapshots or pictures.peak_memory):
        return skipped(
            title,
            "no memory rows, snapshots or peak memory at two contexts "
            "(`profkit memory --size small --ctx 128 256` makes them; it needs CUDA)",
        )
    parts: list[str] = []
    for machine, rows in group_by(inv.memory, where).items():
        for caption, table in capture_tables(rows):
            parts.append(f"### {caption} · {machine}\n\n{markdown_table(table)}")
    if not inv.memory:
        parts.append("_No `profkit memory` rows in the results DB._")
    for machine, path in pictures.peak_memory.items():
        parts.append(image(path, f"Peak memory vs context, {machine}"))
    for snapshot in inv.snapshots:
        parts.append(_snapshot_part(snapshot, pictures))
    return Section(title, "\n\n".join(parts))


def _snapshot_part(snapshot: Path, pictures: Pictures) -> str:
    from profkit.errors import ProfkitError
    from profkit.memory.summary import fmt_bytes, summarize_file, summary_tables

    heading = f"### Snapshot `{snapshot.name}`"
    try:
        summary = summarize_file(snapshot, top=3)
    except ProfkitError as exc:
        return f"{heading}\n\n_Could not read it: {exc}._"
    phase = f" during **{summary['peak_phase']}**" if summary.get("peak_phase") else ""
    gpu = (summary.get("capture") or {}).get("device_name")
    text = (
        f"Peak allocated **{fmt_bytes(summary['peak_allocated_bytes'])}**{phase}, "
        f"{summary['live_allocations_at_peak']:,} allocations alive then"
        + (f" ({gpu})" if gpu else "")
        + "; pytorch.org/memory_viz reads the snapshot as is. Largest holders at the peak:"
    )
    _, (_, sites) = summary_tables(summary)
    parts = [heading, text, markdown_table(sites)]
    if snapshot in pictures.timelines:
        parts.append(image(pictures.timelines[snapshot], f"Memory timeline of {snapshot.name}"))
    return "\n\n".join(parts)


def attention_section(inv: Inventory) -> Section:
    """The attention grid (``profkit attention``): one table per machine and setting."""
    from profkit.studies import attention_tables

    title = "Attention"
    if not inv.attention:
        return skipped(
            title,
            "no attention rows in the results DB (`profkit attention` makes them)",
        )
    parts = [
        "`profkit attention`: batch 8, no head dimension; mean ± std of the timed forward and "
        "backward passes, memory held before the backward beside the analytic count of what "
        "autograd saves (docs/STUDIES.md). Memory in MiB (1024² B)."
    ]
    settings = ("batch", "causal", "iters", "warmup")
    groups = group_by(inv.attention, lambda r: (where(r), *(r[k] for k in settings)))
    for rows in groups.values():
        rows = sorted(rows, key=lambda r: (r["d_head"], r["seq"]))
        parts.append(
            f"### {attention_tables.title(rows)}\n\n"
            + markdown_table(attention_tables.cells_table(rows))
        )
        pairs = attention_tables.side_by_side(rows)
        if pairs is not None:
            parts.append(
                "Side by side (speed-up: first variant's time ÷ second's):\n\n"
                + markdown_table(pairs)
            )
        failures = attention_tables.failures(rows)
        if failures:
            parts.append("\n".join(f"- {line}" for line in failures))
    return Section(title, "\n\n".join(parts))
