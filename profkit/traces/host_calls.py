"""What the findings need beyond the compact columns: each process's GPU intervals on the
host clock, and its CUDA API calls that launch work or block the host.

The compact columns (:mod:`.columns`) keep, for one process, no GPU start times, and for
no trace the API calls that do not launch (``cudaStreamSynchronize``, ...). The findings
(:mod:`profkit.analysis.findings`) need both: where the GPU idles, and what the host did
then. This reader gets them in one small query per table (nsys: the kernel, copy and
memset tables, and ``CUPTI_ACTIVITY_KIND_RUNTIME`` joined to its names) or one pass over a
Chrome trace's events (``kernel``/``gpu_memcpy``/``gpu_memset`` and ``cuda_runtime``).
It keeps 25 bytes a GPU activity and 25 an API call of the kinds below; nothing else.

A trace that recorded no API calls (a Chrome trace without ``cuda_runtime`` events) gives
``has_calls`` False, and the rules that need them say so once.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from profkit.traces.host_trace import (
    CALL_KINDS,
    COPY_DIRECTIONS,
    INTS,
    KEPT_AS,
    KEPT_VERSION,
    MEM_KINDS,
    ChromeHostRows,
    HostTrace,
    call_kind,
    keep_host,
)
from profkit.traces.schema import NCCL_PREFIX, PROCESS_MASK, PROCESS_SHIFT

if TYPE_CHECKING:
    from profkit.traces.columns import ActivityColumns

__all__ = [
    "CALL_KINDS",
    "COPY_DIRECTIONS",
    "MEM_KINDS",
    "HostTrace",
    "call_kind",
    "host_traces",
    "read_host_trace",
]

_COPY_CODE = (
    "CASE WHEN copyKind = 1 THEN 8 + srcKind WHEN copyKind = 2 THEN 16 + dstKind ELSE -1 END"
)


def read_host_trace(path: Path, meta: dict[str, Any]) -> HostTrace:
    """The :class:`HostTrace` of one trace file (its columns' ``meta`` says the format)."""
    if meta.get("format") == "chrome":
        return _chrome(path, meta)
    # An .nsys-rep was read through its SQLite export, which the columns' meta names.
    return _nsys(Path(meta.get("path") or path))


def _nsys(path: Path) -> HostTrace:
    """Integer columns read in chunks on a few threads (:class:`~.sqlite_scan.ParallelReader`),
    as the columns' reader does: no Python row per activity."""
    from profkit.traces.nsys_export import opened_export
    from profkit.traces.sqlite_scan import ParallelReader, table_columns

    gpu: dict[str, list[np.ndarray]] = {
        "start": [], "end": [], "pid": [], "name": [], "copy": [], "bytes": []
    }  # fmt: skip
    call: dict[str, list[np.ndarray]] = {"start": [], "end": [], "pid": [], "name": []}
    copy_kinds = True
    with opened_export(path) as (conn, plain):
        tables = table_columns(conn)
        names = dict(conn.execute("SELECT id, value FROM StringIds").fetchall())
        with ParallelReader(plain) as reader:
            for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                          "CUPTI_ACTIVITY_KIND_MEMSET"):  # fmt: skip
                if table not in tables:
                    continue
                name = "shortName" if "shortName" in tables[table] else "-1"
                exprs = {"start": "start", "end": "end", "pid": "globalPid", "name": name,
                         "copy": "-1", "bytes": "0"}  # fmt: skip
                if {"copyKind", "srcKind", "dstKind", "bytes"} <= set(tables[table]):
                    exprs |= {"copy": _COPY_CODE, "bytes": "bytes"}
                elif table == "CUPTI_ACTIVITY_KIND_MEMCPY":
                    copy_kinds = False
                for chunk in reader.stream(conn, table, exprs):
                    for key in gpu:
                        gpu[key].append(chunk[key])
            kinds = {i: call_kind(str(v)) for i, v in names.items()}
            wanted = ",".join(str(i) for i, k in kinds.items() if k >= 0)
            if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables and wanted:
                exprs = {"start": "start", "end": "end", "pid": "globalTid", "name": "nameId"}
                where = f"nameId IN ({wanted})"
                for chunk in reader.stream(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", exprs, where):
                    for key in call:
                        call[key].append(chunk[key])
    g = {k: np.concatenate([np.zeros(0, np.int64), *v]).astype(np.int64) for k, v in gpu.items()}
    c = {k: np.concatenate([np.zeros(0, np.int64), *v]).astype(np.int64) for k, v in call.items()}
    nccl_ids = np.array([i for i, v in names.items() if NCCL_PREFIX.match(str(v))], np.int64)
    g_order = np.argsort(g["start"], kind="stable")
    c_order = np.argsort(c["start"], kind="stable")
    ids, index = np.unique(c["name"][c_order], return_inverse=True)  # a few names, many calls
    id_names = np.array([str(names.get(int(i), "")) for i in ids], dtype=object)
    id_kinds = np.array([call_kind(n) for n in id_names], dtype=np.int8)
    return HostTrace(
        str(path),
        g["start"][g_order],
        g["end"][g_order],
        (g["pid"][g_order] >> PROCESS_SHIFT) & PROCESS_MASK,
        np.isin(g["name"][g_order], nccl_ids),
        g["copy"][g_order].astype(np.int8),
        g["bytes"][g_order],
        c["start"][c_order],
        c["end"][c_order],
        (c["pid"][c_order] >> PROCESS_SHIFT) & PROCESS_MASK,
        id_kinds[index] if len(ids) else np.zeros(0, np.int8),
        id_names[index] if len(ids) else np.zeros(0, object),
        len(c["start"]) > 0,
        copy_kinds,
    )


def _chrome(path: Path, meta: dict[str, Any]) -> HostTrace:
    """One pass over the events, streamed a batch at a time as the columns' reader does
    (:func:`~profkit.traces.chrome.over_events`): never the whole document in memory. (The
    columns' reader keeps this trace with them as it reads: :class:`ChromeHostRows`.)"""
    from profkit.traces.chrome import over_events

    def collect(batches: Iterable[list[Any]]) -> ChromeHostRows:
        rows = ChromeHostRows()
        for events in batches:
            rows.add(events)
        return rows

    _header, rows = over_events(path, collect)
    return rows.trace(path, meta)


def host_traces(paths: list[Path], files: list[ActivityColumns]) -> list[HostTrace]:
    """The :class:`HostTrace` of each of a job's files (``files``: their columns), read
    once and kept with the columns: a repeated query of a cached trace reads it from the
    cache instead of the trace (a Chrome trace's JSON is not parsed again)."""
    return [_kept_or_read(Path(p), c) for p, c in zip(paths, files, strict=True)]


def _kept_or_read(path: Path, columns: ActivityColumns) -> HostTrace:
    kept = columns.derived.get(KEPT_AS)
    if kept is not None and kept.meta.get("version") == KEPT_VERSION:
        a, meta = kept.arrays, kept.meta
        names = np.array(meta["call_names"] + [""], dtype=object)
        ints = {k: np.asarray(a[k], np.int64) for k in INTS}
        return HostTrace(
            str(meta["path"]), ints["gpu_start"], ints["gpu_end"], ints["gpu_pid"],
            np.asarray(a["gpu_nccl"]) != 0, np.asarray(a["gpu_copy"], np.int8),
            ints["gpu_bytes"], ints["call_start"], ints["call_end"],
            ints["call_pid"], np.asarray(a["call_kind"], np.int8),
            names[np.asarray(a["call_name"], np.int64)], bool(meta["has_calls"]),
            bool(meta.get("copy_kinds", True)),
        )  # fmt: skip
    host = read_host_trace(path, columns.meta)
    keep_host(columns, host)
    return host
