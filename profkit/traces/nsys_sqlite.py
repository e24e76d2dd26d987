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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profkit.errors import BadInput
from profkit.traces import _sqlite
from profkit.traces.depth import nesting_depth
from profkit.traces.schema import KERNEL_COLUMNS, RANGE_COLUMNS, Trace, conform

FORMAT = "nsys-sqlite"
WHAT = "an Nsight Systems SQLite export"
SIDECAR_SUFFIX = ".profkit.json"

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
GRAPH_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
API_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")
NVTX_TABLE = "NVTX_EVENTS"

PID_BITS = "((globalPid >> 24) & 16777215)"
TID_PID_BITS = "((globalTid >> 24) & 16777215)"
SHIFT32 = 4_294_967_296
# API calls that can put work on the GPU. Reading only these rows of the API tables halves
# the work on real exports; any activity left unmatched triggers a read of the rest.
LAUNCH_NAME_PATTERNS = ("%Launch%", "%Memcpy%", "%Memset%", "%Prefetch%")
RANGE_EVENT_TYPES = {
    "NvtxPushPopRange": 59,
    "NvtxStartEndRange": 60,
    "NvtxtPushPopRange": 70,
    "NvtxtStartEndRange": 71,
}
DOMAIN_CREATE_EVENT = ("NvtxDomainCreate", 75)
MEMCPY_LABELS = {
    0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array",
    4: "Array-to-Host", 5: "Array-to-Array", 6: "Array-to-Device", 7: "Device-to-Array",
    8: "Device-to-Device", 9: "Host-to-Host", 10: "Peer-to-Peer",
}  # fmt: skip
KIND_NAMES = np.array(["kernel", "memcpy", "memset", "graph"], dtype=object)


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
        use_pid = all("globalPid" in tables[t] for t in _activity_tables(tables))
        launch_ids = _launch_name_ids(conn)
        # The API calls and NVTX events are read on a second connection in a worker thread
        # while this one reads the activity tables: SQLite runs without the GIL, so the
        # two scans share the machine's cores.
        with ThreadPoolExecutor(max_workers=1) as pool:
            side = pool.submit(_read_side_tables, path, tables, use_pid, launch_ids)
            activity = _activity(conn, tables)
            calls, nvtx_rows, domain_rows = side.result()
        if not len(activity["start"]):
            raise NoKernelsTraced(_no_kernels_message(path, conn, tables, meta))
        _join_launches(conn, tables, activity, calls, use_pid, launch_ids)
        trace_end = int(activity["end"].max())
        kernels = _kernel_frame(activity)
        ranges = _ranges(nvtx_rows, domain_rows, trace_end)
    except sqlite3.DatabaseError as exc:
        raise BadInput(f"{path} is corrupt or truncated (SQLite: {exc})") from None
    finally:
        conn.close()
    meta["sidecar"] = read_sidecar(path, meta["warnings"])
    return Trace(kernels=kernels, ranges=ranges, meta=meta)


