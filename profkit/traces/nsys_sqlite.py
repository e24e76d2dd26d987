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
from collections.abc import Callable
from dataclasses import dataclass
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
PASS_THROUGH = ("start", "duration", "key", "devstream")
DEVICES = 1024  # CUDA device ordinals are far below this
# Grid x < 2^31, y and z < 2^16; block x, y <= 1024, z <= 64: packed as x + base·(y-1 + ...)
GRID_EXPR = "gridX + 2147483648 * ((gridY - 1) + 65536 * (gridZ - 1))"
BLOCK_EXPR = "blockX + 2048 * ((blockY - 1) + 1024 * (blockZ - 1))"
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
        codec = _Codec.of(conn, tables)
        launch_ids = _launch_name_ids(conn)
        # Every table is queued at once and read in chunks by worker threads, each with its
        # own connection: SQLite runs without the GIL, so the scans share the cores.
        with _sqlite.ParallelReader(path) as reader:
            activity_jobs = _activity_jobs(reader, conn, tables, codec)
            call_jobs = _api_jobs(reader, conn, tables, codec, launch_ids, launch_only=True)
            nvtx_job = reader.call(lambda worker: _nvtx_rows(worker, tables))
            activity = _activity(conn, tables, activity_jobs, codec)
            calls = _collect_calls(call_jobs, codec)
            nvtx_rows, domain_rows = nvtx_job.result()
            if not activity["rows"]:
                raise NoKernelsTraced(_no_kernels_message(path, conn, tables, meta))

            def other_calls() -> dict[str, np.ndarray]:
                jobs = _api_jobs(reader, conn, tables, codec, launch_ids, launch_only=False)
                return _collect_calls(jobs, codec)

            # Without launch-like names, the first read already took every call.
            _join_launches(activity, calls, other_calls if launch_ids else None)
        kernels = _kernel_frame(activity)
        trace_end = int(kernels["end"].max())
        ranges = _ranges(nvtx_rows, domain_rows, trace_end)
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


