"""``profkit memory``: capture CUDA memory snapshots; ``summarize`` and ``plot`` read them.

``profkit memory [OPTIONS]`` is ``profkit memory capture [OPTIONS]``: a group whose first
argument, when it is not a subcommand, goes to ``capture``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.core

from profkit.cli._common import (
    DbOpt,
    FormatOpt,
    OutOpt,
    PlainGroup,
    TimeoutOpt,
    WorkloadOptions,
    command,
    workload_options,
)
from profkit.cli.app import app
from profkit.cli.render import emit_tables, err_console, progress_bar
from profkit.errors import BadInput
from profkit.files import DEFAULT_DB

if TYPE_CHECKING:
    from profkit.workload.config import WorkloadConfig

# profkit.formats (pandas) is imported by each command, not here: `--help` does not import
# pandas (tests/test_startup.py).


class DefaultToCapture(PlainGroup):
    """A group that hands arguments not naming a subcommand to ``capture``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["capture", *args]
        return super().parse_args(ctx, args)


memory_app = typer.Typer(
    cls=DefaultToCapture,
    no_args_is_help=True,
    help="CUDA memory snapshots: capture (the default), summarize, plot.\n\n"
    "`profkit memory --size 2.7B --ctx 256 --bf16` captures; see `profkit memory capture --help`.",
)
app.add_typer(memory_app, name="memory")

MaxEntriesOpt = Annotated[
    int, typer.Option("--max-entries", help="Allocator events kept (a ring buffer: the newest).")
]
StacksOpt = Annotated[
    str, typer.Option("--stacks", help="python | all (all adds C++ frames; much slower).")
]
TopOpt = Annotated[int, typer.Option("--top", "-n", help="Call sites to list.")]
SnapshotArg = Annotated[
    Path, typer.Argument(help="A snapshot .pickle (also .pickle.xz / .pickle.gz).")
]


@command(memory_app, "capture")
@workload_options(steps=1, warmup=1)
def capture(
    workload: WorkloadOptions,
    max_entries: MaxEntriesOpt = 1_000_000,
    stacks: StacksOpt = "python",
    name: Annotated[
        str | None, typer.Option("--name", help="Snapshot name: OUT_DIR/NAME.pickle.")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where snapshots go.")] = Path(
        "profiles"
    ),
    timeout: TimeoutOpt = None,
    db: DbOpt = DEFAULT_DB,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """Snapshot the CUDA allocator over the timed steps of each config; tables of peaks.

    By default one warm-up step (not recorded), then one recorded step: one step after warm-up shows the whole pattern, and each recorded step makes the pickle bigger.
    """
    from profkit.formats import check_format
    from profkit.memory.capture import capture as run_capture
    from profkit.memory.capture import capture_tables

    check_format(fmt)
    configs = workload.configs()
    if out is not None:
        from profkit.files import check_not_written
        from profkit.memory.capture import written_paths

        check_not_written(out, written_paths(configs, out_dir, name))
    with _progress(configs) as on_config:
        rows = run_capture(
            configs, out_dir, name, max_entries, stacks, timeout, on_config, db_path=db
        )
    emit_tables(capture_tables(rows), fmt, out, json_value=rows)
    for row in rows:
        if row["snapshot"]:
            err_console.print(f"snapshot: {row['snapshot']}  (pytorch.org/memory_viz reads it)")


@contextmanager
def _progress(configs: list[WorkloadConfig]) -> Iterator[Callable[[int, WorkloadConfig], None]]:
    """The progress bar, one tick per config; yields capture's hook."""
    with progress_bar() as progress:
        task = progress.add_task("memory", total=len(configs))

        def on_config(index: int, config: WorkloadConfig) -> None:
            progress.update(task, completed=index, current=config.label())

        yield on_config


@command(memory_app, "summarize")
def summarize(
    snapshot: SnapshotArg,
    top: TopOpt = 10,
    device: Annotated[
        int | None, typer.Option("--device", help="CUDA device index (default: the busiest).")
    ] = None,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """Peak allocated memory, when it happened, and the call sites holding it."""
    from profkit.formats import check_format
    from profkit.memory.summary import summarize_file, summary_tables

    check_format(fmt)
    summary = summarize_file(snapshot, top, device)
    emit_tables(summary_tables(summary), fmt, out, json_value=summary)
    gone = _moved_sites(summary)
    if gone:  # a snapshot of older code: its sites are right, this checkout's files moved
        err_console.print(
            f"[dim]note: call sites name the code the snapshot was taken from; "
            f"{', '.join(gone)} {'is' if len(gone) == 1 else 'are'} not in this "
            "installation (moved or renamed since)[/]",
            highlight=False,
            soft_wrap=True,
        )


def _moved_sites(summary: dict[str, Any]) -> list[str]:
    """profkit files the snapshot's call sites name that this installation does not have."""
    package = Path(__file__).resolve().parents[1]
    files = {
        str(site.get("site", "")).split(":")[0]
        for site in summary.get("top_allocations") or []
        if str(site.get("site", "")).startswith("profkit/")
    }
    return sorted(f for f in files if not (package.parent / f).exists())


PLOT_FORMATS = ("table", "json")


@command(memory_app, "plot")
def plot(
    snapshot: SnapshotArg,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="The picture; its suffix picks the format: .png, .svg or .pdf "
            "(default: reports/NAME.png).",
            show_default=False,
        ),
    ] = None,
    html: Annotated[
        bool,
        typer.Option("--html", help="Also write torch's interactive viewer (loads JS from CDNs)."),
    ] = False,
    detail: Annotated[
        int, typer.Option("--detail", help="Largest allocations drawn on their own.")
    ] = 2_000,
    sites: Annotated[int, typer.Option("--sites", help="Call sites given their own colour.")] = 10,
    title: Annotated[str | None, typer.Option("--title", help="Title of the picture.")] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="What is printed: table (a line per file written, on stderr) | json (the "
            "files, the peak and the event count, on stdout).",
        ),
    ] = "table",
) -> None:
    """The active-memory timeline as a picture, drawn locally (matplotlib, no browser).

    The picture's format is --out's suffix (.png, .svg or .pdf).
    """
    from profkit.formats import dumps
    from profkit.memory.plot import plot_file

    if fmt not in PLOT_FORMATS:
        raise BadInput(f"unknown --format {fmt!r}; choose one of: {', '.join(PLOT_FORMATS)}")
    with err_console.status("reading the snapshot") as status:  # stderr, a terminal only
        result = plot_file(
            snapshot, out, html, detail, sites, title, stage=lambda what: status.update(what)
        )
    if fmt == "json":
        print(dumps(result))
        return
    err_console.print(f"wrote {result['image']}", highlight=False, soft_wrap=True)
    if result.get("html"):
        err_console.print(
            f"wrote {result['html']} (opening it loads MemoryViz.js and d3 from public CDNs)"
        )
