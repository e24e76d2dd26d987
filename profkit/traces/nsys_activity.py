"""GPU activity of an Nsight Systems export: kernels, copies, memsets, graphs, launches.

Part of :mod:`profkit.traces.nsys_sqlite`. Each activity table is read in chunks on worker
threads (:class:`~profkit.traces._sqlite.ParallelReader`), with columns packed into small
integers by :class:`Codec`; activities are then joined to the CUDA API call that launched
them by (process, correlation id): ``globalTid`` packs the process id in bits 24-47 and
the thread id in bits 0-23, ``globalPid`` is the same with the thread bits zero.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profkit.traces import _sqlite
from profkit.traces.schema import KERNEL_COLUMNS, PROCESS_MASK, PROCESS_SHIFT, STRING, conform

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
KIND_NAMES = np.array(["kernel", "memcpy", "memset", "graph"], dtype=object)
_TIMED = ("start", "end", "correlationId", "streamId", "deviceId")
# The columns every export of 2022.4 to 2025.x has, which the reader cannot do without.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    KERNEL_TABLE: (*_TIMED, "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"),
    MEMCPY_TABLE: _TIMED,
    MEMSET_TABLE: _TIMED,
    GRAPH_TABLE: _TIMED,
    **{table: ("start", "correlationId", "nameId") for table in API_TABLES},
}


@dataclass(frozen=True)
class Codec:
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


def activity_jobs(
    reader: _sqlite.ParallelReader,
    conn: sqlite3.Connection,
    tables: dict[str, list[str]],
    codec: Codec,
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


def collect_activity(
    conn: sqlite3.Connection,
    tables: dict[str, list[str]],
    jobs: dict[str, _sqlite.Pending],
    codec: Codec,
) -> dict[str, Any]:
    """Kernels, copies, memsets and whole-graph rows: aligned columns plus name codes.

    ``start``, ``duration``, ``key`` and ``devstream`` stay lists of chunks, concatenated
    once where they are used (at millions of rows every copy costs a tenth of a second).
    """
    found = _Activity()
    if KERNEL_TABLE in jobs:
        chunks = jobs[KERNEL_TABLE].chunks()
        codes, full, short = _kernel_names(conn, codec, chunks)
        found.add(chunks, 0, codes, full, short, _kernel_shapes(chunks, found.grids))
    if MEMCPY_TABLE in jobs:
        chunks = jobs[MEMCPY_TABLE].chunks()
        labels = _enum_labels(conn, tables, "ENUM_CUDA_MEMCPY_OPER") or MEMCPY_LABELS
        codes, unique = pd.factorize(_column(chunks, "copy_kind"))
        full = [f"[CUDA memcpy {labels.get(int(k), f'kind {k}')}]" for k in unique]
        found.add(chunks, 1, codes, full, full)
    if MEMSET_TABLE in jobs:
        chunks = jobs[MEMSET_TABLE].chunks()
        rows = sum(len(c["start"]) for c in chunks)
        found.add(chunks, 2, np.zeros(rows, np.int64), ["[CUDA memset]"], ["[CUDA memset]"])
    if GRAPH_TABLE in jobs:
        chunks = jobs[GRAPH_TABLE].chunks()
        codes, unique = pd.factorize(_column(chunks, "graph"))
        full = [f"[CUDA graph {g}]" for g in unique]
        found.add(chunks, 3, codes, full, full)
    return found.columns()


@dataclass
class _Activity:
    """The activity columns gathered table by table, names and shapes coded as they come."""

    chunked: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {f: [] for f in PASS_THROUGH}
    )
    derived: dict[str, list[np.ndarray]] = field(
        default_factory=lambda: {f: [] for f in ("name", "kind", "grid", "block")}
    )
    names: list[str] = field(default_factory=list)  # full names; codes index into it
    shorts: list[str] = field(default_factory=list)
    grids: dict[str, int] = field(default_factory=lambda: {"": 0})  # "x,y,z" -> code; 0: none

    def add(
        self,
        chunks: list[dict[str, np.ndarray]],
        kind: int,
        name_codes: np.ndarray,
        full: list[str],
        short: list[str],
        shapes: tuple[np.ndarray, ...] = (),
    ) -> None:
        """One table's rows: its chunks, the kind code, names coded into ``full``/``short``."""
        rows = len(name_codes)
        for name in PASS_THROUGH:
            self.chunked[name].extend(chunk[name] for chunk in chunks)
        self.derived["name"].append((name_codes + len(self.names)).astype(np.int32))
        self.derived["kind"].append(np.full(rows, kind, dtype=np.int8))
        no_shape = (np.zeros(rows, np.int32),) * 2  # copies, memsets and graphs have none
        for name, codes in zip(("grid", "block"), shapes or no_shape, strict=True):
            self.derived[name].append(codes)
        self.names.extend(full)
        self.shorts.extend(short)

    def columns(self) -> dict[str, Any]:
        """The aligned columns; ``start``, ``duration`` and ``devstream`` still in chunks."""
        activity: dict[str, Any] = {
            name: np.concatenate(parts) if parts else np.empty(0, np.int32)
            for name, parts in self.derived.items()
        }
        keys = self.chunked.pop("key")
        activity["key"] = np.concatenate(keys) if keys else np.empty(0, np.int64)
        activity.update(self.chunked)
        activity.update(
            rows=len(activity["name"]), names=self.names, shorts=self.shorts, grids=list(self.grids)
        )
        return activity