# --- GPU activity -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Codec:
    """Packs columns into small integers: text transfer costs per digit (see ``_sqlite``).

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
    def of(cls, conn: sqlite3.Connection, tables: dict[str, list[str]]) -> _Codec:
        use_pid = all("globalPid" in tables[t] for t in _activity_tables(tables))
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
        return f"((({pid_bits}) - {self.pid0}) & 16777215) * {SHIFT32} + correlationId"

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


def _activity_jobs(
    reader: _sqlite.ParallelReader,
    conn: sqlite3.Connection,
    tables: dict[str, list[str]],
    codec: _Codec,
) -> dict[str, _sqlite.Pending]:
    """Queue the reads of the kernel, memcpy, memset and graph tables."""
    jobs = {}
    if KERNEL_TABLE in tables:
        cols = tables[KERNEL_TABLE]
        name_col = next(c for c in ("demangledName", "name", "mangledName") if c in cols)
        short_col = "shortName" if "shortName" in cols else name_col
        exprs = {
            **codec.common(),
            "names": codec.names(name_col, short_col),
            "grid": GRID_EXPR,
            "block": BLOCK_EXPR,
        }
        jobs[KERNEL_TABLE] = reader.columns(conn, KERNEL_TABLE, exprs)
    if MEMCPY_TABLE in tables:
        cols = tables[MEMCPY_TABLE]
        copy_kind = "copyKind" if "copyKind" in cols else "0"
        exprs = {**codec.common(), "copy_kind": copy_kind}
        jobs[MEMCPY_TABLE] = reader.columns(conn, MEMCPY_TABLE, exprs)
    if MEMSET_TABLE in tables:
        exprs = codec.common()
        jobs[MEMSET_TABLE] = reader.columns(conn, MEMSET_TABLE, exprs)
    if GRAPH_TABLE in tables:
        cols = tables[GRAPH_TABLE]
        exprs = {**codec.common(), "graph": "graphId" if "graphId" in cols else "0"}
        jobs[GRAPH_TABLE] = reader.columns(conn, GRAPH_TABLE, exprs)
    return jobs


def _activity(
    conn: sqlite3.Connection,
    tables: dict[str, list[str]],
    jobs: dict[str, _sqlite.Pending],
    codec: _Codec,
) -> dict[str, Any]:
    """Kernels, copies, memsets and whole-graph rows: aligned columns plus name codes.

    ``start``, ``duration``, ``key`` and ``devstream`` stay lists of chunks, concatenated
    once where they are used (at millions of rows every copy costs a tenth of a second).
    """
    chunked: dict[str, list[np.ndarray]] = {f: [] for f in PASS_THROUGH}
    derived: dict[str, list[np.ndarray]] = {f: [] for f in ("name", "kind", "grid", "block")}
    names: list[str] = []  # full names; codes index into it
    shorts: list[str] = []
    grids: dict[str, int] = {"": 0}  # "x,y,z" -> code; code 0 = no grid (copies)

    def add(chunks: list[dict[str, np.ndarray]], kind: int, name_codes: np.ndarray,
            full: list[str], short: list[str], shapes: tuple[np.ndarray, ...] = ()) -> None:  # fmt: skip
        rows = len(name_codes)
        for field in PASS_THROUGH:
            chunked[field].extend(chunk[field] for chunk in chunks)
        derived["name"].append((name_codes + len(names)).astype(np.int32))
        derived["kind"].append(np.full(rows, kind, dtype=np.int8))
        for field, codes in zip(
            ("grid", "block"), shapes or (np.zeros(rows, np.int32),) * 2, strict=True
        ):
            derived[field].append(codes)
        names.extend(full)
        shorts.extend(short)

    def column(chunks: list[dict[str, np.ndarray]], field: str) -> np.ndarray:
        return np.concatenate([c[field] for c in chunks]) if chunks else np.empty(0, np.int64)

    if KERNEL_TABLE in jobs:
        chunks = jobs[KERNEL_TABLE].chunks()
        codes, unique = pd.factorize(column(chunks, "names"))
        full_ids, short_ids = codec.split_names(unique)
        strings = _sqlite.strings_by_id(conn, np.concatenate([full_ids, short_ids]))
        full = [strings.get(int(i), f"kernel {i}") for i in full_ids]
        short = [strings.get(int(i), "") or f for i, f in zip(short_ids, full, strict=True)]
        shapes = []
        for field, (x_bits, y_bits) in (("grid", (31, 16)), ("block", (11, 10))):
            field_codes, values = pd.factorize(column(chunks, field))
            index = [grids.setdefault(_shape(int(v), x_bits, y_bits), len(grids)) for v in values]
            shapes.append(np.asarray(index, dtype=np.int32)[field_codes])
        add(chunks, 0, codes, full, short, tuple(shapes))
    if MEMCPY_TABLE in jobs:
        chunks = jobs[MEMCPY_TABLE].chunks()
        labels = _enum_labels(conn, tables, "ENUM_CUDA_MEMCPY_OPER") or MEMCPY_LABELS
        codes, unique = pd.factorize(column(chunks, "copy_kind"))
        full = [f"[CUDA memcpy {labels.get(int(k), f'kind {k}')}]" for k in unique]
        add(chunks, 1, codes, full, full)
    if MEMSET_TABLE in jobs:
        chunks = jobs[MEMSET_TABLE].chunks()
        rows = sum(len(c["start"]) for c in chunks)
        add(chunks, 2, np.zeros(rows, np.int64), ["[CUDA memset]"], ["[CUDA memset]"])
    if GRAPH_TABLE in jobs:
        chunks = jobs[GRAPH_TABLE].chunks()
        codes, unique = pd.factorize(column(chunks, "graph"))
        full = [f"[CUDA graph {g}]" for g in unique]
        add(chunks, 3, codes, full, full)

    activity: dict[str, Any] = {f: np.concatenate(v) if v else np.empty(0, np.int32)
                                for f, v in derived.items()}  # fmt: skip
    activity["key"] = (
        np.concatenate(chunked.pop("key")) if chunked["key"] else np.empty(0, np.int64)
    )
    activity.update(chunked)
    activity.update(rows=len(activity["name"]), names=names, shorts=shorts, grids=list(grids))
    return activity


def _shape(packed: int, x_bits: int, y_bits: int) -> str:
    """``"x,y,z"`` of a grid or block packed by ``GRID_EXPR``/``BLOCK_EXPR``."""
    rest = packed >> x_bits
    return (
        f"{packed & ((1 << x_bits) - 1)},{(rest & ((1 << y_bits) - 1)) + 1},{(rest >> y_bits) + 1}"
    )


def _enum_labels(
    conn: sqlite3.Connection, tables: dict[str, list[str]], table: str
) -> dict[int, str]:
    if table not in tables or "label" not in tables[table]:
        return {}
    return {int(i): str(label) for i, label in conn.execute(f"SELECT id, label FROM {table}")}


def _join_launches(
    activity: dict[str, Any],
    calls: dict[str, np.ndarray],
    other_calls: Callable[[], dict[str, np.ndarray]] | None,
) -> None:
    """Add ``launch_start``/``launch_thread`` (-1 when unknown) by (process, correlation id).

    ``calls`` are the launch-like API calls; activities they leave unmatched are looked up
    in ``other_calls()``, read only then.
    """
    keys = activity["key"]
    found_start = np.full(len(keys), -1, dtype=np.int64)
    found_thread = np.full(len(keys), -1, dtype=np.int64)
    for batch in (lambda: calls, other_calls):
        pending = (found_start < 0) & (keys >= 0)
        if batch is None or not pending.any():
            break
        found = batch()
        if not len(found["key"]):
            continue
        order = np.argsort(found["key"], kind="stable")  # runtime rows win over driver rows
        sorted_keys = found["key"][order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = sorted_keys[1:] != sorted_keys[:-1]
        order, sorted_keys = order[first], sorted_keys[first]
        index = np.minimum(np.searchsorted(sorted_keys, keys[pending]), len(sorted_keys) - 1)
        hit = sorted_keys[index] == keys[pending]
        rows = np.flatnonzero(pending)[hit]
        found_start[rows] = found["start"][order[index[hit]]]
        found_thread[rows] = found["thread"][order[index[hit]]]
    activity["launch_start"] = found_start
    activity["launch_thread"] = found_thread


def _activity_tables(tables: dict[str, list[str]]) -> list[str]:
    return [t for t in (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, GRAPH_TABLE) if t in tables]


def _launch_name_ids(conn: sqlite3.Connection) -> list[int]:
    where = " OR ".join("value LIKE ?" for _ in LAUNCH_NAME_PATTERNS)
    return [
        r[0] for r in conn.execute(f"SELECT id FROM StringIds WHERE {where}", LAUNCH_NAME_PATTERNS)
    ]


def _api_jobs(
    reader: _sqlite.ParallelReader,
    conn: sqlite3.Connection,
    tables: dict[str, list[str]],
    codec: _Codec,
    launch_ids: list[int],
    launch_only: bool,
) -> list[_sqlite.Pending]:
    """Queue the reads of the API calls: launch-like ones, or all the others."""
    ids = ",".join(str(i) for i in launch_ids)
    where = (f"nameId IN ({ids})" if launch_only else f"nameId NOT IN ({ids})") if ids else ""
    jobs = []
    for table in API_TABLES:
        cols = tables.get(table)
        if not cols or "globalTid" not in cols:
            continue
        exprs = {
            "key": codec.key(TID_PID_BITS),
            "start": "start",
            "thread": f"globalTid - {codec.tid0}",
        }
        jobs.append(reader.columns(conn, table, exprs, where=where))
    return jobs


def _collect_calls(jobs: list[_sqlite.Pending], codec: _Codec) -> dict[str, np.ndarray]:
    chunks = [chunk for job in jobs for chunk in job.chunks()]
    if not chunks:
        return {"key": np.empty(0, np.int64)}
    calls = {f: np.concatenate([c[f] for c in chunks]) for f in ("key", "start", "thread")}
    calls["thread"] += codec.tid0
    return calls


def _kernel_frame(a: dict[str, Any]) -> pd.DataFrame:
    """The kernels table, in table order (kernels, copies, memsets, graphs)."""
    n = a["rows"]
    # One int64 block filled column by column, straight from the chunks: a DataFrame built
    # from separate arrays would copy them all into a block (hundreds of MB here).
    ints = np.empty((5, n), dtype=np.int64)
    _fill(ints[0], a.pop("start"))
    _fill(ints[1], a.pop("duration"))
    ints[1] += ints[0]  # end = start + duration
    _fill(ints[3], a.pop("devstream"))
    np.remainder(ints[3], DEVICES, out=ints[2])
    ints[3] //= DEVICES
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


def _fill(out: np.ndarray, chunks: list[np.ndarray]) -> None:
    if chunks:
        np.concatenate(chunks, out=out)


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
    thread_codes = pd.factorize(frame["thread"].to_numpy())[0].astype(np.int64)
    lane = thread_codes * (int(domain_ids.max()) + 1) + domain_ids  # (thread, domain)
    frame["depth"] = nesting_depth(lane, frame["start"].to_numpy(), frame["end"].to_numpy())
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
