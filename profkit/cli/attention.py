"""``profkit attention``: the CS336 attention micro-benchmark over d_head × seq."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from profkit.cli._common import (
    DEFAULT_COMPILE,
    DEFAULT_DEVICE,
    CompileOpt,
    DbOpt,
    DeviceOpt,
    FormatOpt,
    OutOpt,
    ThreadsOpt,
    command,
    compile_values,
)
from profkit.cli.app import app
from profkit.cli.render import emit_tables, err_console, progress_bar
from profkit.files import DEFAULT_DB

if TYPE_CHECKING:
    from profkit.studies.attention import AttentionSettings, Cell

DHeadOpt = Annotated[
    list[int], typer.Option("--d-head", help="Head dimension(s); default 16 32 64 128.")
]
SeqOpt = Annotated[
    list[int],
    typer.Option(
        "--seq", help="Sequence length(s); default 256 1024 4096 8192 16384 (CPU: 256 512 1024)."
    ),
]
ImplOpt = Annotated[
    list[str], typer.Option("--impl", help="naive | sdpa (both: --impl naive sdpa).")
]
DtypeOpt = Annotated[list[str], typer.Option("--dtype", help="fp32 | bf16 | fp16 (of Q, K, V).")]


@command(app)
def attention(
    d_head: DHeadOpt = [],  # noqa: B006 - typer reads the default; it is never mutated
    seq: SeqOpt = [],  # noqa: B006
    impl: ImplOpt = [],  # noqa: B006
    compile: CompileOpt = DEFAULT_COMPILE,
    dtype: DtypeOpt = [],  # noqa: B006
    batch: Annotated[int, typer.Option("--batch", help="Batch size.")] = 8,
    causal: Annotated[bool, typer.Option("--causal", help="Apply a causal mask.")] = False,
    iters: Annotated[
        int | None,
        typer.Option(
            "--iters",
            help="Timed forward and backward passes; default 100 (CPU: 10).",
            show_default=False,
        ),
    ] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed passes before each.")] = 5,
    device: DeviceOpt = DEFAULT_DEVICE,
    threads: ThreadsOpt = None,
    isolate: Annotated[
        str, typer.Option("--isolate", help="auto (shared process, OOM caught) | process.")
    ] = "auto",
    db: DbOpt = DEFAULT_DB,
    resume: Annotated[
        bool, typer.Option("--resume", help="Skip cells the DB already holds (ok, oom, skipped).")
    ] = False,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """Time attention forward and backward over d_head × seq (batch 8, no heads).

    Each cell: warm-up, then --iters forward passes and --iters backward passes, the
    device synchronised after each; the memory held right before the backward beside
    the analytic count of what autograd saves. Cells that run out of memory stay in the
    table as `oom`; the rest of the grid goes on. Each finished cell is committed to the
    results DB at once; --resume skips the cells already there.

    On a CPU the defaults are seq 256 512 1024 and 10 passes (about half a minute on one
    core), with as many threads as cores are free; on a GPU the handout's grid.
    """
    # torch loads here, not at `profkit` start-up: trace-reading commands never need it.
    from profkit.formats import check_format
    from profkit.run.results import check_db
    from profkit.studies import attention_tables
    from profkit.studies.attention import AttentionSettings

    check_format(fmt)
    check_db(db)
    settings = AttentionSettings.with_defaults(
        device,
        d_heads=tuple(dict.fromkeys(d_head)),
        seqs=tuple(dict.fromkeys(seq)),
        iters=iters,
        impls=tuple(dict.fromkeys(impl)) or ("naive",),
        compile=compile_values(compile),
        dtypes=tuple(dict.fromkeys(dtype)) or ("fp32",),
        batch=batch,
        causal=causal,
        warmup=warmup,
        isolate=isolate,
        threads=threads,
    )
    rows = _run(settings, db, resume)
    emit_tables(attention_tables.tables(rows), fmt, out, json_value=rows)
    for line in attention_tables.failures(rows):
        err_console.print(f"[yellow]{escape(line)}[/]", highlight=False, soft_wrap=True)
    if any(r["status"] == "interrupted" for r in rows):
        err_console.print("interrupted; the cells that finished are above")
        raise typer.Exit(130)


def _run(settings: AttentionSettings, db: Path, resume: bool) -> list[dict[str, Any]]:
    """Every cell of the grid: a progress bar on the cell being timed, a line per cell done."""
    from profkit.studies import attention_tables
    from profkit.studies.attention_runner import run_attention

    total = len(settings.cells())
    with progress_bar() as progress:
        task = progress.add_task("attention", total=total)

        def started(cell: Cell) -> None:
            progress.update(task, current=cell.label())

        def finished(row: dict[str, Any]) -> None:
            progress.advance(task)
            line = attention_tables.progress_line(int(progress.tasks[0].completed), total, row)
            progress.console.print(line, highlight=False, soft_wrap=True)

        return run_attention(settings, started, finished, db, resume)
