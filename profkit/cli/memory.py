"""``profkit memory``: capture CUDA memory snapshots; ``summarize`` and ``plot`` read them.

``profkit memory [OPTIONS]`` is ``profkit memory capture [OPTIONS]``: a group whose first
argument, when it is not a subcommand, goes to ``capture``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

from profkit.cli._common import (
    AttentionOpt,
    BatchOpt,
    Bf16Opt,
    CompileOpt,
    CtxOpt,
    DbOpt,
    DeviceOpt,
    DtypeOpt,
    FormatOpt,
    ModeOpt,
    OutOpt,
    SizeOpt,
    WarmupOpt,
    command,
    workload_configs,
)
from profkit.cli.app import app
from profkit.cli.render import emit_tables, err_console
from profkit.formats import check_format, dumps
from profkit.run.results import DEFAULT_DB


class DefaultToCapture(typer.core.TyperGroup):
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
def capture(
    size: SizeOpt = [],  # noqa: B006 - typer reads list defaults; they are never mutated
    ctx: CtxOpt = [],  # noqa: B006
    batch: BatchOpt = [],  # noqa: B006
    mode: ModeOpt = [],  # noqa: B006
    dtype: DtypeOpt = [],  # noqa: B006
    bf16: Bf16Opt = False,
    compile: CompileOpt = "no",
    attention: AttentionOpt = [],  # noqa: B006
    warmup: WarmupOpt = [],  # noqa: B006
    steps: Annotated[int, typer.Option("--steps", help="Timed (recorded) steps.")] = 1,
    device: DeviceOpt = "auto",
    max_entries: MaxEntriesOpt = 1_000_000,
    stacks: StacksOpt = "python",
    name: Annotated[
        str | None, typer.Option("--name", help="Snapshot name: OUT_DIR/NAME.pickle.")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where snapshots go.")] = Path(
        "profiles"
    ),
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds per config before it is killed.")
    ] = None,
    db: DbOpt = DEFAULT_DB,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """Snapshot the CUDA allocator over the timed steps of each config; tables of peaks.

    By default one warm-up step (not recorded), then one recorded step: one step after warm-up shows the whole pattern, and each recorded step makes the pickle bigger.
    """
    from profkit.memory.capture import capture as run_capture
    from profkit.memory.capture import capture_tables

    check_format(fmt)
    configs = workload_configs(
        size, ctx, batch, mode, dtype, bf16, compile, attention, warmup or [1], steps, device
    )
    with _progress(len(configs)) as on_config:
        rows = run_capture(
            configs, out_dir, name, max_entries, stacks, timeout, on_config, db_path=db
        )
    emit_tables(capture_tables(rows), fmt, out, json_value=rows)
    for row in rows:
        if row["snapshot"]:
            err_console.print(f"snapshot: {row['snapshot']}  (pytorch.org/memory_viz reads it)")


class _progress:
    """A progress bar on stderr, one tick per config."""

    def __init__(self, total: int) -> None:
        from rich.progress import Progress

        self.total = total
        # Off a terminal the bar is off: a transient bar there leaves a blank line on stderr.
        self.bar = Progress(
            console=err_console, transient=True, disable=not err_console.is_terminal
        )
        self.task = self.bar.add_task("memory", total=total)

    def __enter__(self) -> Any:
        self.bar.start()

        def on_config(index: int, config: Any) -> None:
            self.bar.update(
                self.task,
                completed=index,
                description=f"capturing {index + 1}/{self.total}: {config.label()}",
            )

        return on_config

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


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
    from profkit.memory.summary import summarize_file, summary_tables

    check_format(fmt)
    summary = summarize_file(snapshot, top, device)
    emit_tables(summary_tables(summary), fmt, out, json_value=summary)


@command(memory_app, "plot", outputs=("output",))
def plot(
    snapshot: SnapshotArg,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Picture: .png, .svg or .pdf (default: beside it)."),
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
    fmt: FormatOpt = "table",
) -> None:
    """The active-memory timeline as a picture, drawn locally (matplotlib, no browser)."""
    from profkit.memory.plot import plot_file

    check_format(fmt)  # before the picture is drawn: a typo must not leave a PNG behind
    result = plot_file(snapshot, output, html, detail, sites, title)
    if fmt == "json":
        print(dumps(result))
        return
    err_console.print(f"wrote {result['image']}")
    if result.get("html"):
        err_console.print(
            f"wrote {result['html']} (opening it loads MemoryViz.js and d3 from public CDNs)"
        )
