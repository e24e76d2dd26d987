"""Open any supported trace file as its compact columns (:func:`load_columns`).

A file whose first bytes say SQLite is read as an Nsight Systems export whatever its name
(:mod:`.nsys_columns`, chunk by chunk); a ``.nsys-rep`` report is exported to SQLite with
nsys first (cached beside it as ``<stem>.sqlite``, redone when the report is newer). Other
formats register a column reader by file suffix in :data:`READERS`; Chrome traces from
torch.profiler (``.json``, ``.json.gz``) are read by ``profkit.traces.chrome``, imported on
first use (:data:`PLUGINS`), which registers itself::

    from profkit.traces.load import register
    register(".json.gz", read_chrome_columns)

A reader is called ``read(path, progress=None)`` and reports how far its read has got to
``progress`` (a :class:`~profkit.traces.columns.Progress`). Compressed inputs
(``run.sqlite.xz``, ``trace.json.gz``, ``.bz2``) are read directly, whatever reads them;
anything that is not a regular file is refused at once.
"""

from __future__ import annotations

import importlib
import lzma
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from profkit.errors import BadInput, MissingTool
from profkit.files import COMPRESSION_SUFFIXES, check_readable, open_input
from profkit.sidecar import read_sidecar
from profkit.traces.cache import cached_columns
from profkit.traces.columns import ActivityColumns, Progress, ProgressUnit, check_column_span
from profkit.traces.nsys_columns import keeps_start_times, read_nsys_columns, shape_reader
from profkit.traces.sqlite_scan import SQLITE_MAGIC

Reader = Callable[..., ActivityColumns]
"""``read(path, progress=None)``: a format's compact columns."""
T = TypeVar("T")

READERS: dict[str, Reader] = {}
"""Column readers by suffix (:func:`register`); nsys exports are known by their content."""
# Readers living in modules of their own register themselves when imported; load_columns
# imports the module named here the first time it meets one of its suffixes.
PLUGINS: dict[str, str] = {".json": "profkit.traces.chrome", ".json.gz": "profkit.traces.chrome"}
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
SUPPORTED = "an Nsight Systems .sqlite or .nsys-rep export, or a Chrome trace .json[.gz]"


def register(suffix: str, reader: Reader) -> None:
    """Read files ending in ``suffix`` (``".json.gz"``) with ``reader``, called
    ``reader(path, progress=progress)``."""
    READERS[suffix.lower()] = reader


def load_columns(
    path: str | os.PathLike[str],
    nsys: str | os.PathLike[str] | None = None,
    cache: bool | None = None,
    progress: Progress | None = None,
    timed: bool = False,
) -> ActivityColumns:
    """The compact columns of ``path`` (any supported trace), through the cache.

    Nsight Systems exports are read chunk by chunk in bounded memory, Chrome traces a
    batch of events at a time (their registered reader). ``cache`` overrides ``$PROFKIT_CACHE`` (:mod:`.cache`);
    ``progress`` hears from long reads: rows of an nsys export, bytes of a Chrome trace.
    ``timed``: an export keeps each activity's GPU start and device even where it holds
    one process (a node of a job: :func:`profkit.traces.job.load`); its cache entry is
    then the ``timed`` one, unless its plain read keeps them anyway.
    """
    path = _checked(path)
    if path.name.lower().endswith(NSYS_REPORT_SUFFIXES):
        path = _export(path, nsys)
    source = path
    variant = ""
    if timed and not keeps_start_times(source) and _head(source).startswith(SQLITE_MAGIC):
        variant = "timed"  # the plain read keeps no starts (or, compressed, may not)

    def read() -> ActivityColumns:
        if _head(source).startswith(SQLITE_MAGIC) or _is_sqlite_name(source):
            # A .sqlite that is not SQLite is told why by the reader (empty, truncated, ...).
            return check_column_span(read_nsys_columns(source, progress, timed))
        return _reader(source)(source, progress=progress)

    def finish(columns: ActivityColumns) -> None:
        if "sidecar" not in columns.meta:  # from the cache, which keeps no sidecar
            columns.meta["sidecar"] = read_sidecar(source)
        if columns.kernel_rows is not None and columns.read_shapes is None:  # from the cache
            columns.read_shapes = shape_reader(source, columns.kernel_rows)

    return cached_columns(source, read, cache, finish, variant)


