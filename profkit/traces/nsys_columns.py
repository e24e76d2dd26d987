"""Nsight Systems exports read in bounded memory, as :class:`ActivityColumns`.

The tables of :mod:`profkit.traces.nsys_export`, read chunk by chunk with a few chunks
in flight (:meth:`~profkit.traces.sqlite_scan.ParallelReader.stream`), so memory holds the
compact columns (22 bytes per activity) and the launch calls, never a whole table's text:

1. the launch-like API calls go into :class:`_Calls`: key, start and thread code (18 bytes
   a call), in the correlation-id order real exports already store them in;
2. each chunk of kernels, copies, memsets and graph rows is joined to its call by looking
   its key up (a binary search), its names become codes, and it is copied into
   preallocated columns;
3. activities left without a call look in the other API calls, read only then.

The tables' chunks go through one window of reads ahead (``ParallelReader.stream_scans``),
so the threads read the first activities while the last calls are taken, and the NVTX
ranges are read and built on a reader thread meanwhile: no thread waits at a table's end.
What a chunk needs of itself alone (its calls split by process, its distinct threads and
names, durations, devices) is done on the thread that read it (``_Calls.prepare``,
``_Builder.prepare``); the main thread numbers threads and names, looks launches up and
fills the columns, in chunk order, so the codes are those of one thread.

The calls are freed before the analysis starts, so the read's peak is the columns plus the
launch calls (about 0.6 GB for 33 M), whatever the number of API rows.

Launch shapes are not scanned: grid and block are six columns a kernel row, a third of the
kernel table's read, and a report shows one shape per table row. The columns keep where
each kernel sits (:class:`~profkit.traces.columns.RowMap`: one run of row ids per table in
a real export) and :func:`shape_reader` reads the few shapes asked for by row id. A
compressed export is unpacked to a temporary file for the read only, so its shapes are
scanned with the rest.
"""

from __future__ import annotations

import dataclasses
import functools
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profkit.errors import BadInput
from profkit.sidecar import read_sidecar
from profkit.traces import sqlite_scan
from profkit.traces.columns import (
    ARRAYS,
    NO_SHAPE,
    SHAPE,
    TIMED,
    ActivityColumns,
    Progress,
    RowMap,
    ShapeReader,
    check_threads,
)
from profkit.traces.nsys_export import (
    API_TABLES,
    BLOCK_EXPR,
    CONTEXTS_TABLE,
    GRAPH_TABLE,
    GRID_EXPR,
    KERNEL_TABLE,
    MEMCPY_LABELS,
    MEMCPY_TABLE,
    MEMSET_TABLE,
    SHIFT32,
    TID_PID_BITS,
    Codec,
    NoKernelsTraced,
    activity_tables,
    check_columns,
    check_nsys,
    clamp_negative,
    enum_labels,
    export_meta,
    launch_name_ids,
    no_kernels_message,
    opened_export,
    unpacked_shape,
)
from profkit.traces.nsys_ranges import build_ranges, nvtx_rows
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT

# Unread, a start of the wrong type would go unseen (SQLite reads text as 0 in arithmetic):
# the scan checks start and end per chunk (sqlite_scan's ``checked``), and a bad cell is named.
TIMES = ("start", "end")
# Rows per chunk: a chunk's text (SQLite's, Python's) and parsed arrays are a few MB, which
# the allocator keeps and reuses; at 500,000 rows they were fresh pages each time, and the
# page faults cost a sixth of the read's CPU (docs/PERFORMANCE.md).
CHUNK_ROWS = 1 << 17
NULL_THREAD = -(1 << 62)
"""What a NULL ``globalTid`` reads as where the calls' keys are made from it (not -1, which
a thread just below the first call's would read as)."""


def process_bits(global_tid: np.ndarray, pid0: int) -> np.ndarray:
    """The process part of ``Codec.key``'s (process, correlation id) keys, from a
    ``globalTid`` (process id in bits 24-47): what SQL computes for the activities, in numpy;
    a key is these bits plus the correlation id."""
    pid = (global_tid >> PROCESS_SHIFT) & PROCESS_MASK
    return ((pid - pid0) & PROCESS_MASK) * SHIFT32


@dataclasses.dataclass(frozen=True)
class _ProcessDevices:
    """The one device of each CUDA process, by process code (a key's high bits).

    From the contexts table, which lists every CUDA context with its process and device
    (the one-process read trusts it the same way): where each process has one device, an
    activity's device follows from its key, and the scan spares a column of every row.
    """

    codes: np.ndarray  # sorted process codes
    devices: np.ndarray

    def of(self, keys: np.ndarray) -> np.ndarray:
        """The device of each key's process; -1 for no key or a process not listed."""
        code = keys >> 32
        at = np.minimum(np.searchsorted(self.codes, code), len(self.codes) - 1)
        found = (self.codes[at] == code) & (keys >= 0)
        return np.where(found, self.devices[at], -1)


