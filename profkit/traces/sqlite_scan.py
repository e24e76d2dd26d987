"""Opening SQLite files defensively and reading integer columns from them fast.

Nsight Systems exports reach millions of rows. Fetching them row by row through the
``sqlite3`` cursor builds a Python tuple and an int object per cell, which costs more than
everything else profkit does with them. Instead each chunk of rows is aggregated inside
SQLite into one comma-separated string per column (``group_concat``) and parsed by numpy
in C: about twice less CPU time per value, and all columns of a chunk come from one scan,
so they stay aligned row for row.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import sqlite3
import tempfile
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from profkit.cores import cores
from profkit.errors import BadInput
from profkit.files import SQLITE_SHORT_PATH, check_readable

SQLITE_MAGIC = b"SQLite format 3\x00"
INTEGER_TYPES = "('integer', 'null')"  # what typeof() may say of an integer column's cell
HEADER_BYTES = 100
CHUNK_ROWS = 500_000  # ~10 MB of text per column per chunk: bounded memory, few queries
# Reader threads, whatever the core count: each holds a connection with its page cache and
# a chunk's group_concat strings (SQLite's and Python's copies) in flight, and glibc keeps
# an arena per thread. On the 3 M-kernel benchmark (docs/PERFORMANCE.md) peak RSS grew by
# about 0.07 GiB per thread (0.78 GiB with 1 thread, 1.05 with 4, 1.33 with 8), while on
# 16 cores the read went only from 3.9 s with 4 threads to 3.5 s with 8.
MAX_READ_THREADS = 4
STREAM_CACHE_KIB = 8192  # page cache of a streaming reader's connection (stream())
MAX_SPARSE_CHUNKS = 1 << 16  # more rowid chunks than this means the rowids are sparse
T = TypeVar("T")


class BadColumn(BadInput):
    """A table lacks a column the reader needs, or a cell holds the wrong type of value.

    Raised without the file's name (the reader adds it): ``CUPTI_ACTIVITY_KIND_KERNEL.start
    holds text ('abc') where an export has integers``.
    """


def check_sqlite_file(path: Path, what: str, shown: Path | None = None) -> None:
    """Raise :class:`BadInput` unless ``path`` is a readable, complete SQLite file.

    ``what`` names the expected kind of file in messages ("an Nsight Systems export");
    ``shown`` is the name messages give the file (its compressed original, say).
    """
    shown = shown or path
    check_readable(path, what)
    try:
        with path.open("rb") as handle:
            header = handle.read(HEADER_BYTES)
    except OSError as exc:
        raise BadInput(f"cannot read {shown}: {exc.strerror or exc}") from None
    size = path.stat().st_size
    if size == 0:
        raise BadInput(f"{shown} is empty (0 bytes), not {what}")
    if not header.startswith(SQLITE_MAGIC):
        raise BadInput(f"{shown} is not an SQLite database (expected {what})")
    if len(header) < HEADER_BYTES:
        raise BadInput(f"{shown} is truncated ({size:,} bytes): an incomplete SQLite file")
    # The header records the page size and (since SQLite 3.7) the page count: a file
    # shorter than that was cut off, e.g. by a copy or an export that did not finish.
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65_536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    change_counter = int.from_bytes(header[24:28], "big")
    valid_for = int.from_bytes(header[92:96], "big")
    if pages and change_counter == valid_for and size < pages * page_size:
        raise BadInput(
            f"{shown} is truncated: {size:,} bytes where its header promises "
            f"{pages * page_size:,} (copy or export it again)"
        )


def open_readonly(path: Path, any_thread: bool = False) -> sqlite3.Connection:
    """A read-only connection that never writes beside the file (no journal, no locks).

    ``any_thread`` lets another thread than the opener's close it (it is still used by one
    thread at a time). A file whose full path is too long for SQLite (see
    :data:`SQLITE_SHORT_PATH`) is opened through a hard link with a short path
    (:func:`_short_link`), removed once the connection holds the file open.
    """
    resolved = path.resolve()
    try:
        try:
            conn = _connect(resolved, any_thread)
        except sqlite3.OperationalError:
            if len(os.fsencode(resolved)) < SQLITE_SHORT_PATH:
                raise
            with _short_link(path, resolved) as link:
                conn = _connect(link, any_thread)
        conn.execute("PRAGMA cache_size = -65536")  # 64 MiB: the scans below reread pages
        # Text that is not UTF-8 (a damaged name, NVTX text stored as bytes) reads with
        # replacement characters instead of failing the whole read.
        conn.text_factory = _decode
    except sqlite3.Error as exc:
        raise BadInput(f"{path} is corrupt: SQLite cannot read it ({exc})") from None
    return conn


def _connect(path: Path, any_thread: bool) -> sqlite3.Connection:
    uri = path.as_uri() + "?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True, check_same_thread=not any_thread)


@contextlib.contextmanager
def _short_link(path: Path, resolved: Path) -> Iterator[Path]:
    """A hard link to ``path`` in a fresh folder with a short path on the same file system
    (the temporary folder, else the deepest short folder above the file), removed with its
    folder on the way out: SQLite follows symbolic links to the long path, not hard ones,
    and a connection keeps the file it opened. One line when no such link can be made."""
    device = os.stat(path).st_dev
    short = [p for p in resolved.parents if len(os.fsencode(p)) < SQLITE_SHORT_PATH // 2]
    for folder in [Path(tempfile.gettempdir()), *short]:
        try:
            if os.stat(folder).st_dev != device:
                continue
            aside = Path(tempfile.mkdtemp(prefix=".profkit-link-", dir=folder))
        except OSError:
            continue
        link = aside / "trace.sqlite"
        try:
            os.link(path, link)
        except OSError:
            os.rmdir(aside)
            continue
        try:
            yield link
        finally:
            link.unlink()
            os.rmdir(aside)
        return
    raise BadInput(
        f"{path}: its full path is {len(os.fsencode(resolved)):,} bytes, longer than SQLite "
        "opens (about 500), and no hard link with a shorter one could be made on its file "
        "system: move it, or link it (ln) to a shorter path"
    )


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def require_columns(tables: dict[str, list[str]], required: dict[str, tuple[str, ...]]) -> None:
    """Raise :class:`BadColumn` if a table that is there lacks a column it must have."""
    for table, columns in required.items():
        missing = [c for c in columns if table in tables and c not in tables[table]]
        if missing:
            raise BadColumn(f"table {table} lacks column(s) {', '.join(missing)}")


def check_integers(
    conn: sqlite3.Connection, table: str, columns: Iterable[str], where: str = ""
) -> None:
    """Raise :class:`BadColumn` naming the first cell of ``columns`` that is not an integer.

    NULL passes (readers say what a missing value means). One scan of the table: for the
    small tables (names, enums, NVTX); the big ones are checked chunk by chunk as read.
    """
    columns = list(columns)
    if not columns:
        return
    bad = " OR ".join(f'typeof("{c}") NOT IN {INTEGER_TYPES}' for c in columns)
    condition = f"({where}) AND ({bad})" if where else bad
    found = conn.execute(f'SELECT rowid FROM "{table}" WHERE {condition} LIMIT 1').fetchone()
    if found is not None:
        raise _bad_cell(conn, table, columns, f"rowid = {int(found[0])}")


def _bad_cell(
    conn: sqlite3.Connection, table: str, columns: list[str], where: str, field: str = ""
) -> BadColumn:
    for column in columns:
        row = conn.execute(
            f'SELECT typeof("{column}"), "{column}" FROM "{table}" '
            f'WHERE {where} AND typeof("{column}") NOT IN {INTEGER_TYPES} LIMIT 1'
        ).fetchone()
        if row is not None:
            kind = {"real": "a real number", "text": "text", "blob": "a blob"}.get(row[0], row[0])
            value = repr(row[1]) if len(repr(row[1])) <= 40 else repr(row[1])[:37] + "..."
            return BadColumn(f"{table}.{column} holds {kind} ({value}) where integers belong")
    # Integers all, but arithmetic on them left the 64-bit range (SQLite made it a real).
    return BadColumn(f"{table} holds integers out of range ({field or 'a column'} overflows)")


def table_columns(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """Every table's column names."""
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {name: [r[1] for r in conn.execute(f'PRAGMA table_info("{name}")')] for name in names}


