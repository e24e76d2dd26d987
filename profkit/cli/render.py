"""Rendering at the edge: tables to the terminal (rich), or in a text format to stdout or a file.

Only the CLI imports this module; the library returns plain data (DataFrames, dicts).
With ``--format json`` stdout carries the JSON and nothing else; every message, warning
and progress bar goes to stderr (``err_console``).
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

# pandas, and what imports it (profkit.formats, profkit.analysis), is imported where a table
# is rendered, not here: `profkit --help` and every command's `--help` import this module,
# and must not wait a second or more for pandas (tests/test_startup.py).
if TYPE_CHECKING:
    import pandas as pd

    from profkit.traces.columns import Progress as ReadProgress


class _Console(Console):
    """Rich exits with status 1 by itself when the pipe's reader is gone; raise instead, so
    that the CLI's error boundary says it in one line like every other output error."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def _stdout_width() -> int | None:
    """The width tables are fitted to: ``COLUMNS`` when set (a script asking for 80-column
    output through a pipe gets it), else the terminal's, else 200 (piped output has no
    terminal width; don't squeeze tables into 80 columns then)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if sys.stdout is not None and sys.stdout.isatty() else 200


console = _Console(width=_stdout_width())
# Messages are lines, not layout: redirected stderr (80 columns to rich) must not split them.
err_console = Console(stderr=True, soft_wrap=True)


def progress_bar(on: Console | None = None) -> Progress:
    """The progress bar every command shows on stderr, gone when done.

    Each task shows its description, done/total, the time so far and, when given, the item
    it is on (``add_task(..., current=LABEL)``). Off a terminal (CI logs, pipes) the bar is
    off: a transient bar there would leave a blank line on stderr. Lines printed through
    ``progress.console`` stay above the bar. ``on`` is another console than stderr's.
    """
    target = on or err_console
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        _CurrentColumn(),
        console=target,
        transient=True,
        disable=not target.is_terminal,
    )


class _CurrentColumn(ProgressColumn):
    """The item a task is on (its ``current`` field), blank when it has none."""

    def render(self, task: Task) -> Text:
        return Text(str(task.fields.get("current", "")))


# Hidden first, in this order, when a table is wider than the terminal, so that no column
# is squeezed to nothing (names vanished at 80 columns): details before the name, the
# category and the totals; in bench, the spreads and rates before the phase split, which is
# what bench is for (its phase columns are never hidden). `-f md`, csv and json keep every
# column.
NARROW_HIDDEN = (
    "fwd std", "bwd std", "opt std", "GFLOP/s", "tokens/s", "step std",  # bench
    "TFLOP/s", "peak GiB", "threads",  # bench
    "std_us", "min_us", "max_us", "grid", "block", "med_us", "python_ms", "memset",
    "memcpy", "mflop", "tflop_s", "instances", "nccl_wait_ms", "pid", "host", "cpu_time_ms",
    "device", "nccl_kernels", "kernel_time_ms",
    "Δ ms all", "category",  # diff's kernels: the part of Δ ms of the group stays
    "vocab_size", "non_embedding_params", "unstable",
    # torch.profiler's key_averages: the self times and the calls stay longest
    "Input Shapes", "Source Location", "CPU Mem (MiB)", "Self CPU Mem (MiB)", "CUDA Mem (MiB)",
    "Self CUDA Mem (MiB)", "CUDA time avg (µs)", "CPU time avg (µs)", "CPU total %",
    "CUDA total (ms)", "Self CPU %", "Self CUDA %", "CPU total (ms)",
)  # fmt: skip
NAME_WIDTH = (34, 64)  # the first text column (a name): at least, at most (cut to fit)
TEXT_WIDTH = 16  # other text columns, at most


@dataclass
class _Column:
    index: int  # in the frame
    name: str
    numeric: bool
    width: int  # what it needs (a name: at most)


def rich_table(
    df: pd.DataFrame, title: str | None = None, digits: int = 2, width: int | None = None
) -> Table:
    """``df`` as a rich table that fits ``width`` (default: the console's) where it can:
    columns of :data:`NARROW_HIDDEN` are left out, in that order, until it does with its
    name column at its narrowest, and the caption names them; the name then takes the room
    left, up to its widest."""
    import pandas as pd

    from profkit.analysis.names import fit_names
    from profkit.formats import cell_text

    cells = [[cell_text(v, digits) for v in row] for row in df.itertuples(index=False)]
    columns = []
    for index, column in enumerate(df.columns):
        numeric = pd.api.types.is_numeric_dtype(df[column]) and not pd.api.types.is_bool_dtype(
            df[column]
        )
        # Numbers are never cut short; text keeps a readable minimum and wraps beyond it.
        longest = max((len(row[index]) for row in cells), default=1)
        cap = NAME_WIDTH[1] if index == 0 else TEXT_WIDTH
        need = max(len(str(column)), longest if numeric else min(longest, cap))
        columns.append(_Column(index, str(column), numeric, need))
    limit = width or console.width
    name = columns[0] if columns and not columns[0].numeric else None
    least = min(name.width, NAME_WIDTH[0]) if name else 0

    def others() -> int:  # every column but the name, with the borders and the name's padding
        return sum(c.width + 3 for c in columns if c is not name) + 1 + (3 if name else 0)

    hidden = []
    for gone in NARROW_HIDDEN:
        if others() + least <= limit:
            break
        if any(c.name == gone for c in columns):
            columns = [c for c in columns if c.name != gone]
            hidden.append(gone)
    if name:
        name.width = max(least, min(name.width, limit - others()))
        # One line per name, cut to fit and still telling different names apart: wrapped
        # C++ templates broke mid-argument and cut ones read alike (docs: names.fit_names).
        fitted = fit_names([row[name.index] for row in cells], name.width)
        for row, text in zip(cells, fitted, strict=True):
            row[name.index] = text
    caption = (
        f"not shown at {limit} columns: {', '.join(hidden)} (-f md shows every column)"
        if hidden
        else None
    )
    table = Table(
        title=title, title_justify="left", header_style="bold",
        caption=caption, caption_justify="left",
    )  # fmt: skip
    for c in columns:
        table.add_column(
            c.name,
            justify="right" if c.numeric else "left",
            min_width=c.width,
            no_wrap=c.numeric or c is name,
        )
    for row in cells:
        table.add_row(*(row[c.index] for c in columns))
    return table


def csv_text(tables: Sequence[tuple[str, pd.DataFrame]]) -> str:
    """One CSV table, whatever the number of tables: several are stacked, each row led by
    its table's machine name (:func:`~profkit.formats.table_id`: ``phases``,
    ``top_kernels``, ...) in a ``table`` column, under the union of their columns (a cell a
    table does not have is empty), so that one ``read_csv`` reads them all. A column of
    integers stays integers (``1436``, not ``1436.0``) where other tables leave it empty."""
    import pandas as pd

    from profkit.formats import table_id

    if len(tables) == 1:
        return tables[0][1].to_csv(index=False)
    frames = [df.assign(table=table_id(title))[["table", *df.columns]] for title, df in tables]
    integers = {
        column
        for df in frames
        for column in df.columns
        if pd.api.types.is_integer_dtype(df[column])
        and all(pd.api.types.is_integer_dtype(f[column]) for f in frames if column in f)
    }
    stacked = pd.concat(frames, ignore_index=True, sort=False)
    for column in integers:
        stacked[column] = stacked[column].astype("Int64")
    return stacked.to_csv(index=False)


def emit_tables(
    tables: Sequence[tuple[str, pd.DataFrame]],
    fmt: str,
    out: Path | None = None,
    json_value: Any = None,
    digits: int = 2,
) -> None:
    """Render titled tables in ``fmt`` to stdout, or to ``out`` when given (csv: one table,
    :func:`csv_text`).

    ``json_value`` is what ``--format json`` prints (the command's contract); when it is
    None the tables themselves are printed as a JSON object keyed by title.
    """
    from profkit.formats import check_format, dumps, file_format, markdown_table, write_text

    fmt = file_format(check_format(fmt), out)
    if fmt == "json":
        value = json_value if json_value is not None else {t: df for t, df in tables}
        text = dumps(value) + "\n"
    elif fmt == "csv":
        text = csv_text(tables)
    elif fmt == "md":
        text = (
            "\n\n".join(
                (f"### {title}\n\n" if title else "") + markdown_table(df, digits)
                for title, df in tables
            )
            + "\n"
        )
    else:
        if out is None:
            for title, df in tables:
                console.print(rich_table(df, title, digits))
            return
        text = (
            "\n\n".join(
                (f"### {title}\n\n" if title else "") + markdown_table(df, digits)
                for title, df in tables
            )
            + "\n"
        )
    if out is not None:
        write_text(out, text)
        err_console.print(f"wrote {out}")
    else:
        print(text, end="")


# Progress of long trace reads: rows read / total (nsys exports) or MB of the file read / its
# size (Chrome traces), on stderr, only on a terminal. The library reports through a callback
# (progress(done, total, unit)); a read that ends within SHOW_AFTER_S shows only the spinner,
# and off a terminal (a pipe, CI) nothing is drawn.
SHOW_AFTER_S = 2.0


@contextmanager
def read_progress(label: str) -> Iterator[ReadProgress]:
    """A callback drawing ``label: [bar] done/total UNIT`` once the read passes 2 s."""
    started = time.monotonic()
    bar: Progress | None = None
    task = None
    status = err_console.status(f"reading {label}")
    status.start()

    def update(done: int, total: int, unit: str = "rows", /) -> None:
        nonlocal bar, task
        if bar is None:
            if not err_console.is_terminal or time.monotonic() - started < SHOW_AFTER_S:
                return
            status.stop()
            bar = Progress(
                TextColumn(f"reading {label}"), BarColumn(), _AmountColumn(), TimeElapsedColumn(),
                console=err_console, transient=True,
            )  # fmt: skip
            bar.start()
            task = bar.add_task(label, total=total, unit=unit)
        assert task is not None
        bar.update(task, completed=done, total=total, unit=unit)

    try:
        yield update
    finally:
        status.stop()
        if bar is not None:
            bar.stop()


def amount_read(done: float, total: float, unit: str) -> str:
    """``1,234/5,678 rows``, or bytes in MB (GB from 1 GB on): ``12.3/456.7 MB``."""
    if unit != "bytes":
        return f"{done:,.0f}/{total:,.0f} {unit}"
    scale, name, digits = (1e9, "GB", 2) if total >= 1e9 else (1e6, "MB", 1)
    return f"{done / scale:,.{digits}f}/{total / scale:,.{digits}f} {name}"


class _AmountColumn(ProgressColumn):
    """A read task's done/total in its unit (its ``unit`` field)."""

    def render(self, task: Task) -> Text:
        return Text(amount_read(task.completed, task.total or 0, task.fields.get("unit", "rows")))
