"""The SQLite results database (through sqlite-utils): one row per finished run.

Rows are committed one at a time, as each run finishes, so an interrupted sweep keeps
everything it finished. Any command can store rows with :func:`record`; ``profkit bench``
writes the ``bench`` table. The default database is ``profiles/results.db``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from profkit.errors import BadInput, warn
from profkit.files import DEFAULT_DB, SQLITE_SHORT_PATH, check_readable, check_writable
from profkit.workload.config import RUN_FIELDS, WorkloadConfig

__all__ = ["DEFAULT_DB"]  # the results DB's default path, declared in profkit.files
SQLITE_HEADER = b"SQLite format 3\x00"
# A second sweep writing the same DB waits for the lock instead of failing at once.
BUSY_TIMEOUT_S = 30.0
# The fields that make two runs "the same config" (what --resume compares).
KEY_FIELDS = (*RUN_FIELDS, "vocab_size", "seed")


def open_db(path: Path | str, write: bool = True) -> sqlite_utils.Database:
    """Open a results database (created if ``write``), or raise one clear :class:`BadInput`.

    Catches what users hit: a path that cannot be written, a file that is not SQLite, a
    corrupt database.
    """
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{path} is a directory, not a results database (give the .db file)")
    if path.exists():
        check_readable(path, "a results database")  # a FIFO would hang the first read
    if write:
        check_writable(path)
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.is_file():
        found = db_elsewhere(path)
        hint = f" (there is one at {found}: give --db {found})" if found else ""
        raise BadInput(f"no results database at {path}{hint}")
    if path.exists() and path.stat().st_size:
        with path.open("rb") as handle:
            if handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                raise BadInput(f"{path} is not a SQLite database (not a profkit results DB?)")
    try:
        target = str(path) if write else f"{path.resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(target, timeout=BUSY_TIMEOUT_S, uri=not write)
        db = sqlite_utils.Database(conn)
        # quick_check reads every page: cheap for a results DB, and it turns corruption into
        # a message now rather than a traceback halfway through a sweep.
        check = db.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(check[0] if check else "quick_check failed")
        nsys = db.execute(_NSYS_TABLES).fetchone() is not None
    except sqlite3.DatabaseError as exc:
        length = len(os.fsencode(path.resolve()))
        if isinstance(exc, sqlite3.OperationalError) and length >= SQLITE_SHORT_PATH:
            # A journal beside a hard link would not be the DB's: no short alias here.
            raise BadInput(
                f"{path}: its full path is {length:,} bytes, longer than SQLite opens "
                "(about 500): move the results DB to a shorter path"
            ) from None
        raise BadInput(f"{path} is not a usable SQLite database: {exc}") from None
    if nsys:  # rows written into a profile would mix with its tables; reading it finds none
        db.conn.close()
        raise BadInput(
            f"{path} is an Nsight Systems export, not a results database (give --db another "
            f"file; `profkit kernels {path}` reads the export)"
        )
    return db


# Tables every Nsight Systems SQLite export has, and no results DB.
_NSYS_TABLES = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND (name = 'StringIds' "
    "OR name LIKE 'CUPTI_ACTIVITY_KIND_%' OR name LIKE 'TARGET_INFO_%') LIMIT 1"
)


@contextmanager
def opened(path: Path | str, write: bool = True) -> Iterator[sqlite_utils.Database]:
    """:func:`open_db` as a context manager that closes the connection."""
    path = Path(path)
    new = write and not path.exists()
    db = open_db(path, write)
    try:
        yield db
    finally:
        db.conn.close()
        # Opening creates the file; one that never got a row (Ctrl-C before the first run
        # finished) would only be a 0-byte file that later reads as "no results".
        if new and path.is_file() and path.stat().st_size == 0:
            path.unlink(missing_ok=True)


def db_elsewhere(path: Path) -> Path | None:
    """A results DB of the same name one folder down, if there is one (``profkit demo``
    writes ``profiles/demo/results.db``, beside the default ``profiles/results.db``)."""
    with contextlib.suppress(OSError):
        found = sorted(p for p in path.parent.glob(f"*/{path.name}") if p.is_file())
        if found:
            return found[0]
    return None


def check_db(path: Path | str) -> None:
    """Fail early (before any work) if ``path`` cannot serve as a results database.

    An existing file must be a sound SQLite database; a new one must be creatable (it is
    not created: the first finished row creates it).
    """
    path = Path(path)
    if path.exists():
        with opened(path):
            pass
    else:
        check_writable(path)


def config_key(config: WorkloadConfig, device: str, gpu_name: str | None = None) -> str:
    """The identity of a run for ``--resume``: config fields, concrete device and GPU model."""
    fields = {name: getattr(config, name) for name in KEY_FIELDS}
    fields["device"] = device
    fields["gpu_name"] = gpu_name
    if config.nproc > 1:  # only then, so that one-process rows keep their earlier keys
        fields.update(nproc=config.nproc, parallel=config.parallel)
    return json.dumps(fields, sort_keys=True)


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (sqlite3 binds only the latter)."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        return value.item()
    return value


def _column_type(value: Any) -> type:
    value = _plain(value)
    if value is None:
        # BLOB affinity stores values as given; TEXT (sqlite-utils' default for None) would
        # turn the numbers of later rows into strings.
        return bytes
    if isinstance(value, bool | int):
        return int
    if isinstance(value, float):
        return float
    return str  # str, and lists/dicts that sqlite-utils stores as JSON text


_SQL_TYPES = {int: "INTEGER", float: "REAL", str: "TEXT", bytes: "BLOB"}


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_value(value: Any) -> Any:
    value = _plain(value)
    if isinstance(value, list | tuple | dict):
        return json.dumps(value)  # as sqlite-utils stores them: JSON text
    return value


@contextmanager
def write_transaction(db: sqlite_utils.Database) -> Iterator[None]:
    """One exclusive write: ``BEGIN IMMEDIATE`` (waits up to the busy timeout for other
    writers) ... ``COMMIT``, rolled back on any error.

    Taking the write lock first makes "does the table exist, which columns has it, insert"
    one step: processes recording their first rows into one new DB at once cannot both
    create the table (the loser used to fail with ``table already exists`` and lose its row).
    """
    conn = db.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def ensure_table(
    db: sqlite_utils.Database,
    table: str,
    row: Mapping[str, Any],
    column_types: Mapping[str, type] | None = None,
) -> None:
    """Create ``table`` or add the columns ``row`` brings, typed by ``column_types`` or value.

    Call it inside :func:`write_transaction` so no other process changes the schema between
    the look and the change.
    """
    column_types = column_types or {}
    wanted = {**{k: _column_type(v) for k, v in row.items()}, **column_types}
    conn = db.conn
    have = {r[1] for r in conn.execute(f"PRAGMA table_info({_quote(table)})")}
    if not have:
        columns = ", ".join(f"{_quote(n)} {_SQL_TYPES[k]}" for n, k in wanted.items())
        conn.execute(f"CREATE TABLE IF NOT EXISTS {_quote(table)} ({columns})")
        return
    for name, kind in wanted.items():
        if name not in have:
            conn.execute(
                f"ALTER TABLE {_quote(table)} ADD COLUMN {_quote(name)} {_SQL_TYPES[kind]}"
            )


def insert(
    db: sqlite_utils.Database,
    table: str,
    row: Mapping[str, Any],
    column_types: Mapping[str, type] | None = None,
) -> None:
    """Insert one row and commit it at once (so Ctrl-C later loses nothing finished).

    Safe with other processes writing the same DB: schema and row go in one
    :func:`write_transaction`, which waits for the others (``BUSY_TIMEOUT_S``).
    """
    names = ", ".join(_quote(n) for n in row)
    marks = ", ".join("?" for _ in row)
    try:
        with write_transaction(db):
            ensure_table(db, table, row, column_types)
            db.conn.execute(
                f"INSERT INTO {_quote(table)} ({names}) VALUES ({marks})",
                [_sql_value(v) for v in row.values()],
            )
    except sqlite3.Error as exc:
        raise BadInput(f"cannot write to the results database: {exc}") from None


def probe_insert(
    db: sqlite_utils.Database,
    table: str,
    row: Mapping[str, Any],
    column_types: Mapping[str, type] | None = None,
) -> None:
    """Raise :class:`BadInput` now if ``row`` could not be stored in ``table``; stores nothing.

    Run before the work, so a DB that cannot take the rows (a foreign ``bench`` table with
    NOT NULL columns, a view of that name, a read-only file) is found before minutes of
    measuring, not after. The row goes in and is rolled back.
    """
    kind = db.conn.execute(
        "SELECT type FROM sqlite_master WHERE name = ? AND type != 'table'", [table]
    ).fetchone()
    if kind is not None:
        raise BadInput(
            f"{_path_of(db)} has a {kind[0]} named {table!r} where profkit keeps its "
            f"{table} table; use another --db"
        )
    names = ", ".join(_quote(n) for n in row)
    marks = ", ".join("?" for _ in row)
    try:
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            ensure_table(db, table, row, column_types)
            db.conn.execute(
                f"INSERT INTO {_quote(table)} ({names}) VALUES ({marks})",
                [_sql_value(v) for v in row.values()],
            )
        finally:
            db.conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise BadInput(
            f"{_path_of(db)} cannot take profkit's {table} rows: {exc} (use another --db)"
        ) from None


def _path_of(db: sqlite_utils.Database) -> str:
    row = db.conn.execute("PRAGMA database_list").fetchone()
    return str(row[2]) if row and row[2] else "the results database"


def record(
    db_path: Path | str,
    table: str,
    row: Mapping[str, Any],
    column_types: Mapping[str, type] | None = None,
) -> None:
    """Store one row in ``table`` of the results DB at ``db_path`` (any command may use this)."""
    with opened(db_path) as db:
        insert(db, table, row, column_types)


def rows(
    db_path: Path | str,
    table: str,
    where: str | None = None,
    where_args: dict[str, Any] | None = None,
    required: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """All rows of ``table`` in insertion order (empty if the table does not exist).

    Raises :class:`BadInput` (one line) when ``table`` is a view or an index rather than a
    table, or lacks one of the ``required`` columns: a table another tool made under the
    same name, whose rows would otherwise be read with every missing field as null. JSON
    columns come back as text; callers that know their schema decode them.
    """
    with opened(db_path, write=False) as db:
        found = db.execute(
            "SELECT type FROM sqlite_master WHERE name = ? COLLATE NOCASE", [table]
        ).fetchone()
        if found is None:
            return []
        if found[0] != "table":
            raise BadInput(f"{db_path}: {table!r} is a {found[0]}, not a table of profkit rows")
        missing = [c for c in required if c not in db.table(table).columns_dict]
        if missing:
            raise BadInput(
                f"{db_path}: its {table} table lacks column(s) {', '.join(missing)}: "
                "not one profkit wrote (or damaged)"
            )
        try:
            return list(db.table(table).rows_where(where, where_args, order_by="rowid"))
        except sqlite3.Error as exc:
            raise BadInput(f"cannot read the {table} table of {db_path}: {exc}") from None


Row = dict[str, Any]
Decode = Callable[[Row, list[str]], Row]


def checked_rows(
    db_path: Path | str, table: str, required: tuple[str, ...], decode: Decode
) -> list[Row]:
    """The rows of a profkit ``table``, oldest first, each decoded by ``decode(row, bad)``.

    The one schema check of every table a command reads back (bench, attention, memory).
    A table that is not one profkit wrote (a view; without a ``required`` column) raises
    :class:`BadInput`. ``decode`` reads a cell of the wrong type as null and appends its
    column to ``bad``; a row left without one of its ``required`` fields cannot be placed
    (which config? how did it end?) and is left out. Both are counted in one warning.
    """
    bad: list[str] = []
    kept, lacking = [], []
    for row in rows(db_path, table, required=required):
        decoded = decode(row, bad)
        missing = [name for name in required if decoded.get(name) is None]
        lacking += missing[:1]
        if not missing:
            kept.append(decoded)
    said = []
    if bad:
        said.append(f"{len(bad):,} cell(s) held values of the wrong type or range and read as empty "
                    f"({', '.join(sorted(set(bad)))})")  # fmt: skip
    if lacking:
        said.append(f"{len(lacking):,} row(s) without their {' or '.join(dict.fromkeys(lacking))} "
                    "are left out")  # fmt: skip
    if said:
        warn(f"{db_path}: the {table} table: {'; '.join(said)}")
    return kept


def typed_cells(row: Row, types: Mapping[str, type], bad: list[str]) -> Row:
    """``row`` with every column of ``types`` present (null where an older table lacks it),
    bool columns (stored as 0/1) as bools, and each cell of the wrong type as null, its
    column appended to ``bad``."""
    out = {name: None for name in types} | row
    for name, kind in types.items():
        value = out[name]
        if value is None:
            continue
        if not fits(value, int if kind is bool else kind):
            out[name] = None
            bad.append(name)
        elif kind is bool:
            out[name] = bool(value)
    return out


def fits(value: Any, kind: type) -> bool:
    """Whether a cell read back from SQLite holds a ``kind`` (str, int or float; finite)."""
    if kind is str:
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and (kind is float or float(value).is_integer())