@dataclass(frozen=True)
class Scan:
    """One table's chunks for :meth:`ParallelReader.stream_scans`: what
    :meth:`ParallelReader.stream` takes, as a value."""

    table: str
    exprs: dict[str, str]
    where: str = ""
    chunks: list[tuple[int, int]] | None = None
    checked: tuple[str, ...] = ()
    missing: int | Mapping[str, int] = -1
    then: Callable[[dict[str, np.ndarray]], Any] | None = None
    """Run on the reader thread on each chunk's columns; what it returns is yielded
    instead (work that needs nothing but the chunk leaves the consuming thread)."""


class ParallelReader:
    """Reads chunks of integer columns on a few threads, each with its own connection.

    SQLite aggregates without holding the GIL, so chunks of several tables are read at the
    same time (:meth:`stream_scans`), and other reads beside them (:meth:`call`).
    """

    def __init__(self, path: Path, threads: int | None = None) -> None:
        self.path = path
        self.threads = threads or min(MAX_READ_THREADS, cores())
        self.pool = ThreadPoolExecutor(self.threads)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def __enter__(self) -> ParallelReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for conn in self._connections:
            conn.close()
        release_freed_memory()

    def connection(self) -> sqlite3.Connection:
        """This worker thread's own connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = open_readonly(self.path, any_thread=True)  # closed by __exit__'s thread
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def stream(
        self,
        conn: sqlite3.Connection,
        table: str,
        exprs: dict[str, str],
        where: str = "",
        ahead: int = 0,
        chunks: list[tuple[int, int]] | None = None,
        checked: tuple[str, ...] = (),
        missing: int | Mapping[str, int] = -1,
    ) -> Iterator[dict[str, np.ndarray]]:
        """The chunks of the integer columns ``exprs`` of ``table`` (``where``) in rowid order, as they come.

        At most ``ahead`` (default: one per thread, plus one) chunks are read ahead, so memory
        holds a few chunks whatever the table's size. ``chunks``: the rowid bounds to read,
        if the caller has them already (:func:`chunk_bounds`); ``checked``: columns whose cells
        must all be integers (or NULL), which no expression's arithmetic would show;
        ``missing``: what NULL reads as, for all columns or per column (default -1).
        """
        scan = Scan(table, exprs, where, chunks, checked, missing)
        for _, _, chunk in self.stream_scans(conn, [scan], ahead):
            yield chunk

    def stream_scans(
        self, conn: sqlite3.Connection, scans: list[Scan], ahead: int = 0
    ) -> Iterator[tuple[int, tuple[int, int], Any]]:
        """The chunks of several scans, one after the other, as ``(scan index, bounds,
        columns)`` (or what the scan's ``then`` made of the columns), with one window of
        ``ahead`` chunks across them: the threads start on a table's first chunks while the
        one before is still being taken, so no thread waits at a table's end (see
        :meth:`stream`)."""

        def reads() -> Iterator[tuple[int, tuple[int, int], Callable[[], Any]]]:
            for index, scan in enumerate(scans):
                query = _chunk_query(
                    scan.table,
                    scan.exprs,
                    scan.where,
                    scan.missing,
                    _column_info(conn, scan.table),
                    scan.checked,
                )
                bounds = chunk_bounds(conn, scan.table) if scan.chunks is None else scan.chunks
                for lo_hi in bounds:
                    read = functools.partial(self._stream_chunk, query, lo_hi, scan.then)
                    yield index, lo_hi, read

        window: deque[tuple[int, tuple[int, int], Future[Any]]] = deque()
        limit = ahead or self.threads + 1
        for index, bounds, read in reads():
            window.append((index, bounds, self.pool.submit(read)))
            if len(window) >= limit:
                index, bounds, future = window.popleft()
                yield index, bounds, future.result()
        while window:
            index, bounds, future = window.popleft()
            yield index, bounds, future.result()

    def _stream_chunk(
        self,
        query: _ChunkQuery,
        bounds: tuple[int, int],
        then: Callable[[dict[str, np.ndarray]], Any] | None = None,
    ) -> Any:
        worker = self.connection()
        # One pass over each page: a small page cache does, and keeps memory flat.
        worker.execute(f"PRAGMA cache_size = -{STREAM_CACHE_KIB}")
        chunk = _read_chunk(worker, query, bounds)
        return chunk if then is None else then(chunk)

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Run ``fn(connection)`` on a worker thread."""
        return self.pool.submit(lambda: fn(self.connection()))


