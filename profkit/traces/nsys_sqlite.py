"""Nsight Systems SQLite exports (``nsys export --type sqlite``) as profkit's two tables.

GPU activity comes from ``CUPTI_ACTIVITY_KIND_KERNEL`` plus ``..._MEMCPY``, ``..._MEMSET``
and, for CUDA graphs traced as a whole (``--cuda-graph-trace=graph``), ``..._GRAPH_TRACE``.
Each row is joined by (process, correlation id) to the CUDA API call that launched it in
``..._RUNTIME`` (and ``..._DRIVER`` where present), which gives ``launch_start`` and
``launch_thread``. Ranges come from ``NVTX_EVENTS`` push/pop and start/end ranges, named by
``text`` or ``textId`` -> ``StringIds``, with their domain's name.

Schema tolerance, nsys 2022.4 to 2025.x: columns are looked up before use (``globalPid``,
``shortName``, ``textId``, ``domainId`` are optional), event types come from
``ENUM_NSYS_EVENT_TYPE`` when present, and the export metadata table is found under either
of its names (``EXPORT_META_DATA`` before 2023, ``META_DATA_EXPORT`` after).

``globalTid`` packs the process id in bits 24-47 and the thread id in bits 0-23;
``globalPid`` is the same with the thread bits zero.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from profkit.errors import BadInput
from profkit.files import plain_copy
from profkit.sidecar import read_sidecar
from profkit.traces import _sqlite
from profkit.traces.nsys_activity import (
    API_TABLES,
    KERNEL_TABLE,
    REQUIRED_COLUMNS,
    Codec,
    activity_jobs,
    api_jobs,
    collect_activity,
    collect_calls,
    join_launches,
    kernel_frame,
    launch_name_ids,
)
from profkit.traces.nsys_ranges import NVTX_COLUMNS, NVTX_TABLE, build_ranges, nvtx_rows
from profkit.traces.schema import Trace

FORMAT = "nsys-sqlite"
WHAT = "an Nsight Systems SQLite export"
STRINGS_TABLE = "StringIds"
# Small tables whose integer columns are checked whole before use (the big activity
# tables are checked chunk by chunk as they are read).
SMALL_INTEGER_COLUMNS = {
    STRINGS_TABLE: ("id",),
    "ThreadNames": ("globalTid", "nameId"),
    "ENUM_NSYS_EVENT_TYPE": ("id",),
    "ENUM_CUDA_MEMCPY_OPER": ("id",),
}


CONTEXTS_TABLE = "TARGET_INFO_CUDA_CONTEXT_INFO"


class NoKernelsTraced(BadInput):
    """The export is fine but holds no GPU activity to analyse."""


def read_nsys_sqlite(path: str | Path) -> Trace:
    """Read an Nsight Systems SQLite export into a :class:`Trace`.

    Raises :class:`BadInput` (one line naming the file) for a file that is missing, not a
    regular file, unreadable, not SQLite, truncated, empty, not an nsys export, or one whose
    tables lack the columns or hold cells of types an export never has; and
    :class:`NoKernelsTraced` (a ``BadInput``) with the likely reason when the export holds
    no CUDA kernels. An ``.xz``/``.gz`` export is read directly (unpacked to a temporary
    file). The sidecar beside it, if any, is ``meta["sidecar"]``.
    """
    path = Path(path)
    with opened_export(path) as (conn, plain):
        trace = _read(conn, plain, path)
    trace.meta["sidecar"] = read_sidecar(path)
    return trace


@contextlib.contextmanager
def opened_export(path: Path) -> Iterator[tuple[sqlite3.Connection, Path]]:
    """The export at ``path`` opened read-only (unpacked first when compressed), with the
    file on disk; whatever goes wrong reading it inside the block is one :class:`BadInput`."""
    with plain_copy(path, WHAT) as plain:
        _sqlite.check_sqlite_file(plain, WHAT, shown=path)
        conn = _sqlite.open_readonly(plain)
        try:
            yield conn, plain
        except _sqlite.BadColumn as exc:
            raise BadInput(f"{path}: {exc}; not a usable Nsight Systems export") from None
        except sqlite3.DatabaseError as exc:
            raise BadInput(f"{path} is corrupt or truncated (SQLite: {exc})") from None
        except (ValueError, TypeError, OverflowError, KeyError) as exc:
            # Anything the checks let through: still the file's fault, one line.
            detail = f"{type(exc).__name__}: {exc}"
            raise BadInput(f"{path}: unexpected values in the export ({detail})") from None
        finally:
            conn.close()


def _read(conn: sqlite3.Connection, plain: Path, path: Path) -> Trace:
    """The tables of the open export ``conn`` (``plain`` on disk; ``path`` as the user named it)."""
    tables = _sqlite.table_columns(conn)
    _check_nsys(path, tables)
    _check_columns(conn, tables)
    meta = _meta(conn, tables, path)
    codec = Codec.of(conn, tables)
    launch_ids = launch_name_ids(conn)
    # Every table is queued at once and read in chunks by worker threads, each with its
    # own connection: SQLite runs without the GIL, so the scans share the cores.
    with _sqlite.ParallelReader(plain) as reader:
        pending = activity_jobs(reader, conn, tables, codec)
        call_jobs = api_jobs(reader, conn, tables, codec, launch_ids, launch_only=True)
        nvtx_job = reader.call(lambda worker: nvtx_rows(worker, tables))
        activity = collect_activity(conn, tables, pending, codec)
        calls = collect_calls(call_jobs, codec)
        range_rows, domain_rows = nvtx_job.result()
        if not activity["rows"]:
            raise NoKernelsTraced(_no_kernels_message(path, conn, tables, meta))

        def other_calls() -> dict[str, np.ndarray]:
            jobs = api_jobs(reader, conn, tables, codec, launch_ids, launch_only=False)
            return collect_calls(jobs, codec)

        # Without launch-like names, the first read already took every call.
        join_launches(activity, calls, other_calls if launch_ids else None)
    kernels = kernel_frame(activity, meta)
    trace_end = int(kernels["end"].max())
    ranges = build_ranges(range_rows, domain_rows, trace_end, meta)
    return Trace(kernels=kernels, ranges=ranges, meta=meta)


def _check_nsys(path: Path, tables: dict[str, list[str]]) -> None:
    if not tables:
        raise BadInput(f"{path} is an empty SQLite database, not {WHAT}")
    nsys_marks = {NVTX_TABLE, KERNEL_TABLE, *API_TABLES, "TARGET_INFO_GPU"}
    if not nsys_marks & set(tables):
        hint = ""
        if "bench" in tables:  # profkit's results DB
            hint = ": it is a profkit results DB (`profkit compare`, `profkit report --db` read it)"
        raise BadInput(f"{path} is an SQLite database but not {WHAT} (no nsys tables in it){hint}")
    if STRINGS_TABLE not in tables:
        raise BadInput(
            f"{path} has nsys tables but no {STRINGS_TABLE} table, where an export keeps "
            "every kernel and range name: the export is damaged (export it again)"
        )


def _check_columns(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> None:
    """Every table the reader uses has its columns; small tables hold integers where due."""
    _sqlite.require_columns(
        tables, {**REQUIRED_COLUMNS, NVTX_TABLE: NVTX_COLUMNS, STRINGS_TABLE: ("id", "value")}
    )
    if KERNEL_TABLE in tables:
        names = ("demangledName", "name", "mangledName")
        if not any(c in tables[KERNEL_TABLE] for c in names):
            raise _sqlite.BadColumn(f"table {KERNEL_TABLE} has no name column ({', '.join(names)})")
    for table, columns in SMALL_INTEGER_COLUMNS.items():
        if table in tables:
            _sqlite.check_integers(conn, table, [c for c in columns if c in tables[table]])


def _meta(conn: sqlite3.Connection, tables: dict[str, list[str]], path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = {"path": str(path), "format": FORMAT, "tool": "Nsight Systems"}
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables:
            found = conn.execute(
                f"SELECT value FROM {table} WHERE name = 'EXPORT_PRODUCT_VERSION'"
            ).fetchone()
            if found and found[0] is not None:
                meta["tool_version"] = str(found[0])
            break
    if "TARGET_INFO_GPU" in tables and "name" in tables["TARGET_INFO_GPU"]:
        order = "id" if "id" in tables["TARGET_INFO_GPU"] else "rowid"
        gpus = [r[0] for r in conn.execute(f"SELECT name FROM TARGET_INFO_GPU ORDER BY {order}")]
        meta["gpus"] = [str(g) for g in gpus if g]
    elif "TARGET_INFO_CUDA_DEVICE" in tables and "name" in tables["TARGET_INFO_CUDA_DEVICE"]:
        meta["gpus"] = [str(r[0]) for r in conn.execute("SELECT name FROM TARGET_INFO_CUDA_DEVICE")]
    meta["gpu"] = ", ".join(dict.fromkeys(meta.get("gpus", []))) or None
    meta["thread_names"] = _thread_names(conn, tables)
    meta.update(_host_and_start(conn, tables))
    meta["warnings"] = []
    return meta


def _host_and_start(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> dict[str, Any]:
    """The profiled host's name and the session's start (UTC, ns since the epoch), where
    the export records them: what tells several nodes' reports apart and puts them on one
    clock (:mod:`profkit.analysis.nodes`)."""
    found: dict[str, Any] = {}
    if {"name", "value"} <= set(tables.get("TARGET_INFO_SYSTEM_ENV", [])):
        row = conn.execute(
            "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1"
        ).fetchone()
        if row and row[0]:
            found["host"] = str(row[0])
    if "utcEpochNs" in tables.get("TARGET_INFO_SESSION_START_TIME", []):
        row = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        if row and isinstance(row[0], int):
            found["session_start_utc_ns"] = row[0]
    return found


def _thread_names(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> dict[int, str]:
    if "ThreadNames" not in tables:
        return {}
    rows = conn.execute(
        "SELECT t.globalTid, CAST(s.value AS TEXT) FROM ThreadNames t "
        "JOIN StringIds s ON s.id = t.nameId"
    )
    return {int(tid): str(name) for tid, name in rows if tid is not None}


def _count(conn: sqlite3.Connection, tables: dict[str, list[str]], table: str) -> int:
    return conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] if table in tables else 0


def _no_kernels_message(
    path: Path, conn: sqlite3.Connection, tables: dict[str, list[str]], meta: dict[str, Any]
) -> str:
    version = meta.get("tool_version")
    nsys = f"Nsight Systems {version}" if version else "this Nsight Systems"
    api_calls = sum(_count(conn, tables, t) for t in API_TABLES)
    what = (
        f"the export has no {KERNEL_TABLE} table"
        if KERNEL_TABLE not in tables
        else "its kernel tables are empty"
    )
    if api_calls:
        why = (
            f"{nsys} recorded {api_calls:,} CUDA API call(s) but no kernel: either the program "
            "launched none inside the capture range, or this nsys is too old to decode the "
            "CUDA version's launches (use an nsys at least as new as the CUDA toolkit)"
        )
    else:
        why = (
            "CUDA was not traced: profile with `nsys profile -t cuda,nvtx ...` (the --trace "
            "list must include cuda) and make sure the program uses the GPU while capturing"
        )
    return f"{path}: no CUDA kernels were traced ({what}); {why}"
