"""``profkit demo``: the README's main job, on whatever this machine has."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from profkit.cli._common import DEFAULT_DEVICE, DeviceOpt, command
from profkit.cli.app import app
from profkit.cli.render import emit_tables, err_console
from profkit.cli.views import sweep_progress

if TYPE_CHECKING:  # imported where used: `--help` does not import pandas (test_startup)
    import pandas as pd

    from profkit.report import demo as demo_lib

ProfilesOpt = Annotated[
    Path, typer.Option("--profiles", help="Where the demo's results DB and profiles go.")
]
ReportOpt = Annotated[
    Path,
    typer.Option("--out", "-o", "--report", help="The markdown report to write."),
]


def _announce(index: int, total: int, step: demo_lib.DemoStep) -> None:
    sys.stdout.flush()
    err_console.print(f"[bold]demo {index + 1}/{total}:[/] {step.title}", highlight=False)


@command(app)
def demo(
    profiles: ProfilesOpt = Path("profiles/demo"),
    out: ReportOpt = Path("reports/demo.md"),
    device: DeviceOpt = DEFAULT_DEVICE,
) -> None:
    """Benchmark, profile and report in one go: tiny model on a CPU, small on a GPU."""
    from profkit.report import demo as demo_lib

    result = demo_lib.demo(
        profiles, out, device, sweep_progress=sweep_progress, on_step=_announce,
        on_tables=_show,
    )  # fmt: skip
    err_console.print(f"results database: {result.db_path}", highlight=False)
    for path in result.files:
        print(f"wrote {path}")
    print(f"wrote {result.report_path}")


def _show(tables: list[tuple[str, pd.DataFrame]]) -> None:
    # Each step's tables right under its heading: stderr (the headings) and stdout are
    # flushed in order, so a terminal or a `2>&1` log reads top to bottom.
    sys.stderr.flush()
    emit_tables(tables, "table")
    sys.stdout.flush()
