"""Text formats of profkit's tables — markdown, CSV, JSON — and writing them to files.

Pure functions of data: the library uses them for the markdown reports it writes, the CLI
(:mod:`profkit.cli.render`) for what it prints. Nothing here touches a terminal.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.errors import BadInput
from profkit.files import written

FORMATS = ("table", "md", "csv", "json")


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise BadInput(f"unknown --format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    return fmt


def cell_text(value: Any, digits: int = 2) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, numbers.Integral):  # numpy ints too (nullable Int64 columns)
        return f"{value:,}"
    return str(value)


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
        lines.append("| " + " | ".join(_md_escape(cell_text(v, digits)) for v in row) + " |")
    return "\n".join(lines)


def _md_escape(text: str) -> str:
    # Kernel names are full of '<...>', which GitHub reads as HTML and hides: such a cell is
    # code (`name<float>`), which reads as a name should; '|' would end the cell in both.
    text = text.replace("|", "\\|")
    if ("<" in text or ">" in text) and "`" not in text:
        return f"`{text}`"
    return text.replace("<", "&lt;")


# Machine names of the tables a command stacks into one CSV (its ``table`` column), by the
# start of their display titles, which carry live numbers; first match wins.
TABLE_IDS = (
    ("Phases per rank", "rank_phases"), ("Phases", "phases"), ("Top ", "top_kernels"),
    ("All by GPU time", "top_kernels"), ("Ranges", "ranges"),
    ("GPU time by category", "categories"), ("Categories", "categories"), ("Ranks", "ranks"),
    ("Nodes", "nodes"), ("NCCL kernels by collective", "collectives"),
    ("Steps across ranks", "steps"), ("Appeared", "appeared"), ("Vanished", "vanished"),
    ("Faster", "faster"), ("Slower", "slower"), ("Fewer calls", "fewer_calls"),
    ("More calls", "more_calls"), ("Model sizes", "sizes"),
)  # fmt: skip


def table_id(title: str) -> str:
    """A stable machine name for a table titled ``title`` (``phases``, ``top_kernels``, ...):
    from :data:`TABLE_IDS`, else the title's first words, lower case, ``_`` for the rest."""
    for start, name in TABLE_IDS:
        if title.startswith(start):
            return name
    head = re.split(r" — |[(,:]", title, maxsplit=1)[0]
    return re.sub(r"[^a-z0-9]+", "_", head.lower()).strip("_") or "table"


class Encoded(str):
    """A value's JSON text, made already by :func:`dumps` (where it was cheaper: a node's
    ranks on the worker that analysed them). :func:`dumps` writes it in as that value, at
    its depth, as if it had encoded the value itself."""


def to_jsonable(value: Any, encoded: list[Encoded]) -> Any:
    """Plain JSON types: NaN becomes null, numpy scalars become Python numbers.
    ``encoded``: where :class:`Encoded` texts are collected, each replaced by a mark
    (:func:`dumps` puts the texts back)."""
    if isinstance(value, Encoded):
        encoded.append(value)
        return f"{_MARK}{len(encoded) - 1}"
    if isinstance(value, pd.DataFrame):
        return [to_jsonable(r, encoded) for r in value.to_dict(orient="records")]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v, encoded) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v, encoded) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


_MARK = "\x00profkit-encoded:"
"""Where an :class:`Encoded` text goes, until it is put back (a NUL: no trace's name has one)."""
_INDENT = re.compile(" *")
_MARKED = re.compile(r'"\\u0000profkit-encoded:(\d+)"')


def dumps(value: Any) -> str:
    """``value`` as JSON, two spaces an indent level."""
    encoded: list[Encoded] = []
    text = json.dumps(to_jsonable(value, encoded), indent=2)
    if not encoded:
        return text

    def put_back(mark: re.Match[str]) -> str:
        line = text.rfind("\n", 0, mark.start()) + 1
        indent = _INDENT.match(text, line)  # the line's indent: the value's depth
        assert indent is not None  # it matches the empty string
        return encoded[int(mark[1])].replace("\n", "\n" + indent[0])

    return _MARKED.sub(put_back, text)


def encoded_object(head: dict[str, Any], tail: Encoded) -> Encoded:
    """The object of ``head``'s keys then those of ``tail`` (an object's text), encoded."""
    if tail == "{}":
        return Encoded(dumps(head))
    first = dumps(head)
    if first == "{}":
        return tail
    return Encoded(first[: -len("\n}")] + ",\n" + tail[len("{\n") :])


def write_text(path: Path, text: str) -> None:
    """Write a file whole or not at all (:func:`~profkit.files.written`: an earlier file
    survives a failed write); an unwritable path is a one-line user error."""
    with written(path) as temporary:
        temporary.write_text(text)


_SUFFIX_FORMATS = {".csv": "csv", ".json": "json", ".md": "md", ".markdown": "md"}


def file_format(fmt: str, out: Path | None) -> str:
    """The format to write: ``--out x.csv`` (or .json, .md) without ``--format`` means that.

    ``table`` is for terminals; written to a file it becomes the suffix's format, or
    markdown. An explicit ``--format`` always wins.
    """
    if fmt != "table" or out is None:
        return fmt
    return _SUFFIX_FORMATS.get(out.suffix.lower(), "md")


def plural(n: int, word: str) -> str:
    """``1 step``, ``3 steps``: a count with its noun."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")