@dataclasses.dataclass(frozen=True)
class _CallChunk:
    """A chunk of API calls made ready for :meth:`_Calls.add`: its distinct threads
    (``globalTid``, in the order of their first call) and, per process code, the calls'
    keys, starts and indices into those threads."""

    tids: np.ndarray
    parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]


class _Buffer:
    """One process's calls as they arrive: key, start, thread code, in reserved columns."""

    def __init__(self, capacity: int) -> None:
        self.key = np.empty(capacity, np.int64)
        self.start = np.empty(capacity, np.int64)
        self.thread = np.empty(capacity, np.int16)
        self.rows = 0

    def add(self, key: np.ndarray, start: np.ndarray, thread: np.ndarray) -> None:
        rows = slice(self.rows, self.rows + len(key))
        self.key[rows], self.start[rows], self.thread[rows] = key, start, thread
        self.rows += len(key)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.key[: self.rows], self.start[: self.rows], self.thread[: self.rows]


class _Calls:
    """Start and thread code of API calls, sorted by key, for the activities to look up.

    Rows arrive in rowid order, which real exports keep in correlation-id order (checked
    on all fixtures): then the arrays are already sorted and need no argsort. Otherwise
    (a driver table after the runtime one) they are sorted once. Several processes' calls
    arrive interleaved, each process's in order: they are kept apart, one sorted run per
    process, and an activity is looked up in its own process's run (:meth:`lookup`).
    """

    def __init__(
        self,
        tid0: int,
        base: int,
        capacity: int,
        thread_code: dict[int, int] | None = None,
        pid0: int | None = None,
    ) -> None:
        self.tid0, self.base = tid0, base  # starts arrive as offsets from ``base``
        # Several processes: keys arrive as correlation ids, and the process bits are put
        # in here from each call's thread (its globalTid holds its process id), which
        # spares SQLite the arithmetic and the longer text on every API row.
        self.pid0 = pid0
        # np.empty only reserves: pages are resident once written, so a bound on the rows
        # (every API call) costs only the launch calls actually kept, in one buffer or, for
        # several processes, in one per process (kept apart as they arrive, not joined at
        # seal: that copy sat between the calls' read and the activities').
        self.capacity = capacity
        self.parts: dict[int, _Buffer] = {}  # process code (one process: 0) -> its calls
        # One process, once sealed: its calls sorted by key.
        self.key = np.empty(0, np.int64)
        self.start = np.empty(0, np.int64)
        self.thread = np.empty(0, np.int16)
        self.runs: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []  # at seal
        self.thread_code = {} if thread_code is None else thread_code

    def prepare(self, chunk: dict[str, np.ndarray]) -> _CallChunk:
        """What :meth:`add` takes of a chunk, from the chunk alone: run on the reader
        thread that read it (the split by process, the distinct threads), so the thread
        that adds the chunks only numbers the threads and keeps the parts."""
        key, start, threads = chunk["key"], chunk["start"], chunk["thread"]
        valid = key >= 0
        if self.pid0 is not None:
            valid &= threads != NULL_THREAD  # as SQL would
        if not valid.all():  # launch calls all have both in real exports: no copies then
            key, start, threads = key[valid], start[valid], threads[valid]
        local, uniques = pd.factorize(threads)
        tids = np.asarray(uniques, dtype=np.int64) + self.tid0
        start = start + self.base
        if self.pid0 is None:
            return _CallChunk(tids, [(0, key, start, local)])
        process_of = process_bits(tids, self.pid0)
        codes = np.unique(process_of).tolist()
        if len(codes) == 1:
            return _CallChunk(tids, [(codes[0] >> 32, codes[0] + key, start, local)])
        process = process_of[local]
        key = process + key
        parts = []
        for code in codes:
            mine = process == code
            parts.append((code >> 32, key[mine], start[mine], local[mine]))
        return _CallChunk(tids, parts)

    def add(self, chunk: _CallChunk) -> None:
        """Keep a chunk's calls (:meth:`prepare`'s), each thread numbered at its first call."""
        codes = [self.thread_code.setdefault(int(t), len(self.thread_code)) for t in chunk.tids]
        check_threads(len(self.thread_code))
        code_of = np.asarray(codes, dtype=np.int16)
        for process, key, start, local in chunk.parts:
            if process not in self.parts:
                self.parts[process] = _Buffer(self.capacity)
            self.parts[process].add(key, start, code_of[local])

    def seal(self) -> None:
        """Sort by key (if needed) and keep the first call of each key (runtime over driver)."""
        if self.pid0 is None:
            if self.parts:
                self.key, self.start, self.thread = _sorted_run(*self.parts.pop(0).columns())
            return
        for process in sorted(self.parts):
            self.runs.append((process, *_sorted_run(*self.parts.pop(process).columns())))

    def lookup(
        self, keys: np.ndarray, by_process: dict[int, np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Launch start (-1 if unknown) and thread code (-1) for each key; ``by_process``:
        the keys' rows of each process code, if found already (:func:`rows_by_process`)."""
        start = np.full(len(keys), -1, dtype=np.int64)
        thread = np.full(len(keys), -1, dtype=np.int16)
        if self.pid0 is None:
            _look_up([self.key, self.start, self.thread], keys, None, start, thread)
            return start, thread
        # Each process's keys searched in its own calls: a chunk's keys come in order
        # within a process, which keeps numpy's binary searches short (two processes'
        # keys interleaved would start each search over).
        by_process = rows_by_process(keys) if by_process is None else by_process
        for process, *run in self.runs:
            if process in by_process:
                _look_up(run, keys, by_process[process], start, thread)
        return start, thread

    def threads(self) -> np.ndarray:
        return np.array(list(self.thread_code), dtype=np.int64)


def rows_by_process(keys: np.ndarray) -> dict[int, np.ndarray]:
    """The rows of each process code among ``keys`` (several processes' keys), in order."""
    high = keys >> 32
    codes = pd.unique(high)
    if len(codes) == 1:
        return {int(codes[0]): np.arange(len(keys))}
    return {int(code): np.flatnonzero(high == code) for code in codes.tolist() if code >= 0}


def _sorted_run(
    key: np.ndarray, start: np.ndarray, thread: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Calls sorted by key (if they are not), the first call of each key kept."""
    if len(key) and (key[1:] < key[:-1]).any():
        order = np.argsort(key, kind="stable")
        key, start, thread = key[order], start[order], thread[order]
    if len(key) and (key[1:] == key[:-1]).any():
        first = np.ones(len(key), dtype=bool)
        first[1:] = key[1:] != key[:-1]
        key, start, thread = key[first], start[first], thread[first]
    return key, start, thread


def _look_up(
    run: list[np.ndarray],
    keys: np.ndarray,
    rows: np.ndarray | None,
    start: np.ndarray,
    thread: np.ndarray,
) -> None:
    """Fill ``start`` and ``thread`` at ``rows`` (None: all) where ``keys[rows]`` is in the
    sorted ``run`` (key, start, thread)."""
    run_key, run_start, run_thread = run
    if not len(run_key) or (rows is not None and not len(rows)):
        return
    wanted = keys if rows is None else keys[rows]
    index = np.minimum(np.searchsorted(run_key, wanted), len(run_key) - 1)
    hit = (run_key[index] == wanted) & (wanted >= 0)
    at = hit if rows is None else rows[hit]
    start[at] = run_start[index[hit]]
    thread[at] = run_thread[index[hit]]


@dataclasses.dataclass(frozen=True)
class _ActivityChunk:
    """A chunk of activities made ready for :meth:`_Builder.add`: its columns as read,
    durations, name values (index into the distinct values, and those values), and, for
    several processes, starts, devices (-1: not known from the process) and the rows of
    each process code."""

    columns: dict[str, np.ndarray]
    duration: np.ndarray
    name_index: np.ndarray
    name_values: np.ndarray
    start: np.ndarray | None
    device: np.ndarray | None
    by_process: dict[int, np.ndarray] | None


class _Builder:
    """Fills preallocated columns chunk by chunk, turning names and shapes into codes."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        tables: dict[str, list[str]],
        capacity: int,
        codec: Codec,
        shapes: bool,
        start_base: int | None = None,
        devices: _ProcessDevices | None = None,
    ) -> None:
        self.conn, self.tables, self.codec = conn, tables, codec
        kept = {**ARRAYS, SHAPE: np.int32} if shapes else dict(ARRAYS)
        if start_base is not None:  # several processes: keep starts and devices (TIMED)
            kept.update(TIMED)
        self.start_base = start_base or 0
        self.devices = devices  # None: the device is read with each activity
        self.arrays = {name: np.empty(capacity, dtype=t) for name, t in kept.items()}
        self.rows = 0
        self.name_code: dict[str, int] = {}
        self.kinds: list[str] = []
        self.by_value: dict[tuple[str, int], int] = {}  # (table, packed id) -> name code
        self.shape_code: dict[tuple[str, str], int] = {NO_SHAPE: 0}
        self.unmatched: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, keys)
        self.memcpy_labels = enum_labels(conn, tables, "ENUM_CUDA_MEMCPY_OPER") or MEMCPY_LABELS

    def prepare(self, table: str, chunk: dict[str, np.ndarray]) -> _ActivityChunk:
        """What :meth:`add` takes of a chunk of ``table`` that needs the chunk alone: run on
        the reader thread that read it, so the thread that adds the chunks only numbers
        names and looks launches up."""
        # The times themselves where they were read as stored (see _activity_exprs).
        duration = chunk["end"] - chunk["start"] if "end" in chunk else chunk["duration"]
        field = {KERNEL_TABLE: "names", MEMCPY_TABLE: "copy_kind", GRAPH_TABLE: "graph"}
        values = chunk[field[table]] if table in field else np.zeros(len(duration), np.int64)
        local, uniques = pd.factorize(values)
        start = device = by_process = None
        if "start" in self.arrays:
            offset = 0 if "end" in chunk else self.start_base  # read as stored, or as offsets
            start = chunk["start"] + offset
            device = chunk["device"] if self.devices is None else self.devices.of(chunk["key"])
            by_process = rows_by_process(chunk["key"])
        return _ActivityChunk(chunk, duration, local, uniques, start, device, by_process)

    def add(
        self, table: str, ready: _ActivityChunk, calls: _Calls, bounds: tuple[int, int]
    ) -> None:
        """Add a chunk of ``table`` (:meth:`prepare`'s), the rows of rowids ``bounds``
        (``[lo, hi)``)."""
        key = ready.columns["key"]
        n = len(key)
        rows = slice(self.rows, self.rows + n)
        self.arrays["duration"][rows] = ready.duration
        self.arrays["name"][rows] = self._names(table, ready.name_index, ready.name_values)
        if ready.start is not None and ready.device is not None:
            self.arrays["start"][rows] = ready.start
            self.arrays["device"][rows] = self._device(table, ready.device, bounds)
        if SHAPE in self.arrays:
            shapes = self._shapes(ready.columns) if table == KERNEL_TABLE else 0
            self.arrays[SHAPE][rows] = shapes
        start, thread = calls.lookup(key, ready.by_process)
        self.arrays["launch_start"][rows] = start
        self.arrays["launch_thread"][rows] = thread
        missing = (start < 0) & (key >= 0)
        if missing.any():
            self.unmatched.append((np.flatnonzero(missing) + self.rows, key[missing]))
        self.rows += n

    def _device(self, table: str, device: np.ndarray, bounds: tuple[int, int]) -> np.ndarray:
        unknown = device < 0
        if self.devices is not None and unknown.any():
            # No key, or a process the contexts table lacks: read the column.
            read = sqlite_scan.read_chunk(self.conn, table, {"device": "deviceId"}, bounds)
            if len(read["device"]) != len(device):
                raise sqlite_scan.BadColumn(f"{table} changed while it was read")
            device[unknown] = read["device"][unknown]
        return device

    def _names(self, table: str, local: np.ndarray, uniques: np.ndarray) -> np.ndarray:
        """Name codes of a chunk's name values (``local`` indexes ``uniques``)."""
        new = [int(v) for v in uniques if (table, int(v)) not in self.by_value]
        if new:
            for value, (name, kind) in zip(new, self._describe(table, new), strict=True):
                code = self.name_code.setdefault(name, len(self.name_code))
                if code == len(self.kinds):
                    self.kinds.append(kind)
                self.by_value[(table, value)] = code
        lookup = np.array([self.by_value[(table, int(v))] for v in uniques], dtype=np.int32)
        return lookup[local] if len(uniques) else np.empty(0, np.int32)

    def _describe(self, table: str, values: list[int]) -> list[tuple[str, str]]:
        if table == KERNEL_TABLE:
            strings = sqlite_scan.strings_by_id(self.conn, np.array(values, dtype=np.int64))
            return [(strings.get(i, f"kernel {i}"), "kernel") for i in values]
        if table == MEMCPY_TABLE:
            labels = self.memcpy_labels
            return [(f"[CUDA memcpy {labels.get(v, f'kind {v}')}]", "memcpy") for v in values]
        if table == MEMSET_TABLE:
            return [("[CUDA memset]", "memset") for _ in values]
        return [(f"[CUDA graph {g}]", "graph") for g in values]

    def _shapes(self, chunk: dict[str, np.ndarray]) -> np.ndarray:
        grid_local, grids = pd.factorize(chunk["grid"])
        block_local, blocks = pd.factorize(chunk["block"])
        pair_local, pairs = pd.factorize(grid_local.astype(np.int64) * len(blocks) + block_local)
        codes = []
        for pair in pairs:
            grid, block = int(grids[pair // len(blocks)]), int(blocks[pair % len(blocks)])
            shape = (unpacked_shape(grid, 31, 16), unpacked_shape(block, 11, 10))
            codes.append(self.shape_code.setdefault(shape, len(self.shape_code)))
        return np.array(codes, dtype=np.int32)[pair_local] if codes else np.empty(0, np.int32)

    def fill_unmatched(self, calls: _Calls) -> None:
        """Look the activities without a launch call up in ``calls`` (the other API calls)."""
        for rows, keys in self.unmatched:
            start, thread = calls.lookup(keys)
            self.arrays["launch_start"][rows] = start
            self.arrays["launch_thread"][rows] = thread

    def columns(self) -> dict[str, np.ndarray]:
        return {name: array[: self.rows] for name, array in self.arrays.items()}


def read_nsys_columns(
    path: str | Path, progress: Progress | None = None, timed: bool = False
) -> ActivityColumns:
    """Read an Nsight Systems export as compact columns (see the module doc).

    Raises :class:`BadInput` (one line naming the file) for a file that is missing, not a
    regular file, unreadable, not SQLite, truncated, empty, not an nsys export, or one whose
    tables lack the columns or hold cells of types an export never has; and
    :class:`~.nsys_export.NoKernelsTraced` (a ``BadInput``) with the likely reason when the
    export holds no CUDA kernels. An ``.xz``/``.gz`` export is read directly (unpacked to a
    temporary file). The sidecar beside it, if any, is ``meta["sidecar"]``. ``progress(rows_done, rows_total)`` is called after each chunk.
    Each activity's GPU start and device (:data:`~profkit.traces.columns.TIMED`) are kept
    where the export may hold several CUDA processes (:func:`keeps_start_times`), or
    always with ``timed``: an export of one process read as a node of a job needs them.
    """
    path = Path(path)
    with opened_export(path) as (conn, plain):
        columns = _columns(conn, plain, path, progress, timed)
    if columns.kernel_rows is not None:
        columns.read_shapes = shape_reader(path, columns.kernel_rows)
    columns.meta["sidecar"] = read_sidecar(path)
    return columns


def _columns(
    conn: sqlite3.Connection, plain: Path, path: Path, progress: Progress | None, timed: bool
) -> ActivityColumns:
    tables = sqlite_scan.table_columns(conn)
    check_nsys(path, tables)
    check_columns(conn, tables)
    meta = export_meta(conn, tables, path)
    # A compressed export's plain copy is gone after the read: scan its shapes now.
    read = _read(plain, conn, tables, progress, plain != path, timed)
    builder, kernel_rows, threads, ranges, range_meta = read
    if not builder.rows:
        raise NoKernelsTraced(no_kernels_message(path, conn, tables, meta))
    arrays = builder.columns()
    clamp_negative(arrays["duration"], meta, "activities", "GPU activities")
    for key, value in range_meta.items():  # the ranges' warnings after the activities'
        if key == "warnings":
            meta.setdefault("warnings", []).extend(value)
        else:
            meta[key] = value
    return ActivityColumns(
        arrays=arrays,
        names=sorted(builder.name_code, key=builder.name_code.__getitem__),
        kinds=builder.kinds,
        shapes=sorted(builder.shape_code, key=builder.shape_code.__getitem__)
        if SHAPE in arrays
        else [],
        threads=threads,
        ranges=ranges,
        meta=meta,
        kernel_rows=kernel_rows,
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the read of one export keeps and how it keys its rows."""

    codec: Codec
    one_process: int | None  # its process id, when every activity is that process's
    base: int  # the first API call's start: starts travel as offsets from it
    devices: _ProcessDevices | None  # several processes, one device each (no device column)
    timed: bool = False  # starts and devices kept for one process too (a node of a job)

    @classmethod
    def of(
        cls,
        conn: sqlite3.Connection,
        tables: dict[str, list[str]],
        api: list[str],
        timed: bool = False,
    ) -> _Plan:
        codec = Codec.of(conn, tables)
        one_process = _single_cuda_process(conn, tables, codec)
        if one_process is not None:  # keys are correlation ids: no pid arithmetic per row
            codec = dataclasses.replace(codec, use_pid=False)
            # Its devices read with each activity: the contexts table's are keyed by process.
            return cls(codec, one_process, _first_start(conn, api), None, timed)
        devices = _process_devices(conn, tables, codec)
        return cls(codec, None, _first_start(conn, api), devices, timed)

    @property
    def start_base(self) -> int | None:
        """Several processes (or not known to be one), or a read asked to keep them: ranks
        need starts, kept from here."""
        return self.base if self.one_process is None or self.timed else None

    @property
    def calls_pid0(self) -> int | None:
        """Several processes: the calls' keys are made from their threads, from this pid."""
        return self.codec.pid0 if self.one_process is None and self.codec.use_pid else None

    def calls(self, capacity: int, thread_code: dict[int, int] | None = None) -> _Calls:
        return _Calls(self.codec.tid0, self.base, capacity, thread_code, self.calls_pid0)


def _read(
    path: Path,
    conn: sqlite3.Connection,
    tables: dict[str, list[str]],
    progress: Progress | None,
    scan_shapes: bool,
    timed: bool,
) -> tuple[_Builder, RowMap | None, np.ndarray, pd.DataFrame, dict[str, Any]]:
    launch_ids = launch_name_ids(conn)
    activity = activity_tables(tables)
    api = [t for t in API_TABLES if t in tables and "globalTid" in tables[t]]
    plan = _Plan.of(conn, tables, api, timed)
    bounds = {t: sqlite_scan.row_bound(conn, t) for t in (*activity, *api)}
    done, total = 0, sum(bounds.values())
    capacity = sum(bounds[t] for t in activity)
    builder = _Builder(
        conn, tables, capacity, plan.codec, scan_shapes, plan.start_base, plan.devices
    )
    kernel_rows = None if scan_shapes or KERNEL_TABLE not in tables else _RowRuns(conn)
    exprs, null_as = _api_exprs(plan)
    # One window of chunks across the tables: the activities' first chunks are read while
    # the last calls are taken, and no thread idles at the end of a table.
    # No process filter on the calls: a launch needs a CUDA context, so with one context
    # process every launch-like call is that process's.
    calls_where = _where(launch_ids, True, None)
    api_chunks = {t: sqlite_scan.chunk_bounds(conn, t, CHUNK_ROWS) for t in api}
    api_end = {t: chunks[0][0] + bounds[t] for t, chunks in api_chunks.items() if chunks}
    calls = plan.calls(sum(bounds[t] for t in api))
    scans = [
        sqlite_scan.Scan(t, exprs, calls_where, api_chunks[t], missing=null_as, then=calls.prepare)
        for t in api
    ]
    for table in activity:
        read, checked = _activity_exprs(conn, plan, tables, table, scan_shapes)
        chunks = sqlite_scan.chunk_bounds(conn, table, CHUNK_ROWS)
        ready = functools.partial(builder.prepare, table)
        scans.append(sqlite_scan.Scan(table, read, "", chunks, checked, then=ready))
    with sqlite_scan.ParallelReader(path) as reader:
        ranges = reader.call(lambda worker: _ranges(worker, tables))
        sealed = False
        for index, rows, chunk in reader.stream_scans(conn, scans):
            table = scans[index].table
            if index < len(api):
                calls.add(chunk)  # the scan went over the chunk's rows, fewer launches
                done = _tick(progress, done, min(rows[1], api_end[table]) - rows[0], total)
                continue
            if not sealed:  # the calls come first: all are in once an activity comes
                calls.seal()
                sealed = True
            builder.add(table, chunk, calls, rows)
            count = len(chunk.duration)
            if kernel_rows is not None and table == KERNEL_TABLE:
                kernel_rows.add(rows, count)
            done = _tick(progress, done, count, total)
        if builder.unmatched and launch_ids:
            # The thread codes dict is shared: one code per thread across both reads.
            others = plan.calls(sum(bounds[t] for t in api), calls.thread_code)
            for table in api:
                where = _where(launch_ids, False, plan.one_process)
                chunks = sqlite_scan.chunk_bounds(conn, table, CHUNK_ROWS)
                for chunk in reader.stream(
                    conn, table, exprs, where, chunks=chunks, missing=null_as
                ):
                    others.add(others.prepare(chunk))
            others.seal()
            builder.fill_unmatched(others)
        range_frame, range_meta = ranges.result()
    row_map = kernel_rows.map() if kernel_rows is not None else None
    return builder, row_map, calls.threads(), range_frame, range_meta


def _ranges(
    conn: sqlite3.Connection, tables: dict[str, list[str]]
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The NVTX ranges, built on a reader thread while the activities are read, and what
    they add to the export's meta (merged after the activities' own, in the same order)."""
    rows, created = nvtx_rows(conn, tables)
    meta: dict[str, Any] = {}
    return build_ranges(rows, created, _trace_end(conn, tables, rows), meta), meta


class _RowRuns:
    """The kernel table's row ids, chunk by chunk, as runs: a chunk of ``[lo, hi)`` whose
    count fills the range is one run; only a chunk with gaps has its row ids read."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        last = conn.execute(f'SELECT max(rowid) FROM "{KERNEL_TABLE}"').fetchone()[0]
        self.end = 0 if last is None else int(last) + 1
        self.starts: list[np.ndarray] = []
        self.rowids: list[np.ndarray] = []
        self.count = 0

    def add(self, bounds: tuple[int, int], rows: int) -> None:
        lo, hi = bounds
        if rows == min(hi, self.end) - lo:
            ids_first, first = np.array([lo]), np.array([0])
        else:
            sql = f'SELECT group_concat(rowid) FROM "{KERNEL_TABLE}" WHERE rowid >= ? AND rowid < ?'
            text = self.conn.execute(sql, bounds).fetchone()[0]
            ids = np.array((text or "").split(",") if text else [], dtype=np.int64)
            if len(ids) != rows:
                raise sqlite_scan.BadColumn(f"{KERNEL_TABLE} changed while it was read")
            first = np.flatnonzero(np.diff(ids, prepend=ids[0] - 2) != 1) if rows else ids
            ids_first = ids[first]
        self.starts.append(first + self.count)
        self.rowids.append(ids_first)
        self.count += rows

    def map(self) -> RowMap:
        return RowMap.of_runs(self.starts, self.rowids, self.count)


def shape_reader(path: Path, rows: RowMap) -> ShapeReader:
    """Reads (grid, block) of given activities from the export at ``path`` by row id."""

    def read(index: np.ndarray) -> list[tuple[str, str]]:
        shapes = [NO_SHAPE] * len(index)
        kernels = np.flatnonzero((index >= 0) & (index < rows.count))
        if not len(kernels):
            return shapes
        rowids = rows.rowid(index[kernels])
        with opened_export(path) as (conn, _):
            found = _shapes_by_rowid(conn, np.unique(rowids))
        for at, rowid in zip(kernels.tolist(), rowids.tolist(), strict=True):
            shapes[at] = found[rowid]
        return shapes

    return read


def _shapes_by_rowid(conn: sqlite3.Connection, rowids: np.ndarray) -> dict[int, tuple[str, str]]:
    grid_columns = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"]
    found: dict[int, tuple[str, str]] = {}
    for lo in range(0, len(rowids), 500):  # SQLite's bound-parameter limit
        batch = rowids[lo : lo + 500].tolist()
        sql = (
            f"SELECT rowid, ifnull({GRID_EXPR}, -1), ifnull({BLOCK_EXPR}, -1) "
            f'FROM "{KERNEL_TABLE}" WHERE rowid IN ({",".join("?" * len(batch))})'
        )
        for rowid, grid, block in conn.execute(sql, batch):
            if not isinstance(grid, int) or not isinstance(block, int):
                raise sqlite_scan._bad_cell(conn, KERNEL_TABLE, grid_columns, f"rowid = {rowid}")
            found[int(rowid)] = (unpacked_shape(grid, 31, 16), unpacked_shape(block, 11, 10))
    missing = set(rowids.tolist()) - set(found)
    if missing:
        raise sqlite_scan.BadColumn(
            f"{KERNEL_TABLE} lost rows since it was read (row {min(missing)})"
        )
    return found


def _tick(progress: Progress | None, done: int, rows: int, total: int) -> int:
    done += rows
    if progress is not None:
        progress(done, max(total, done))
    return done


def _api_exprs(plan: _Plan) -> tuple[dict[str, str], dict[str, int]]:
    """The API calls' columns, and what NULL reads as in each."""
    codec = plan.codec
    # Starts travel as offsets: ~5 fewer digits to format and parse per call. With several
    # processes the keys are made from the threads (_Calls.add), so a NULL thread must read
    # as no thread.
    key = "correlationId" if plan.calls_pid0 is not None else codec.key(TID_PID_BITS)
    exprs = {"key": key, "start": f"start - {plan.base}", "thread": f"globalTid - {codec.tid0}"}
    null_thread = NULL_THREAD if plan.calls_pid0 is not None else -1
    return exprs, {"key": -1, "start": -1, "thread": null_thread}


def _first_start(conn: sqlite3.Connection, tables: list[str]) -> int:
    for table in tables:
        row = conn.execute(f'SELECT start FROM "{table}" LIMIT 1').fetchone()
        if row and row[0] is not None:
            return int(row[0])
    return 0


def _trace_end(conn: sqlite3.Connection, tables: dict[str, list[str]], ranges: list[Any]) -> int:
    """Where ranges left open end: the last activity's end.

    Only ranges still open when the capture stopped need it, so the scan it costs is paid
    only then; the columns carry durations, not start times.
    """
    if not any(row[1] is None for row in ranges):
        return 0
    ends = [
        conn.execute(
            f'SELECT max(max(start, start + max("end" - start, 0))) FROM "{t}"'
        ).fetchone()[0]
        for t in activity_tables(tables)
    ]
    return max((int(e) for e in ends if e is not None), default=0)


def _where(launch_ids: list[int], launch_only: bool, process: int | None) -> str:
    ids = ",".join(str(i) for i in launch_ids)
    if not ids:
        where = "1" if launch_only else "0"
    else:
        where = f"nameId IN ({ids})" if launch_only else f"nameId NOT IN ({ids})"
    # With correlation ids alone as keys, calls of other processes must not match.
    return where if process is None else f"{where} AND {TID_PID_BITS} = {process}"


def keeps_start_times(path: Path) -> bool:
    """Whether :func:`read_nsys_columns` keeps each activity's start for the plain SQLite
    export at ``path``: where its activities may belong to several CUDA processes. A look
    at its contexts table, no scan; False for a file it cannot say that of."""
    if not path.is_file():  # a FIFO would block the read below; the reader names it
        return False
    try:
        with path.open("rb") as handle:
            if not handle.read(len(sqlite_scan.SQLITE_MAGIC)).startswith(sqlite_scan.SQLITE_MAGIC):
                return False
        conn = sqlite_scan.open_readonly(path)
    except (OSError, BadInput):
        return False
    try:
        tables = sqlite_scan.table_columns(conn)
        if KERNEL_TABLE not in tables or "globalPid" not in tables[KERNEL_TABLE]:
            return False
        return _single_cuda_process(conn, tables, Codec.of(conn, tables)) is None
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def _single_cuda_process(
    conn: sqlite3.Connection, tables: dict[str, list[str]], codec: Codec
) -> int | None:
    """The process id when every activity belongs to one process (else None).

    Every activity runs in a CUDA context, and ``TARGET_INFO_CUDA_CONTEXT_INFO`` lists the
    process of each; when they are all one process, the activities' keys need no process
    bits (the API calls are then filtered to that process).
    """
    table = CONTEXTS_TABLE
    if not codec.use_pid or "processId" not in tables.get(table, []):
        return None
    found = conn.execute(f"SELECT DISTINCT processId FROM {table}").fetchall()
    if len(found) != 1 or found[0][0] is None or int(found[0][0]) != codec.pid0:
        return None
    return codec.pid0


def _process_devices(
    conn: sqlite3.Connection, tables: dict[str, list[str]], codec: Codec
) -> _ProcessDevices | None:
    """Each process's device, when the contexts table gives every process one (else None)."""
    if not codec.use_pid or not {"processId", "deviceId"} <= set(tables.get(CONTEXTS_TABLE, [])):
        return None
    found: dict[int, set[int]] = {}
    for pid, device in conn.execute(f"SELECT DISTINCT processId, deviceId FROM {CONTEXTS_TABLE}"):
        if not isinstance(pid, int) or not isinstance(device, int) or not 0 <= device < 1 << 15:
            return None
        found.setdefault(pid, set()).add(device)
    codes = {(pid - codec.pid0) & PROCESS_MASK: devices for pid, devices in found.items()}
    if not codes or len(codes) < len(found) or any(len(d) != 1 for d in codes.values()):
        return None
    order = sorted(codes)
    return _ProcessDevices(
        np.array(order, dtype=np.int64), np.array([min(codes[c]) for c in order], np.int16)
    )


def _activity_exprs(
    conn: sqlite3.Connection,
    plan: _Plan,
    tables: dict[str, list[str]],
    table: str,
    shapes: bool,
) -> tuple[dict[str, str], tuple[str, ...]]:
    """The columns read from activity ``table``, and those whose cells are checked."""
    common = plan.codec.common()
    exprs = {"key": common["key"]}
    checked: tuple[str, ...] = TIMES
    if plan.start_base is None:
        # No start times for one process: its report needs durations (and launch times,
        # from the API calls).
        exprs["duration"] = common["duration"]
    elif set(TIMES) <= sqlite_scan.not_null_columns(conn, table):
        # Several processes' ranks need starts. Read as stored, start and end need no
        # check: a cell of text (or a real) stops the parse, which finds it (sqlite_scan).
        exprs.update(start="start", end='"end"')
        checked = ()
    else:
        exprs.update(duration=common["duration"], start=f"start - {plan.start_base}")
    if plan.start_base is not None and plan.devices is None:
        exprs["device"] = "deviceId"
    cols = tables[table]
    if table == KERNEL_TABLE:
        name_col = next(c for c in ("demangledName", "name", "mangledName") if c in cols)
        exprs["names"] = name_col
        if shapes:
            exprs.update(grid=GRID_EXPR, block=BLOCK_EXPR)
    elif table == MEMCPY_TABLE:
        exprs["copy_kind"] = "copyKind" if "copyKind" in cols else "0"
    elif table == GRAPH_TABLE:
        exprs["graph"] = "graphId" if "graphId" in cols else "0"
    return exprs, checked
