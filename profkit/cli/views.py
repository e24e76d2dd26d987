"""Renderings several commands share: a sweep's progress and its rows, a comparison's tables."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from profkit.cli.render import emit_tables, err_console, progress_bar

if TYPE_CHECKING:  # imported where used: `--help` does not import pandas (test_startup)
    from profkit.analysis import compare as compare_lib
    from profkit.run import bench as bench_lib
    from profkit.workload.config import WorkloadConfig


@contextmanager
def sweep_progress(
    configs: Sequence[WorkloadConfig], description: str = "bench"
) -> Iterator[tuple[bench_lib.StartHook, bench_lib.RowHook]]:
    """A progress bar on stderr plus one line per finished config; yields bench's two hooks.
    (:func:`step_progress` adds the steps of the config running.)"""
    with step_progress(configs, description) as (on_start, on_row, _):
        yield on_start, on_row


@contextmanager
def step_progress(
    configs: Sequence[WorkloadConfig], description: str = "bench"
) -> Iterator[tuple[bench_lib.StartHook, bench_lib.RowHook, bench_lib.StepHook]]:
    """The sweep's bar, and under it the running config's steps with the time left at the
    pace so far; one line per finished config. Off a terminal the bars are off and a line
    says each config's start, so a log shows where a long run is."""
    total = len(configs)
    with progress_bar() as progress:
        task = progress.add_task(description, total=total)
        steps = progress.add_task("steps", total=None, visible=False)

        def on_start(index: int, config: WorkloadConfig) -> None:
            progress.update(task, current=config.label())
            progress.reset(steps, total=None, visible=False)
            if not progress.console.is_terminal:
                line = f"[{index + 1}/{total}] {config.label()}: running"
                progress.console.print(line, highlight=False, soft_wrap=True)

        def on_step(index: int, started: int, of: int) -> None:
            label = f"step {started}/{of}"
            progress.update(
                steps, total=of, completed=max(started - 1, 0), visible=True, current=label
            )

        def on_row(index: int, row: bench_lib.Row, resumed: bool) -> None:
            line = _row_line(index, total, row, resumed)
            progress.console.print(line, highlight=False, soft_wrap=True)
            progress.update(task, advance=1, current="")
            progress.update(steps, visible=False)

        yield on_start, on_row, on_step


def _row_line(index: int, total: int, row: bench_lib.Row, resumed: bool) -> str:
    head = f"[{index + 1}/{total}] {row.get('label') or row['size']:<36}"
    if resumed:
        return f"{head} [dim]in the DB already ({row['status']}), skipped[/]"
    if row["status"] == "ok":
        return f"{head} [green]ok[/]   step {row['step_ms']:,.2f} ± {row['step_ms_std']:,.2f} ms"
    return f"{head} [red]{row['status']}[/]  {row['error']}"


def render_rows(rows: Sequence[bench_lib.Row], fmt: str, out: Path | None) -> None:
    """The results: a readable table, every column as CSV, or the contract rows as JSON."""
    import pandas as pd

    from profkit.run import bench as bench_lib

    if fmt == "csv":
        flat = pd.DataFrame(rows).drop(columns=list(bench_lib.LIST_FIELDS), errors="ignore")
        tables = [("", flat)]
    else:
        tables = [(bench_lib.title(rows), bench_lib.table(rows))]
    emit_tables(tables, fmt, out, json_value=list(rows))


def render_comparison(comparison: compare_lib.Comparison, fmt: str, out: Path | None) -> None:
    """Tables per phase (table, md), one table with a phase column (csv), or the records (json)."""
    from profkit.analysis import compare as compare_lib

    if fmt == "csv":
        tables = [("", compare_lib.table(comparison))]
    else:
        tables = compare_lib.tables(comparison)
    emit_tables(tables, fmt, out, json_value=compare_lib.records(comparison))
    if comparison.unpaired:
        err_console.print(
            f"left out, no other {comparison.field} to compare with: "
            + ", ".join(comparison.unpaired),
            highlight=False,
            soft_wrap=True,
        )
