"""``profkit demo``: the README's main job, on whatever this machine has."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from profkit.cli._common import DeviceOpt, command
from profkit.cli.app import app
from profkit.cli.render import emit_tables, err_console
from profkit.cli.views import sweep_progress
from profkit.report import demo as demo_lib
from profkit.run import bench as bench_lib

ProfilesOpt = Annotated[
    Path, typer.Option("--profiles", help="Where the demo's results DB and profiles go.")
]
ReportOpt = Annotated[Path, typer.Option("--report", help="The markdown report to write.")]


def _announce(index: int, total: int, step: demo_lib.DemoStep) -> None:
    err_console.print(f"[bold]demo {index + 1}/{total}:[/] {step.title}", highlight=False)


@command(app, outputs=("report",))
def demo(
    profiles: ProfilesOpt = Path("profiles/demo"),
    report: ReportOpt = Path("reports/demo.md"),
    device: DeviceOpt = "auto",
) -> None:
    """Benchmark, profile and report in one go: tiny model on a CPU, small on a GPU."""
    result = demo_lib.demo(
        profiles, report, device, sweep_progress=sweep_progress, on_step=_announce
    )
    rows = result.data.get("bench_rows")
    if rows:
        emit_tables([(bench_lib.title(rows), bench_lib.table(rows))], "table")
    err_console.print(f"results database: {result.db_path}", highlight=False)
    print(f"wrote {result.report_path}")