def read_chunk(
    conn: sqlite3.Connection, table: str, exprs: dict[str, str], bounds: tuple[int, int]
) -> dict[str, np.ndarray]:
    """One chunk ``[lo, hi)`` of the integer columns ``exprs`` of ``table`` (NULL read as -1)."""
    return _read_chunk(conn, _chunk_query(table, exprs, "", -1, _column_info(conn, table)), bounds)


def row_bound(conn: sqlite3.Connection, table: str) -> int:
    """At least the number of rows in ``table`` (the rowid span; no scan)."""
    lo = conn.execute(f'SELECT min(rowid) FROM "{table}"').fetchone()[0]
    hi = conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
    return 0 if lo is None else int(hi) - int(lo) + 1


def chunk_bounds(
    conn: sqlite3.Connection, table: str, rows: int | None = None
) -> list[tuple[int, int]]:
    """``[lo, hi)`` rowid ranges of about ``rows`` (default ``CHUNK_ROWS``) rows each."""
    size = rows or CHUNK_ROWS
    # Two queries: SQLite answers min(rowid) or max(rowid) alone from the B-tree's ends,
    # but scans the whole table for both at once.
    lo = conn.execute(f'SELECT min(rowid) FROM "{table}"').fetchone()[0]
    hi = conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
    if lo is None:
        return []
    if (hi - lo) // size < MAX_SPARSE_CHUNKS:
        return [(start, start + size) for start in range(lo, hi + 1, size)]
    # Rowids far apart (a damaged or hand-made file): bounds from the rowids themselves.
    rowids = [r[0] for r in conn.execute(f'SELECT rowid FROM "{table}" ORDER BY rowid')]
    starts = rowids[::size]
    return list(zip(starts, [*starts[1:], hi + 1], strict=True))