def _column(chunks: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
    return np.concatenate([c[name] for c in chunks]) if chunks else np.empty(0, np.int64)


def _kernel_names(
    conn: sqlite3.Connection, codec: Codec, chunks: list[dict[str, np.ndarray]]
) -> tuple[np.ndarray, list[str], list[str]]:
    """Each kernel's name code, and the full and short names the codes index."""
    codes, unique = pd.factorize(_column(chunks, "names"))
    full_ids, short_ids = codec.split_names(unique)
    strings = _sqlite.strings_by_id(conn, np.concatenate([full_ids, short_ids]))
    full = [strings.get(int(i), f"kernel {i}") for i in full_ids]
    short = [strings.get(int(i), "") or f for i, f in zip(short_ids, full, strict=True)]
    return codes, full, short


def _kernel_shapes(
    chunks: list[dict[str, np.ndarray]], grids: dict[str, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Grid and block codes of each kernel; new ``"x,y,z"`` shapes are added to ``grids``."""
    shapes = []
    for name, (x_bits, y_bits) in (("grid", (31, 16)), ("block", (11, 10))):
        codes, values = pd.factorize(_column(chunks, name))
        index = [grids.setdefault(_shape(int(v), x_bits, y_bits), len(grids)) for v in values]
        shapes.append(np.asarray(index, dtype=np.int32)[codes])
    return shapes[0], shapes[1]


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
    rows = conn.execute(f"SELECT id, CAST(label AS TEXT) FROM {table}")
    return {int(i): str(label) for i, label in rows if i is not None}


def join_launches(
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


def activity_tables(tables: dict[str, list[str]]) -> list[str]:
    """The GPU activity tables this export has."""
    return [t for t in (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, GRAPH_TABLE) if t in tables]


def launch_name_ids(conn: sqlite3.Connection) -> list[int]:
    """``StringIds`` ids of the API functions that can put work on the GPU."""
    where = " OR ".join("value LIKE ?" for _ in LAUNCH_NAME_PATTERNS)
    return [
        r[0] for r in conn.execute(f"SELECT id FROM StringIds WHERE {where}", LAUNCH_NAME_PATTERNS)
    ]


def api_jobs(
    reader: _sqlite.ParallelReader,
    conn: sqlite3.Connection,
    tables: dict[str, list[str]],
    codec: Codec,
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


def collect_calls(jobs: list[_sqlite.Pending], codec: Codec) -> dict[str, np.ndarray]:
    """The queued API reads as ``key``/``start``/``thread`` arrays (threads unpacked)."""
    chunks = [chunk for job in jobs for chunk in job.chunks()]
    if not chunks:
        return {"key": np.empty(0, np.int64)}
    calls = {f: np.concatenate([c[f] for c in chunks]) for f in ("key", "start", "thread")}
    calls["thread"] += codec.tid0
    return calls


def kernel_frame(a: dict[str, Any], meta: dict[str, Any]) -> pd.DataFrame:
    """The kernels table, in table order (kernels, copies, memsets, graphs).

    An activity that ends before it starts (a damaged export) is kept, so that counts
    agree with the export's tables, with its end set to its start (0 ms); how many is
    ``meta["clamped_activities"]``, and a warning says so.
    """
    n = a["rows"]
    # One int64 block filled column by column, straight from the chunks: a DataFrame built
    # from separate arrays would copy them all into a block (hundreds of MB here).
    ints = np.empty((5, n), dtype=np.int64)
    _fill(ints[0], a.pop("start"))
    _fill(ints[1], a.pop("duration"))
    _clamp_negative(ints[1], meta, "activities", "GPU activities")
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


def _clamp_negative(durations: np.ndarray, meta: dict[str, Any], key: str, what: str) -> None:
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


def _fill(out: np.ndarray, chunks: list[np.ndarray]) -> None:
    if chunks:
        np.concatenate(chunks, out=out)


def _strings(values: list[str], codes: np.ndarray) -> pd.arrays.StringArray:
    """``values[codes]`` as a string array whose rows share the few distinct str objects."""
    categories = pd.Index(np.array(values, dtype=object), dtype=STRING)
    if categories.has_duplicates:  # from_codes needs distinct categories
        return pd.array(np.array(values, dtype=object)[codes], dtype=STRING)
    return pd.Categorical.from_codes(codes, categories=categories).astype(STRING)
