"""Opening SQLite files defensively and reading integer columns from them fast.

Nsight Systems exports reach millions of rows. Fetching them row by row through the
``sqlite3`` cursor builds a Python tuple and an int object per cell, which costs more than
everything else profkit does with them. Instead each chunk of rows is aggregated inside
SQLite into one comma-separated string per column (``group_concat``) and parsed by numpy
in C: about twice less CPU time per value, and all columns of a chunk come from one scan,
so they stay aligned row for row.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np

from profkit.errors import BadInput

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100
CHUNK_ROWS = 500_000  # ~10 MB of text per column per chunk: bounded memory, few queries
# Reader threads, whatever the core count: each holds a connection with its page cache and
# a chunk's group_concat strings (SQLite's and Python's copies) in flight, and glibc keeps
# an arena per thread. On the 3 M-kernel benchmark (docs/PERFORMANCE.md) peak RSS grew by
# about 0.07 GiB per thread (0.78 GiB with 1 thread, 1.05 with 4, 1.33 with 8), while on
# 16 cores the read went only from 3.9 s with 4 threads to 3.5 s with 8.
MAX_READ_THREADS = 4
T = TypeVar("T")


def check_sqlite_file(path: Path, what: str) -> None:
    """Raise :class:`BadInput` unless ``path`` is a readable, complete SQLite file.

    ``what`` names the expected kind of file in messages ("an Nsight Systems export").
    """
    if not path.exists():
        raise BadInput(f"no such file: {path}")
    if path.is_dir():
        raise BadInput(f"{path} is a directory, not {what}")
    try:
        with path.open("rb") as handle:
            header = handle.read(HEADER_BYTES)
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    size = path.stat().st_size
    if size == 0:
        raise BadInput(f"{path} is empty (0 bytes), not {what}")
    if not header.startswith(SQLITE_MAGIC):
        raise BadInput(f"{path} is not an SQLite database (expected {what})")
    if len(header) < HEADER_BYTES:
        raise BadInput(f"{path} is truncated ({size:,} bytes): an incomplete SQLite file")
    # The header records the page size and (since SQLite 3.7) the page count: a file
    # shorter than that was cut off, e.g. by a copy or an export that did not finish.
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65_536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    change_counter = int.from_bytes(header[24:28], "big")
    valid_for = int.from_bytes(header[92:96], "big")
    if pages and change_counter == valid_for and size < pages * page_size:
        raise BadInput(
            f"{path} is truncated: {size:,} bytes where its header promises "
            f"{pages * page_size:,} (copy or export it again)"
        )


def open_readonly(path: Path, any_thread: bool = False) -> sqlite3.Connection:
    """A read-only connection that never writes beside the file (no journal, no locks).

    ``any_thread`` lets another thread than the opener's close it (it is still used by one
    thread at a time).
    """
    uri = path.resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=not any_thread)
        conn.execute("PRAGMA cache_size = -65536")  # 64 MiB: the scans below reread pages
    except sqlite3.Error as exc:
        raise BadInput(f"{path} is corrupt: SQLite cannot read it ({exc})") from None
    return conn


def table_columns(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """Every table's column names."""
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {name: [r[1] for r in conn.execute(f'PRAGMA table_info("{name}")')] for name in names}


def read_int_columns(
    conn: sqlite3.Connection,
    table: str,
    exprs: dict[str, str],
    where: str = "",
    missing: int = -1,
) -> dict[str, np.ndarray]:
    """Integer columns of ``table`` as int64 arrays, in rowid order, NULL read as ``missing``.

    ``exprs`` maps each output name to an SQL expression over the table's columns (packing
    several small columns into one integer saves a column's worth of work).
    """
    query = _chunk_query(table, exprs, where, missing, _not_null(conn, table))
    chunks = [_read_chunk(conn, query, table, exprs, lo) for lo in _chunk_starts(conn, table)]
    return _concatenate(chunks, exprs)