def is_nsys_export(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is read as an Nsight Systems export: a report (``.nsys-rep``), or
    SQLite content whatever its name (a look at its first bytes)."""
    path = _checked(path)
    return path.name.lower().endswith(NSYS_REPORT_SUFFIXES) or _head(path).startswith(SQLITE_MAGIC)


def load_columns_of(
    paths: list[Path],
    nsys: str | os.PathLike[str] | None = None,
    cache: bool | None = None,
    progress: Progress | None = None,
    timed: bool = False,
) -> list[ActivityColumns]:
    """:func:`load_columns` of each path, each read on its own (no file's read needs
    another's), with one ``progress`` over all of them in bytes of the files on disk (an
    export's rows counted as its share of its file's bytes)."""
    return _each(paths, lambda path, inner: load_columns(path, nsys, cache, inner, timed), progress)


def _each(
    paths: list[Path], read: Callable[[Path, Progress | None], T], progress: Progress | None
) -> list[T]:
    sizes = [_checked(p).stat().st_size for p in paths]  # every path checked before reading
    total = sum(sizes)
    done = []
    for index, path in enumerate(paths):
        before = sum(sizes[:index])
        inner = None if progress is None else _offset(progress, before, sizes[index], total)
        done.append(read(path, inner))
        if progress is not None:
            progress(before + sizes[index], total, "bytes")
    return done


def _offset(progress: Progress, before: int, size: int, total: int) -> Progress:
    """``progress`` of one file as a part of all: its bytes after the ``before`` of those
    read earlier, or its rows as that share of its ``size`` in bytes."""

    def report(done: int, of: int, unit: ProgressUnit = "rows", /) -> None:
        part = done if unit == "bytes" else size * done // max(of, 1)
        progress(min(before + part, total), total, "bytes")

    return report


def _checked(path: str | os.PathLike[str]) -> Path:
    path = check_readable(Path(path), f"a trace file ({SUPPORTED})")  # before reading: no hang
    if path.name.lower().endswith(".zst"):
        raise BadInput(f"{path} is zstd-compressed; unpack it first (`zstd -d` keeps the original)")
    return path


def _is_sqlite_name(path: Path) -> bool:
    return _without_compression(path.name.lower()).endswith(SQLITE_SUFFIXES)


def _without_compression(name: str) -> str:
    for suffix in COMPRESSION_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def _reader(path: Path) -> Reader:
    """The reader of ``path``'s format, by its longest matching suffix; one clear line
    for a file no reader reads."""
    name = path.name.lower()
    _import_plugin(name)
    inner = _without_compression(name)
    for suffix in sorted(READERS, key=len, reverse=True):  # ".json.gz" before ".gz"
        if name.endswith(suffix) or inner.endswith(suffix):
            return READERS[suffix]
    hint = ""
    if inner.endswith((".pickle", ".pkl")):
        hint = f"; a CUDA memory snapshot reads with `profkit memory summarize {path}`"
    raise BadInput(f"{path} is not a supported trace (expected {SUPPORTED}){hint}")


def _import_plugin(name: str) -> None:
    for suffix, module in PLUGINS.items():
        if _without_compression(name).endswith(suffix) and suffix not in READERS:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:  # the plugin exists but lacks a dependency: say so
                    raise


def _export(report: Path, nsys: str | os.PathLike[str] | None) -> Path:
    """The SQLite export of ``report``, kept beside it (``export_sqlite``) and reused only
    while it is a whole database (:func:`_export_problem`): a kept one that is not is
    exported again, and a fresh one that is not is removed (a later run never reuses it)."""
    from profkit.files import export_path
    from profkit.run.tools import export_sqlite

    kept = export_path(report)
    problem = _export_problem(kept) if os.path.lexists(kept) else None
    try:
        target = export_sqlite(report, nsys, force=problem is not None)
    except MissingTool as exc:
        damaged = f" (its export {kept.name} is damaged: {problem})" if problem else ""
        raise MissingTool(
            f"reading {report.name} needs Nsight Systems to export it to SQLite{damaged}: {exc} "
            f"(or export it elsewhere with `nsys export --type sqlite {report.name}` and "
            "give the .sqlite)"
        ) from None
    problem = _export_problem(target)
    if problem is not None:  # made just now: a kept one that failed was exported again
        target.unlink(missing_ok=True)
        raise BadInput(f"nsys export of {report.name} wrote a damaged database ({problem})")
    return target


def _export_problem(path: Path) -> str | None:
    """What is wrong with an SQLite export (None: nothing seen). The header and size must
    agree (a truncated or overwritten file does not) and SQLite must read its schema:
    milliseconds, where checking every page would take as long as reading the export."""
    import sqlite3

    from profkit.traces.sqlite_scan import open_readonly

    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            header = handle.read(100)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return "no SQLite header"
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1) or header[21:24] != b"\x40\x20\x20":
        return "its header is damaged"
    pages = int.from_bytes(header[28:32], "big")
    counted = pages > 0 and header[24:28] == header[92:96]  # the header's count is current
    if size % page:
        return f"{size:,} bytes, not a whole number of {page:,}-byte pages"
    if counted and pages * page != size:
        return f"{size:,} bytes where its header says {pages * page:,}"
    try:
        conn = open_readonly(path)
    except BadInput as exc:
        return str(exc)
    try:
        root = conn.execute("SELECT max(rootpage) FROM sqlite_master").fetchone()[0]
    except sqlite3.Error as exc:
        return f"SQLite cannot read its schema: {exc}"
    finally:
        conn.close()
    if isinstance(root, int) and root > size // page:
        return f"a table starts past its end (page {root:,} of {size // page:,})"
    return None


def _head(path: Path) -> bytes:
    """The first bytes of ``path``'s content (decompressed; empty if that fails: the reader
    its name calls for then says what is wrong)."""
    with open_input(path, "a trace file") as stream:
        try:
            return stream.read(len(SQLITE_MAGIC))
        except (OSError, EOFError, lzma.LZMAError, zlib.error):
            return b""
