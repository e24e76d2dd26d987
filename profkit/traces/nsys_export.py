"""What an Nsight Systems SQLite export (``nsys export --type sqlite``) is to profkit.

The tables and columns the reader uses, their checks, the export's meta (tool version,
GPUs, host, session start, thread names) and how columns travel packed (:class:`Codec`);
:mod:`.nsys_columns` reads the activities with them, chunk by chunk.

GPU activity comes from ``CUPTI_ACTIVITY_KIND_KERNEL`` plus ``..._MEMCPY``, ``..._MEMSET``
and, for CUDA graphs traced as a whole (``--cuda-graph-trace=graph``), ``..._GRAPH_TRACE``.
Each row is joined by (process, correlation id) to the CUDA API call that launched it in
``..._RUNTIME`` (and ``..._DRIVER`` where present), which gives the launch's start and
thread. Ranges come from ``NVTX_EVENTS`` (:mod:`.nsys_ranges`).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from profkit.errors import BadInput
from profkit.files import plain_copy
from profkit.traces import sqlite_scan
from profkit.traces.nsys_ranges import NVTX_COLUMNS, NVTX_TABLE
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT

FORMAT = "nsys-sqlite"
WHAT = "an Nsight Systems SQLite export"
STRINGS_TABLE = "StringIds"
CONTEXTS_TABLE = "TARGET_INFO_CUDA_CONTEXT_INFO"

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
GRAPH_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
API_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")
PID_BITS = f"((globalPid >> {PROCESS_SHIFT}) & {PROCESS_MASK})"
TID_PID_BITS = f"((globalTid >> {PROCESS_SHIFT}) & {PROCESS_MASK})"
SHIFT32 = 4_294_967_296
PASS_THROUGH = ("start", "duration", "key", "devstream")
DEVICES = 1024  # CUDA device ordinals are far below this
# Grid x < 2^31, y and z < 2^16; block x, y <= 1024, z <= 64: packed as x + base·(y-1 + ...)
GRID_EXPR = "gridX + 2147483648 * ((gridY - 1) + 65536 * (gridZ - 1))"
BLOCK_EXPR = "blockX + 2048 * ((blockY - 1) + 1024 * (blockZ - 1))"
# API calls that can put work on the GPU. Reading only these rows of the API tables halves
# the work on real exports; any activity left unmatched triggers a read of the rest.
LAUNCH_NAME_PATTERNS = ("%Launch%", "%Memcpy%", "%Memset%", "%Prefetch%")
MEMCPY_LABELS = {
    0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array",
    4: "Array-to-Host", 5: "Array-to-Array", 6: "Array-to-Device", 7: "Device-to-Array",
    8: "Device-to-Device", 9: "Host-to-Host", 10: "Peer-to-Peer",
}  # fmt: skip
_TIMED = ("start", "end", "correlationId", "streamId", "deviceId")
# The columns every export of 2022.4 to 2025.x has, which the reader cannot do without.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    KERNEL_TABLE: (*_TIMED, "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"),
    MEMCPY_TABLE: _TIMED,
    MEMSET_TABLE: _TIMED,
    GRAPH_TABLE: _TIMED,
    **{table: ("start", "correlationId", "nameId") for table in API_TABLES},
}
# Small tables whose integer columns are checked whole before use (the big activity
# tables are checked chunk by chunk as they are read).
SMALL_INTEGER_COLUMNS = {
    STRINGS_TABLE: ("id",),
    "ThreadNames": ("globalTid", "nameId"),
    "ENUM_NSYS_EVENT_TYPE": ("id",),
    "ENUM_CUDA_MEMCPY_OPER": ("id",),
}


class NoKernelsTraced(BadInput):
    """The export is fine but holds no GPU activity to analyse."""


@dataclass(frozen=True)
class Codec:
    """Packs columns into small integers: text transfer costs per digit (see ``sqlite_scan``).

    Keys are (process, correlation id) with the process counted from the first activity's,
    so a one-process trace's keys are its correlation ids; threads travel as offsets from
    the first API call's ``globalTid``; shapes and ids are packed so that common values
    (``x,1,1`` grids, device 0) stay short. Every packing is exact.
    """

    use_pid: bool
    pid0: int
    tid0: int
    name_bits: int

    @classmethod
    def of(cls, conn: sqlite3.Connection, tables: dict[str, list[str]]) -> Codec:
        use_pid = all("globalPid" in tables[t] for t in activity_tables(tables))
        pid0 = tid0 = 0
        if use_pid and KERNEL_TABLE in tables:
            row = conn.execute(f"SELECT {PID_BITS} FROM {KERNEL_TABLE} LIMIT 1").fetchone()
            pid0 = int(row[0] or 0) if row else 0
        for table in API_TABLES:
            if table in tables and "globalTid" in tables[table]:
                row = conn.execute(f"SELECT globalTid FROM {table} LIMIT 1").fetchone()
                tid0 = int(row[0] or 0) if row else 0
                break
        top = conn.execute("SELECT max(id) FROM StringIds").fetchone()[0] or 1
        return cls(use_pid, pid0, tid0, max(int(top).bit_length(), 1))

    def key(self, pid_bits: str) -> str:
        if not self.use_pid:
            return "correlationId"
        return f"((({pid_bits}) - {self.pid0}) & {PROCESS_MASK}) * {SHIFT32} + correlationId"

    def common(self) -> dict[str, str]:
        return {
            "start": "start",
            "duration": "end - start",
            "key": self.key(PID_BITS),
            "devstream": f"streamId * {DEVICES} + deviceId",
        }

    def names(self, full: str, short: str) -> str:
        return f"{full} * {1 << self.name_bits} + {short}"

    def split_names(self, packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return packed >> self.name_bits, packed & ((1 << self.name_bits) - 1)


def unpacked_shape(packed: int, x_bits: int, y_bits: int) -> str:
    """``"x,y,z"`` of a grid or block packed by ``GRID_EXPR``/``BLOCK_EXPR``."""
    rest = packed >> x_bits
    return (
        f"{packed & ((1 << x_bits) - 1)},{(rest & ((1 << y_bits) - 1)) + 1},{(rest >> y_bits) + 1}"
    )


def enum_labels(
    conn: sqlite3.Connection, tables: dict[str, list[str]], table: str
) -> dict[int, str]:
    if table not in tables or "label" not in tables[table]:
        return {}
    rows = conn.execute(f"SELECT id, CAST(label AS TEXT) FROM {table}")
    return {int(i): str(label) for i, label in rows if i is not None}


def activity_tables(tables: dict[str, list[str]]) -> list[str]:
    """The GPU activity tables this export has."""
    return [t for t in (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, GRAPH_TABLE) if t in tables]


def launch_name_ids(conn: sqlite3.Connection) -> list[int]:
    """``StringIds`` ids of the API functions that can put work on the GPU."""
    where = " OR ".join("value LIKE ?" for _ in LAUNCH_NAME_PATTERNS)
    return [
        r[0] for r in conn.execute(f"SELECT id FROM StringIds WHERE {where}", LAUNCH_NAME_PATTERNS)
    ]


def clamp_negative(durations: np.ndarray, meta: dict[str, Any], key: str, what: str) -> None:
    """Set negative durations to 0 in place; count them in ``meta`` and say so once."""
    negative = durations < 0
    count = int(negative.sum())
    if count:
        durations[negative] = 0
        meta[f"clamped_{key}"] = count
        meta.setdefault("warnings", []).append(
            f"{count:,} {what} end before they start (negative duration in the export); "
            "they count with 0 ms"
        )


@contextlib.contextmanager
def opened_export(path: Path) -> Iterator[tuple[sqlite3.Connection, Path]]:
    """The export at ``path`` opened read-only (unpacked first when compressed), with the
    file on disk; whatever goes wrong reading it inside the block is one :class:`BadInput`."""
    with plain_copy(path, WHAT) as plain:
        sqlite_scan.check_sqlite_file(plain, WHAT, shown=path)
        conn = sqlite_scan.open_readonly(plain)
        try:
            yield conn, plain
        except sqlite_scan.BadColumn as exc:
            raise BadInput(f"{path}: {exc}; not a usable Nsight Systems export") from None
        except sqlite3.DatabaseError as exc:
            raise BadInput(f"{path} is corrupt or truncated (SQLite: {exc})") from None
        except (ValueError, TypeError, OverflowError, KeyError) as exc:
            # Anything the checks let through: still the file's fault, one line.
            detail = f"{type(exc).__name__}: {exc}"
            raise BadInput(f"{path}: unexpected values in the export ({detail})") from None
        finally:
            conn.close()


def check_nsys(path: Path, tables: dict[str, list[str]]) -> None:
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


def check_columns(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> None:
    """Every table the reader uses has its columns; small tables hold integers where due."""
    sqlite_scan.require_columns(
        tables, {**REQUIRED_COLUMNS, NVTX_TABLE: NVTX_COLUMNS, STRINGS_TABLE: ("id", "value")}
    )
    if KERNEL_TABLE in tables:
        names = ("demangledName", "name", "mangledName")
        if not any(c in tables[KERNEL_TABLE] for c in names):
            raise sqlite_scan.BadColumn(
                f"table {KERNEL_TABLE} has no name column ({', '.join(names)})"
            )
    for table, columns in SMALL_INTEGER_COLUMNS.items():
        if table in tables:
            sqlite_scan.check_integers(conn, table, [c for c in columns if c in tables[table]])


def export_meta(
    conn: sqlite3.Connection, tables: dict[str, list[str]], path: Path
) -> dict[str, Any]:
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
    clock (:mod:`profkit.analysis.clocks`)."""
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


def no_kernels_message(
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