def _read_side_tables(
    path: Path, tables: dict[str, list[str]], use_pid: bool, launch_ids: list[int]
) -> tuple[dict[str, np.ndarray], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Launch API calls and NVTX events, on a connection of this thread's own."""
    conn = _sqlite.open_readonly(path)
    try:
        calls = _api_calls(conn, tables, use_pid, launch_ids, launch_only=True)
        nvtx_rows, domain_rows = _nvtx_rows(conn, tables)
    finally:
        conn.close()
    return calls, nvtx_rows, domain_rows


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


# --- GPU activity -------------------------------------------------------------------------


def _key_expr(columns: list[str]) -> str:
    pid = f"{PID_BITS} * {SHIFT32} + " if "globalPid" in columns else ""
    return f"{pid}correlationId"


def _common_exprs(columns: list[str]) -> dict[str, str]:
    return {
        "start": "start",
        "end": "end",
        "key": _key_expr(columns),
        "devstream": f"deviceId * {SHIFT32} + streamId",
    }


def _activity(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> dict[str, Any]:
    """Kernels, copies, memsets and whole-graph rows as aligned arrays plus name codes."""
    parts: list[dict[str, np.ndarray]] = []
    names: list[str] = []  # full names; codes index into it
    shorts: list[str] = []
    grids: dict[str, int] = {"": 0}  # "x,y,z" -> code; code 0 = no grid (copies)

    def add(part: dict[str, np.ndarray], kind: int, full: list[str], short: list[str]) -> None:
        part["name"] = part.pop("name_code") + len(names)
        part["kind"] = np.full(len(part["start"]), kind, dtype=np.int8)
        names.extend(full)
        shorts.extend(short)
        parts.append(part)

    if KERNEL_TABLE in tables:
        cols = tables[KERNEL_TABLE]
        name_col = next(c for c in ("demangledName", "name", "mangledName") if c in cols)
        short_col = "shortName" if "shortName" in cols else name_col
        exprs = {
            **_common_exprs(cols),
            "names": f"{name_col} * {SHIFT32} + {short_col}",
            "grid": f"gridX * {SHIFT32} + gridY * 65536 + gridZ",
            "block": f"blockX * {SHIFT32} + blockY * 65536 + blockZ",
        }
        part = _sqlite.read_int_columns(conn, KERNEL_TABLE, exprs)
        codes, unique = pd.factorize(part.pop("names"))
        strings = _sqlite.strings_by_id(conn, np.concatenate([unique >> 32, unique % SHIFT32]))
        full = [strings.get(int(u >> 32), f"kernel {u >> 32}") for u in unique]
        short = [strings.get(int(u % SHIFT32), "") or f for u, f in zip(unique, full, strict=True)]
        for field in ("grid", "block"):
            codes_, unique = pd.factorize(part[field])
            index = [
                grids.setdefault(f"{u >> 32},{(u >> 16) % 65536},{u % 65536}", len(grids))
                for u in unique
            ]
            part[field] = np.asarray(index, dtype=np.int64)[codes_]
        part["name_code"] = codes.astype(np.int64)
        add(part, 0, full, short)
    if MEMCPY_TABLE in tables:
        cols = tables[MEMCPY_TABLE]
        copy_kind = "copyKind" if "copyKind" in cols else "0"
        part = _sqlite.read_int_columns(
            conn, MEMCPY_TABLE, {**_common_exprs(cols), "copy_kind": copy_kind}
        )
        labels = _enum_labels(conn, tables, "ENUM_CUDA_MEMCPY_OPER") or MEMCPY_LABELS
        codes, unique = pd.factorize(part.pop("copy_kind"))
        full = [f"[CUDA memcpy {labels.get(int(k), f'kind {k}')}]" for k in unique]
        part["name_code"] = codes.astype(np.int64)
        add(part, 1, full, full)
    if MEMSET_TABLE in tables:
        part = _sqlite.read_int_columns(conn, MEMSET_TABLE, _common_exprs(tables[MEMSET_TABLE]))
        part["name_code"] = np.zeros(len(part["start"]), dtype=np.int64)
        add(part, 2, ["[CUDA memset]"], ["[CUDA memset]"])
    if GRAPH_TABLE in tables:
        cols = tables[GRAPH_TABLE]
        graph_id = "graphId" if "graphId" in cols else "0"
        part = _sqlite.read_int_columns(
            conn, GRAPH_TABLE, {**_common_exprs(cols), "graph": graph_id}
        )
        codes, unique = pd.factorize(part.pop("graph"))
        full = [f"[CUDA graph {g}]" for g in unique]
        part["name_code"] = codes.astype(np.int64)
        add(part, 3, full, full)

    fields = ("start", "end", "key", "devstream", "name", "kind", "grid", "block")
    merged: dict[str, Any] = {
        f: np.concatenate([p.get(f, np.zeros(len(p["start"]), np.int64)) for p in parts])
        if parts
        else np.empty(0, np.int64)
        for f in fields
    }
    merged.update(names=names, shorts=shorts, grids=list(grids))
    return merged


def _enum_labels(
    conn: sqlite3.Connection, tables: dict[str, list[str]], table: str
) -> dict[int, str]:
    if table not in tables or "label" not in tables[table]:
        return {}
    return {int(i): str(label) for i, label in conn.execute(f"SELECT id, label FROM {table}")}


def _join_launches(
    conn: sqlite3.Connection,
    tables: dict[str, list[str]],
    activity: dict[str, Any],
    calls: dict[str, np.ndarray],
    use_pid: bool,
    launch_ids: list[int],
) -> None:
    """Add ``launch_start``/``launch_thread`` (-1 when unknown) by (process, correlation id).

    ``calls`` are the launch-like API calls; activities they leave unmatched are looked up
    among the other API calls, read only then.
    """
    keys = activity["key"]
    found_start = np.full(len(keys), -1, dtype=np.int64)
    found_thread = np.full(len(keys), -1, dtype=np.int64)
    for first_pass in (True, False):
        pending = (found_start < 0) & (keys >= 0)
        # Without launch-like names the first pass already read every call.
        if not pending.any() or (not first_pass and not launch_ids):
            break
        if not first_pass:
            calls = _api_calls(conn, tables, use_pid, launch_ids, launch_only=False)
        if not len(calls["key"]):
            continue
        order = np.argsort(calls["key"], kind="stable")  # runtime rows win over driver rows
        sorted_keys = calls["key"][order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = sorted_keys[1:] != sorted_keys[:-1]
        order, sorted_keys = order[first], sorted_keys[first]
        index = np.minimum(np.searchsorted(sorted_keys, keys[pending]), len(sorted_keys) - 1)
        hit = sorted_keys[index] == keys[pending]
        rows = np.flatnonzero(pending)[hit]
        found_start[rows] = calls["start"][order[index[hit]]]
        found_thread[rows] = calls["thread"][order[index[hit]]]
    activity["launch_start"] = found_start
    activity["launch_thread"] = found_thread


def _activity_tables(tables: dict[str, list[str]]) -> list[str]:
    return [t for t in (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, GRAPH_TABLE) if t in tables]


def _launch_name_ids(conn: sqlite3.Connection) -> list[int]:
    where = " OR ".join("value LIKE ?" for _ in LAUNCH_NAME_PATTERNS)
    return [
        r[0] for r in conn.execute(f"SELECT id FROM StringIds WHERE {where}", LAUNCH_NAME_PATTERNS)
    ]


def _api_calls(
    conn: sqlite3.Connection,
    tables: dict[str, list[str]],
    use_pid: bool,
    launch_ids: list[int],
    launch_only: bool,
) -> dict[str, np.ndarray]:
    ids = ",".join(str(i) for i in launch_ids)
    where = (f"nameId IN ({ids})" if launch_only else f"nameId NOT IN ({ids})") if ids else ""
    parts = []
    for table in API_TABLES:
        cols = tables.get(table)
        if not cols or "globalTid" not in cols:
            continue
        pid = f"{TID_PID_BITS} * {SHIFT32} + " if use_pid else ""
        exprs = {"key": f"{pid}correlationId", "start": "start", "thread": "globalTid"}
        parts.append(_sqlite.read_int_columns(conn, table, exprs, where=where))
    if not parts:
        return {"key": np.empty(0, np.int64)}
    return {f: np.concatenate([p[f] for p in parts]) for f in ("key", "start", "thread")}


def _kernel_frame(a: dict[str, Any]) -> pd.DataFrame:
    """The kernels table, in table order (kernels, copies, memsets, graphs)."""
    n = len(a["start"])
    # One int64 block filled column by column: a DataFrame built from separate arrays
    # would copy them all into a block anyway (hundreds of MB at millions of rows).
    ints = np.empty((5, n), dtype=np.int64)
    ints[0], ints[1] = a.pop("start"), a.pop("end")
    devstream = a.pop("devstream")
    np.right_shift(devstream, 32, out=ints[2])
    np.remainder(devstream, SHIFT32, out=ints[3])
    del devstream
    np.remainder(a.pop("key"), SHIFT32, out=ints[4])
    frame = pd.DataFrame(
        ints.T, columns=["start", "end", "device", "stream", "correlation_id"], copy=False
    )
    name_codes = a.pop("name")
    frame["name"] = _strings(a["names"], name_codes)
    frame["short_name"] = _strings(a["shorts"], name_codes)
    frame["kind"] = _strings(list(KIND_NAMES), a.pop("kind"))
    frame["grid"] = _strings(a["grids"], a.pop("grid"))
    frame["block"] = _strings(a["grids"], a.pop("block"))
    launch_start, launch_thread = a.pop("launch_start"), a.pop("launch_thread")
    unknown = launch_start < 0
    frame["launch_start"] = pd.arrays.IntegerArray(launch_start, unknown)
    frame["launch_thread"] = pd.arrays.IntegerArray(launch_thread, unknown.copy())
    return conform(frame, KERNEL_COLUMNS)


def _strings(values: list[str], codes: np.ndarray) -> pd.arrays.StringArray:
    """``values[codes]`` as a string array whose rows share the few distinct str objects."""
    categories = pd.Index(np.array(values, dtype=object), dtype="string")
    if categories.has_duplicates:  # from_codes needs distinct categories
        return pd.array(np.array(values, dtype=object)[codes], dtype="string")
    return pd.Categorical.from_codes(codes, categories=categories).astype("string")


# --- NVTX ranges ----------------------------------------------------------------------------


def _nvtx_rows(
    conn: sqlite3.Connection, tables: dict[str, list[str]]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Raw NVTX range rows ``(start, end, globalTid, domainId, text)`` and domain creations."""
    cols = tables.get(NVTX_TABLE)
    if not cols:
        return [], []
    types = _event_types(conn, tables)
    range_types = [types.get(name, default) for name, default in RANGE_EVENT_TYPES.items()]
    domain_create = types.get(DOMAIN_CREATE_EVENT[0], DOMAIN_CREATE_EVENT[1])
    text = "coalesce(e.text, s.value)" if "textId" in cols else "e.text"
    join = "LEFT JOIN StringIds s ON s.id = e.textId" if "textId" in cols else ""
    domain = "ifnull(e.domainId, 0)" if "domainId" in cols else "0"
    query = (
        f"SELECT e.start, e.end, e.globalTid, {domain}, {text} "
        f"FROM {NVTX_TABLE} e {join} WHERE e.eventType IN ({{types}})"
    )
    rows = conn.execute(query.format(types=",".join(map(str, range_types)))).fetchall()
    created = conn.execute(query.format(types=domain_create)).fetchall()
    return rows, created


def _ranges(
    rows: list[tuple[Any, ...]], created: list[tuple[Any, ...]], trace_end: int
) -> pd.DataFrame:
    if not rows:
        return conform(pd.DataFrame({c: [] for c in RANGE_COLUMNS}), RANGE_COLUMNS)
    frame = pd.DataFrame(rows, columns=["start", "end", "thread", "domain_id", "name"])
    domain_names = {
        (_pid(int(tid or 0)), int(dom)): str(name or "") for _, _, tid, dom, name in created
    }
    frame["thread"] = frame["thread"].fillna(-1).astype(np.int64)
    frame["start"] = frame["start"].astype(np.int64)
    # A range still open when the capture stopped has no end: it lasts to the trace's end.
    frame["end"] = frame["end"].fillna(max(trace_end, int(frame["start"].max()))).astype(np.int64)
    frame["end"] = np.maximum(frame["end"].to_numpy(), frame["start"].to_numpy())
    frame["name"] = frame["name"].fillna("(unnamed)")
    domain_ids = frame["domain_id"].fillna(0).astype(np.int64).to_numpy()
    pids = (frame["thread"].to_numpy() >> 24) & 0xFFFFFF
    frame["domain"] = [
        "" if d == 0 else domain_names.get((p, d), f"domain {d}")
        for p, d in zip(pids.tolist(), domain_ids.tolist(), strict=True)
    ]
    lane = pd.factorize(pd.MultiIndex.from_arrays([frame["thread"], domain_ids]))[0]
    frame["depth"] = nesting_depth(
        lane.astype(np.int64), frame["start"].to_numpy(), frame["end"].to_numpy()
    )
    frame = frame.sort_values(["start", "depth"], kind="stable")
    return conform(frame, RANGE_COLUMNS)


def _pid(global_tid: int) -> int:
    return (global_tid >> 24) & 0xFFFFFF


def _event_types(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> dict[str, int]:
    if "ENUM_NSYS_EVENT_TYPE" not in tables:
        return {}
    return {
        str(name): int(i) for i, name in conn.execute("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE")
    }


# --- facts about the export -----------------------------------------------------------------


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
