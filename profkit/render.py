"""Rendering at the edge: tables to the terminal (rich), markdown, CSV or JSON.

Library functions return plain data (DataFrames, dicts); only the CLI calls these.
With ``--format json`` stdout carries the JSON and nothing else; every message, warning
and progress bar goes to stderr (``err_console``).
"""

from __future__ import annotations

import json
import math
import numbers
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from profkit.errors import BadInput
from profkit.files import check_writable

FORMATS = ("table", "md", "csv", "json")

# Piped output has no terminal width; don't squeeze tables into 80 columns then.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True)


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise BadInput(f"unknown --format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    return fmt


def _cell(value: Any, digits: int = 2) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, numbers.Integral):  # numpy ints too (nullable Int64 columns)
        return f"{value:,}"
    return str(value)


def rich_table(df: pd.DataFrame, title: str | None = None, digits: int = 2) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    cells = [[_cell(v, digits) for v in row] for row in df.itertuples(index=False)]
    for index, column in enumerate(df.columns):
        numeric = pd.api.types.is_numeric_dtype(df[column]) and not pd.api.types.is_bool_dtype(
            df[column]
        )
        # Numbers are never cut short: a narrow terminal wraps the header instead. Text
        # keeps a readable minimum so wide numeric tables cannot squeeze it to nothing.
        longest = max((len(row[index]) for row in cells), default=1)
        width = longest if numeric else min(longest, 16)
        table.add_column(
            str(column), justify="right" if numeric else "left", min_width=width, no_wrap=numeric
        )
    for row in cells:
        table.add_row(*row)
    return table


def markdown_table(df: pd.DataFrame, digits: int = 2) -> str:
    """A GitHub markdown table; numbers right-aligned, thousands separated."""
    headers = [str(c) for c in df.columns]
    numeric = [
        pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])
        for c in df.columns
    ]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if n else ":---" for n in numeric) + "|",
    ]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_md_escape(_cell(v, digits)) for v in row) + " |")
    return "\n".join(lines)


def _md_escape(text: str) -> str:
    # Kernel names are full of '<...>' (read as HTML and hidden by GitHub) and may hold '|'.
    return text.replace("|", "\\|").replace("<", "&lt;")


def to_jsonable(value: Any) -> Any:
    """Plain JSON types: NaN becomes null, numpy scalars become Python numbers."""
    if isinstance(value, pd.DataFrame):
        return [to_jsonable(r) for r in value.to_dict(orient="records")]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def dumps(value: Any) -> str:
    return json.dumps(to_jsonable(value), indent=2)


def write_text(path: Path, text: str) -> None:
    """Write a file, turning an unwritable path into a one-line user error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        check_writable(path)  # says why when it can (a parent that is a file, ...)
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None


_SUFFIX_FORMATS = {".csv": "csv", ".json": "json", ".md": "md", ".markdown": "md"}


def file_format(fmt: str, out: Path | None) -> str:
    """The format to write: ``--out x.csv`` (or .json, .md) without ``--format`` means that.

    ``table`` is for terminals; written to a file it becomes the suffix's format, or
    markdown. An explicit ``--format`` always wins.
    """
    if fmt != "table" or out is None:
        return fmt
    return _SUFFIX_FORMATS.get(out.suffix.lower(), "md")


def emit_tables(
    tables: Sequence[tuple[str, pd.DataFrame]],
    fmt: str,
    out: Path | None = None,
    json_value: Any = None,
    digits: int = 2,
) -> None:
    """Render titled tables in ``fmt`` to stdout, or to ``out`` when given.

    ``json_value`` is what ``--format json`` prints (the command's contract); when it is
    None the tables themselves are printed as a JSON object keyed by title.
    """
    fmt = file_format(check_format(fmt), out)
    if fmt == "json":
        value = json_value if json_value is not None else {t: df for t, df in tables}
        text = dumps(value) + "\n"
    elif fmt == "csv":
        text = "\n".join(df.to_csv(index=False) for _, df in tables)
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
