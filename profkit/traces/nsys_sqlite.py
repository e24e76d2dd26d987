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

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from profkit.errors import BadInput
from profkit.traces import _sqlite
from profkit.traces.nsys_activity import (
    API_TABLES,
    KERNEL_TABLE,
    Codec,
    activity_jobs,
    api_jobs,
    collect_activity,
    collect_calls,
    join_launches,
    kernel_frame,
    launch_name_ids,
)
from profkit.traces.nsys_ranges import NVTX_TABLE, build_ranges, nvtx_rows
from profkit.traces.schema import Trace

FORMAT = "nsys-sqlite"
WHAT = "an Nsight Systems SQLite export"
SIDECAR_SUFFIX = ".profkit.json"


class NoKernelsTraced(BadInput):
    """The export is fine but holds no GPU activity to analyse."""


def read_nsys_sqlite(path: str | Path) -> Trace:
    """Read an Nsight Systems SQLite export into a :class:`Trace`.

    Raises :class:`BadInput` for a file that is missing, unreadable, not SQLite, truncated,
    empty or not an nsys export, and :class:`NoKernelsTraced` (a ``BadInput``) with the
    likely reason when the export holds no CUDA kernels.
    """
    path = Path(path)
    _sqlite.check_sqlite_file(path, WHAT)
    conn = _sqlite.open_readonly(path)
    try:
        tables = _sqlite.table_columns(conn)
        _check_nsys(path, tables)
        meta = _meta(conn, tables, path)
        codec = Codec.of(conn, tables)
        launch_ids = launch_name_ids(conn)
        # Every table is queued at once and read in chunks by worker threads, each with its
        # own connection: SQLite runs without the GIL, so the scans share the cores.
        with _sqlite.ParallelReader(path) as reader:
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
        kernels = kernel_frame(activity)
        trace_end = int(kernels["end"].max())
        ranges = build_ranges(range_rows, domain_rows, trace_end)
    except sqlite3.DatabaseError as exc:
        raise BadInput(f"{path} is corrupt or truncated (SQLite: {exc})") from None
    finally:
        conn.close()
    meta["sidecar"] = read_sidecar(path, meta["warnings"])
    return Trace(kernels=kernels, ranges=ranges, meta=meta)


def sidecar_path(path: Path) -> Path:
    """``run.sqlite`` -> ``run.profkit.json``: the run's config and Python timings."""
    return path.with_name(path.stem + SIDECAR_SUFFIX)


def read_sidecar(path: Path, warnings: list[str]) -> dict[str, Any] | None:
    """The sidecar written by ``profkit nsys`` beside the export, if there is one."""
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        value = json.loads(side.read_text())
    except (OSError, ValueError) as exc:
        warnings.append(f"ignored {side.name}: {exc}")
        return None
    return value if isinstance(value, dict) else None


def _check_nsys(path: Path, tables: dict[str, list[str]]) -> None:
    if not tables:
        raise BadInput(f"{path} is an empty SQLite database, not {WHAT}")
    nsys_marks = {"StringIds", NVTX_TABLE, KERNEL_TABLE, *API_TABLES, "TARGET_INFO_GPU"}
    if "StringIds" not in tables or not nsys_marks & set(tables) - {"StringIds"}:
        raise BadInput(f"{path} is an SQLite database but not {WHAT} (no nsys tables in it)")


def _meta(conn: sqlite3.Connection, tables: dict[str, list[str]], path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = {"path": str(path), "format": FORMAT, "tool": "Nsight Systems"}
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables:
            found = conn.execute(
                f"SELECT value FROM {table} WHERE name = 'EXPORT_PRODUCT_VERSION'"
            ).fetchone()
            if found:
                meta["tool_version"] = str(found[0])
            break
    if "TARGET_INFO_GPU" in tables and "name" in tables["TARGET_INFO_GPU"]:
        gpus = [r[0] for r in conn.execute("SELECT name FROM TARGET_INFO_GPU ORDER BY id")]
        meta["gpus"] = [str(g) for g in gpus if g]
    elif "TARGET_INFO_CUDA_DEVICE" in tables and "name" in tables["TARGET_INFO_CUDA_DEVICE"]:
        meta["gpus"] = [str(r[0]) for r in conn.execute("SELECT name FROM TARGET_INFO_CUDA_DEVICE")]
    meta["gpu"] = ", ".join(dict.fromkeys(meta.get("gpus", []))) or None
    meta["thread_names"] = _thread_names(conn, tables)
    meta["warnings"] = []
    return meta


def _thread_names(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> dict[int, str]:
    if "ThreadNames" not in tables:
        return {}
    rows = conn.execute(
        "SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId"
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