def not_null_columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The columns of ``table`` declared NOT NULL (SQLite enforces it)."""
    return _column_info(conn, table)[1]


def _column_info(conn: sqlite3.Connection, table: str) -> tuple[set[str], set[str]]:
    """The table's columns, and those declared NOT NULL (SQLite enforces it)."""
    info = list(conn.execute(f'PRAGMA table_info("{table}")'))
    return {r[1] for r in info}, {r[1] for r in info if r[3]}


@dataclass(frozen=True)
class _ChunkQuery:
    """The SQL that reads one chunk of a table, and what it needs to explain a failure."""

    sql: str
    table: str
    names: list[str]
    columns: list[str]
    """The table's columns the expressions use (their cells' types are checked)."""
    checked: tuple[str, ...] = ()
    """Columns whose every cell must be an integer (or NULL), checked per chunk by max()."""


def _chunk_query(
    table: str,
    exprs: dict[str, str],
    where: str,
    missing: int | Mapping[str, int],
    columns: tuple[set[str], set[str]],
    checked: tuple[str, ...] = (),
) -> _ChunkQuery:
    # NULL -> ``missing`` keeps the columns aligned: group_concat skips NULLs. Expressions
    # over NOT NULL columns only skip the ifnull (a function call per value).
    all_columns, not_null = columns
    null_as = missing if isinstance(missing, Mapping) else dict.fromkeys(exprs, missing)
    selects = "".join(
        f", group_concat({expr})"
        if set(re.findall(r"[A-Za-z_]\w*", expr)) <= not_null
        else f", group_concat(ifnull({expr}, {null_as.get(name, -1)}))"
        for name, expr in exprs.items()
    )
    used = sorted({w for e in exprs.values() for w in re.findall(r"[A-Za-z_]\w*", e)} & all_columns)
    # Text and blobs sort above every number, so a chunk's max() is text or a blob exactly
    # when one of its cells is: an aggregate step a row, no function call per cell (reals
    # show in arithmetic on the column, which then does not parse as integers).
    selects += "".join(f', max("{column}")' for column in checked)
    condition = f" AND ({where})" if where else ""
    sql = f'SELECT count(*){selects} FROM "{table}" WHERE rowid >= ? AND rowid < ?{condition}'
    return _ChunkQuery(sql, table, list(exprs), used, checked)


def _read_chunk(
    conn: sqlite3.Connection, query: _ChunkQuery, bounds: tuple[int, int]
) -> dict[str, np.ndarray]:
    count, *texts = conn.execute(query.sql, bounds).fetchone()
    if query.checked:
        highest, texts = texts[len(query.names) :], texts[: len(query.names)]
        if any(not isinstance(value, int | float | None) for value in highest):
            where = f"rowid >= {bounds[0]} AND rowid < {bounds[1]}"
            raise _bad_cell(conn, query.table, list(query.checked), where)
    chunk = {}
    for name, text in zip(query.names, texts, strict=True):
        try:
            with warnings.catch_warnings():  # numpy warns (or raises) where it stops parsing
                warnings.simplefilter("ignore")
                values = np.fromstring(text or "", dtype=np.int64, sep=",")  # text mode: kept
        except ValueError:
            values = None
        if values is None or len(values) != count:
            # Only now look for the cell that broke the parse: checking every cell's type
            # in the scan itself doubled the read time of a real export.
            where = f"rowid >= {bounds[0]} AND rowid < {bounds[1]}"
            raise _bad_cell(conn, query.table, query.columns, where, name)
        chunk[name] = values
    return chunk


def strings_by_id(conn: sqlite3.Connection, ids: np.ndarray) -> dict[int, str]:
    """``StringIds`` values for the given ids (the table can hold many unrelated strings)."""
    result: dict[int, str] = {}
    unique = [int(i) for i in np.unique(ids) if 0 <= i < 1 << 63]
    for offset in range(0, len(unique), 500):  # stay under SQLite's bound-parameter limit
        batch = unique[offset : offset + 500]
        marks = ",".join("?" * len(batch))
        query = f"SELECT id, CAST(value AS TEXT) FROM StringIds WHERE id IN ({marks})"
        result.update(conn.execute(query, batch))
    return result


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). The reader threads' chunk texts leave their arenas with ~0.1 GB of free
    pages at 30 M kernels, which would otherwise count in the analysis' peak."""
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)