class ParallelReader:
    """Reads chunks of integer columns on a few threads, each with its own connection.

    SQLite aggregates without holding the GIL, so chunks of several tables are read at the
    same time; submit everything first, then collect the results in order::

        with ParallelReader(path) as reader:
            kernels = reader.columns(conn, "CUPTI_ACTIVITY_KIND_KERNEL", {"start": "start"})
            calls = reader.columns(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", {...})
            kernels.result(), calls.result()
    """

    def __init__(self, path: Path, threads: int | None = None) -> None:
        self.path = path
        self.threads = threads or min(MAX_READ_THREADS, os.cpu_count() or 1)
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

    def connection(self) -> sqlite3.Connection:
        """This worker thread's own connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = open_readonly(self.path, any_thread=True)  # closed by __exit__'s thread
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def columns(
        self,
        conn: sqlite3.Connection,
        table: str,
        exprs: dict[str, str],
        where: str = "",
        missing: int = -1,
    ) -> Pending:
        """Queue the read of ``read_int_columns(table, exprs, where)``; ``.result()`` waits."""
        query = _chunk_query(table, exprs, where, missing, _not_null(conn, table))

        def chunk(lo: int) -> dict[str, np.ndarray]:
            return _read_chunk(self.connection(), query, table, exprs, lo)

        futures = [self.pool.submit(chunk, lo) for lo in _chunk_starts(conn, table)]
        return Pending(futures, list(exprs))

    def stream(
        self,
        conn: sqlite3.Connection,
        table: str,
        exprs: dict[str, str],
        where: str = "",
        ahead: int = 0,
    ) -> Iterator[dict[str, np.ndarray]]:
        """The chunks of ``read_int_columns(table, exprs, where)`` in rowid order, as they come.

        At most ``ahead`` (default: one per thread, plus one) chunks are read ahead, so memory
        holds a few chunks whatever the table's size.
        """
        query = _chunk_query(table, exprs, where, -1, _not_null(conn, table))

        def chunk(lo: int) -> dict[str, np.ndarray]:
            return _read_chunk(self.connection(), query, table, exprs, lo)

        window: deque[Future[dict[str, np.ndarray]]] = deque()
        limit = ahead or self.threads + 1
        for lo in _chunk_starts(conn, table):
            window.append(self.pool.submit(chunk, lo))
            if len(window) >= limit:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Run ``fn(connection)`` on a worker thread."""
        return self.pool.submit(lambda: fn(self.connection()))


class Pending:
    """A queued read: :meth:`result` waits for it and concatenates its chunks."""

    def __init__(self, futures: list[Future[dict[str, np.ndarray]]], names: list[str]) -> None:
        self._futures = futures
        self.names = names

    def chunks(self) -> list[dict[str, np.ndarray]]:
        """The columns of each chunk, in rowid order (to concatenate once, with others)."""
        return [future.result() for future in self._futures]

    def result(self) -> dict[str, np.ndarray]:
        return _concatenate(self.chunks(), self.names)


def row_bound(conn: sqlite3.Connection, table: str) -> int:
    """At least the number of rows in ``table`` (the rowid span; no scan)."""
    chunks = _chunk_starts(conn, table)
    if not chunks:
        return 0
    hi = conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
    return int(hi) - chunks.start + 1


def _chunk_starts(conn: sqlite3.Connection, table: str) -> range:
    # Two queries: SQLite answers min(rowid) or max(rowid) alone from the B-tree's ends,
    # but scans the whole table for both at once.
    lo = conn.execute(f'SELECT min(rowid) FROM "{table}"').fetchone()[0]
    hi = conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
    return range(0) if lo is None else range(lo, hi + 1, CHUNK_ROWS)


def _not_null(conn: sqlite3.Connection, table: str) -> set[str]:
    """Columns declared NOT NULL (SQLite enforces it, so they never hold a NULL)."""
    return {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")') if r[3]}


def _chunk_query(
    table: str, exprs: dict[str, str], where: str, missing: int, not_null: set[str]
) -> str:
    # NULL -> ``missing`` keeps the columns aligned: group_concat skips NULLs. Expressions
    # over NOT NULL columns only skip the ifnull (a function call per value).
    selects = "".join(
        f", group_concat({expr})"
        if set(re.findall(r"[A-Za-z_]\w*", expr)) <= not_null
        else f", group_concat(ifnull({expr}, {missing}))"
        for expr in exprs.values()
    )
    condition = f" AND ({where})" if where else ""
    return f'SELECT count(*){selects} FROM "{table}" WHERE rowid >= ? AND rowid < ?{condition}'


def _read_chunk(
    conn: sqlite3.Connection, query: str, table: str, exprs: dict[str, str], lo: int
) -> dict[str, np.ndarray]:
    count, *texts = conn.execute(query, (lo, lo + CHUNK_ROWS)).fetchone()
    chunk = {}
    for name, text in zip(exprs, texts, strict=True):
        values = np.fromstring(text or "", dtype=np.int64, sep=",")  # text mode: supported
        if len(values) != count:
            raise sqlite3.DatabaseError(f"column {name!r} of {table} is not all integers")
        chunk[name] = values
    return chunk


def _concatenate(
    chunks: list[dict[str, np.ndarray]], names: Iterable[str]
) -> dict[str, np.ndarray]:
    return {
        name: np.concatenate([c[name] for c in chunks]) if chunks else np.empty(0, np.int64)
        for name in names
    }


def strings_by_id(conn: sqlite3.Connection, ids: np.ndarray) -> dict[int, str]:
    """``StringIds`` values for the given ids (the table can hold many unrelated strings)."""
    result: dict[int, str] = {}
    unique = [int(i) for i in np.unique(ids) if i >= 0]
    for offset in range(0, len(unique), 500):  # stay under SQLite's bound-parameter limit
        batch = unique[offset : offset + 500]
        marks = ",".join("?" * len(batch))
        result.update(conn.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", batch))
    return result
