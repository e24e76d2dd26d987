"""What a ``profkit nsys`` run records beside its trace: the sidecar and the run section.

The sidecar ``NAME.profkit.json`` sits next to ``NAME.sqlite`` so that readers know what
produced the trace: ``config`` (the WorkloadConfig, or null for a user's program),
``result`` (the child's own result: status and per-step Python phase times), plus how
nsys was run and where the command's time went (``timings_s``).
"""

from __future__ import annotations

import shlex
import statistics
import time
from typing import Any

import pandas as pd

from profkit.formats import markdown_table, plural
from profkit.workload.names import PHASES


def new_record(
    name: str,
    config: dict[str, Any] | None,
    program: list[str] | None,
    nsys_argv: list[str],
    nsys_version: str | None,
    files: dict[str, str],
) -> dict[str, Any]:
    """The sidecar's skeleton before the run: what will run, and where its files go."""
    from profkit import __version__

    return {
        "name": name,
        "config": config,
        "program": program,
        "result": None,
        "nsys": {"argv": nsys_argv, "version": nsys_version},
        "files": files,
        "timings_s": {},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "profkit_version": __version__,
    }


def python_phase_times(result: dict[str, Any] | None) -> pd.DataFrame:
    """Per-phase Python wall time over the timed steps, as the workload measured it.

    ``total_ms`` is the sum over the steps, comparable with the GPU time the kernel
    report gives each phase (which is also summed over the captured steps).
    """
    steps = (result or {}).get("steps") or []
    rows = []
    for phase in (*PHASES, "step"):
        if phase == "step":
            values = [sum(s.get(f"{p}_ms") or 0.0 for p in PHASES) for s in steps]
        else:
            values = [s[f"{phase}_ms"] for s in steps if s.get(f"{phase}_ms") is not None]
        if not values:
            continue
        rows.append(
            {
                "phase": phase,
                "steps": len(values),
                "total_ms": sum(values),
                "mean_ms": statistics.fmean(values),
                "median_ms": statistics.median(values),
                "min_ms": min(values),
                "max_ms": max(values),
            }
        )
    return pd.DataFrame(
        rows, columns=["phase", "steps", "total_ms", "mean_ms", "median_ms", "min_ms", "max_ms"]
    )


TIMING_PARTS = (
    ("nsys_profile", "nsys profile (the program and the capture)"),
    ("export", "nsys export to SQLite"),
    ("analysis", "kernel analysis and report"),
)


def timing_table(timings: dict[str, float]) -> pd.DataFrame:
    """Where the command's wall time went; ``other`` is setup and file handling."""
    rows = [
        {"part": label, "seconds": timings[key]} for key, label in TIMING_PARTS if key in timings
    ]
    if "total" in timings:
        other = timings["total"] - sum(timings.get(key, 0.0) for key, _ in TIMING_PARTS)
        rows.append({"part": "other (setup, nsys lookup, files)", "seconds": max(other, 0.0)})
        rows.append({"part": "total", "seconds": timings["total"]})
    return pd.DataFrame(rows, columns=["part", "seconds"])


def run_section(record: dict[str, Any]) -> str:
    """The report's ``Run`` section: how it ran, Python phase times, where time went."""
    lines = ["## Run", ""]
    nsys = record.get("nsys") or {}
    version = nsys.get("version") or "unknown version"
    argv = nsys.get("argv") or []
    if record.get("config"):
        config = record["config"]
        lines.append(
            f"Built-in model `{record['name']}`: size {config['size']}, ctx {config['ctx']}, "
            f"batch {config['batch']}, mode {config['mode']}, dtype {config['dtype']}, "
            f"attention {config['attention']}, compile {'yes' if config['compile'] else 'no'}, "
            f"{config['warmup']} warm-up + {plural(config['steps'], 'timed step')}."
        )
    elif record.get("program"):
        lines.append(f"Program: `{shlex.join(record['program'])}`")
    lines += ["", f"Nsight Systems {version}:", "", "```", shlex.join(argv) + " ...", "```", ""]
    phases = python_phase_times(record.get("result"))
    if not phases.empty:
        lines += [
            "### Python time per phase",
            "",
            "Wall clock of each phase as the workload timed it (synchronised at phase ends), "
            "over the captured timed steps; `total_ms` compares with the phases' GPU time above.",
            "",
            markdown_table(phases, digits=2),
            "",
        ]
    timings = record.get("timings_s") or {}
    if timings:
        lines += [
            "### Where the command's time went",
            "",
            markdown_table(timing_table(timings)),
            "",
        ]
    return "\n".join(lines)
