"""The SQLite results database (through sqlite-utils): one row per finished run.

Rows are committed one at a time, as each run finishes, so an interrupted sweep keeps
everything it finished. Any command can store rows with :func:`record`; ``profkit bench``
writes the ``bench`` table. The default database is ``profiles/results.db``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from profkit.errors import BadInput
from profkit.files import check_readable, check_writable
from profkit.workload.config import RUN_FIELDS, WorkloadConfig

DEFAULT_DB = Path("profiles/results.db")
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
        raise BadInput(f"no results database at {path}")
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
    except sqlite3.DatabaseError as exc:
        raise BadInput(f"{path} is not a usable SQLite database: {exc}") from None
    return db


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
    return json.dumps(fields, sort_keys=True)


def _column_type(value: Any) -> type:
    if value is None:
        # BLOB affinity stores values as given; TEXT (sqlite-utils' default for None) would
        # turn the numbers of later rows into strings.
        return bytes
    if isinstance(value, bool | int):
        return int
    if isinstance(value, float):
        return float
    return str  # str, and lists/dicts that sqlite-utils stores as JSON text


def ensure_table(
    db: sqlite_utils.Database,
    table: str,
    row: Mapping[str, Any],
    column_types: Mapping[str, type] | None = None,
) -> None:
    """Create ``table`` or add the columns ``row`` brings, typed by ``column_types`` or value."""
    column_types = column_types or {}
    wanted = {**{k: _column_type(v) for k, v in row.items()}, **column_types}
    existing = db.table(table)
    if not existing.exists():
        db.create_table(table, wanted)
        return
    have = set(existing.columns_dict)
    for name, kind in wanted.items():
        if name not in have:
            existing.add_column(name, kind)


def insert(
    db: sqlite_utils.Database,
    table: str,
    row: Mapping[str, Any],
    column_types: Mapping[str, type] | None = None,
) -> None:
    """Insert one row and commit it at once (so Ctrl-C later loses nothing finished)."""
    try:
        ensure_table(db, table, row, column_types)
        db.table(table).insert(dict(row))  # sqlite-utils commits the insert on return
    except sqlite3.Error as exc:
        raise BadInput(f"cannot write to the results database: {exc}") from None


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
