"""The host side of a trace, as the findings read it: :class:`HostTrace` (each process's
GPU intervals on the host clock and the CUDA API calls that launch work or block the host),
what an API call is to them (:func:`call_kind`), how a Chrome trace's events become one
(:class:`ChromeHostRows`, fed a batch of events at a time by whichever pass reads the
JSON: the columns' own, or :mod:`.host_calls`' for a trace read before), and how one is
kept with its file's columns (:func:`keep_host`). The readers are :mod:`.host_calls`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from profkit.traces.chrome_fields import MAX_US, to_ns
from profkit.traces.columns import Derived
from profkit.traces.schema import NCCL_PREFIX

if TYPE_CHECKING:
    from profkit.traces.columns import ActivityColumns

CALL_KINDS = ("launch", "sync", "capture")
"""What an API call is to the findings: it puts work on the GPU (kernel launches, async
copies and memsets, graph launches), it blocks the host until the GPU has done work, or
it starts the capture (``cudaProfilerStart``: where an nsys capture range begins)."""
_LAUNCH = re.compile(
    r"^(cuda|cu)(LaunchKernel|LaunchCooperativeKernel|GraphLaunch|MemcpyAsync|Memcpy[23]DAsync"
    r"|MemsetAsync|MemsetD\d+Async)",
)
_SYNC = re.compile(
    r"^(cuda|cu)(StreamSynchronize|DeviceSynchronize|CtxSynchronize|EventSynchronize"
    r"|Memcpy|Memcpy[23]D|MemcpyDtoH|MemcpyHtoD)$"
)
_CAPTURE = re.compile(r"^(cuda|cu)ProfilerStart$")
_VERSION = re.compile(r"_v\d+$")
MEM_KINDS = {0: "pageable", 1: "pinned", 4: "managed", 7: "unknown"}
"""The host memory kinds of copies, numbered as Nsight Systems' ``ENUM_CUDA_MEM_KIND``."""
COPY_DIRECTIONS = {1: "host-to-device", 2: "device-to-host"}
"""Numbered as ``ENUM_CUDA_MEMCPY_OPER`` (``copyKind``)."""
_CHROME_COPY = re.compile(r"Memcpy (HtoD|DtoH) \((\w+) -> (\w+)\)")
_CHROME_KINDS = {"pageable": 0, "pinned": 1, "managed": 4}
_CHROME_CATEGORIES = frozenset(("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime"))


def call_kind(name: str) -> int:
    """The index in :data:`CALL_KINDS` of an API call's name (nsys' ``_v3020`` suffixes
    dropped), or -1 for a call the findings ignore."""
    bare = _VERSION.sub("", name)
    if _SYNC.match(bare):  # before _LAUNCH: cudaMemcpy (synchronous) is a sync
        return 1
    if _LAUNCH.match(bare):
        return 0
    if _CAPTURE.match(bare):
        return 2
    return -1


@dataclass
class HostTrace:
    """One file's GPU activities and API calls, times in ns on the columns' clock."""

    path: str
    gpu_start: np.ndarray
    gpu_end: np.ndarray
    gpu_pid: np.ndarray
    """The process that launched each activity (its pid)."""
    gpu_nccl: np.ndarray
    gpu_copy: np.ndarray
    """Per activity, a host<->device copy's direction and host memory: ``8 × direction
    (1 host-to-device, 2 device-to-host) + the host side's kind`` (:data:`MEM_KINDS`); -1
    for other activities (kernels, memsets, device-to-device and peer copies)."""
    gpu_bytes: np.ndarray
    """Bytes a copy moved (0 for other activities)."""
    call_start: np.ndarray
    call_end: np.ndarray
    call_pid: np.ndarray
    call_kind: np.ndarray
    """Index into :data:`CALL_KINDS`."""
    call_name: np.ndarray
    """Each call's name, as the trace spells it (object array)."""
    has_calls: bool
    copy_kinds: bool = True
    """Whether the trace says which host memory its copies used (an nsys export whose
    copy table lacks ``srcKind``/``dstKind`` does not)."""

    def of_process(self, pid: int | None) -> HostTrace:
        """This file's activities and calls of one process (all of them for None)."""
        if pid is None:
            return self
        g, c = self.gpu_pid == pid, self.call_pid == pid
        return HostTrace(
            self.path, self.gpu_start[g], self.gpu_end[g], self.gpu_pid[g], self.gpu_nccl[g],
            self.gpu_copy[g], self.gpu_bytes[g], self.call_start[c], self.call_end[c],
            self.call_pid[c], self.call_kind[c], self.call_name[c], self.has_calls,
            self.copy_kinds,
        )  # fmt: skip


_Rows = list[tuple[float, float, int, str]]


class ChromeHostRows:
    """What the findings read of a Chrome trace's events, a batch at a time: (ts, dur,
    bytes, name) of its GPU activities and of the API calls the findings use."""

    def __init__(self) -> None:
        self.gpu: _Rows = []
        self.calls: _Rows = []
        self._kinds: dict[str, int] = {}  # a few API names, repeated: their kind found once

    def add(self, events: list[Any]) -> None:
        gpu, calls, kinds = self.gpu, self.calls, self._kinds
        for ev in events:
            cat = ev.get("cat") if isinstance(ev, dict) else None
            if not isinstance(cat, str) or cat not in _CHROME_CATEGORIES:  # a list: malformed
                continue
            ts, dur = ev.get("ts"), ev.get("dur", 0)
            if not _finite(ts) or not _finite(dur) or dur < 0:
                continue  # what the columns' reader drops with a warning, dropped here silently
            name = str(ev.get("name", ""))
            if cat != "cuda_runtime":
                if ev.get("ph") == "X":
                    args = ev.get("args")
                    size = (
                        args.get("bytes") if cat == "gpu_memcpy" and isinstance(args, dict) else 0
                    )
                    size = size if isinstance(size, int) and size > 0 else 0
                    gpu.append((ts, dur, size, name if cat != "gpu_memset" else ""))
                continue
            kind = kinds.get(name)
            if kind is None:
                kind = kinds[name] = call_kind(name)
            if kind >= 0:
                calls.append((ts, dur, 0, name))

    def trace(self, path: Path, meta: dict[str, Any]) -> HostTrace:
        """The :class:`HostTrace` of the rows (``meta``: the trace's columns')."""
        base = int(meta.get("base_time_ns") or 0)
        pid = int(meta.get("pid") or 0)
        # One file is one process: its activities are that process's (Kineto's GPU events
        # carry the device as their pid).
        gpu_ns = [(int(s), int(s) + int(d), size, n) for s, d, size, n in _to_ns(self.gpu, base)]
        call_ns = [(int(s), int(s) + int(d), pid, n) for s, d, _, n in _to_ns(self.calls, base)]
        gpu_ns.sort()
        call_pid = np.full(len(call_ns), pid, dtype=np.int64)
        return _host_trace(
            str(path), gpu_ns, np.full(len(gpu_ns), pid, np.int64), call_ns, call_pid,
            bool(self.calls),
        )  # fmt: skip


def _chrome_copy(name: str) -> int:
    """A Kineto copy's code as in :attr:`HostTrace.gpu_copy` (``Memcpy HtoD (Pageable ->
    Device)``), -1 for anything else."""
    found = _CHROME_COPY.match(name)
    if found is None:
        return -1
    direction, src, dst = found.groups()
    host = src if direction == "HtoD" else dst
    return 8 * (1 if direction == "HtoD" else 2) + _CHROME_KINDS.get(host.lower(), 7)


def _finite(value: Any) -> bool:
    """A time the columns' reader keeps: a number, finite and within any clock's range."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < MAX_US
    )


def _to_ns(rows: list[tuple[Any, ...]], base: int) -> list[tuple[int, int, int, str]]:
    if not rows:
        return []
    starts = to_ns([r[0] for r in rows], base)
    durs = to_ns([r[1] for r in rows])
    return [(int(s), int(d), r[2], r[3]) for s, d, r in zip(starts, durs, rows, strict=True)]


def _host_trace(
    path: str,
    gpu: list[tuple[int, int, int, str]],
    gpu_pid: np.ndarray,
    calls: list[tuple[int, int, int, str]],
    call_pid: np.ndarray,
    has_calls: bool,
) -> HostTrace:
    calls_order = sorted(range(len(calls)), key=lambda i: calls[i][0])
    calls = [calls[i] for i in calls_order]
    call_pid = call_pid[np.array(calls_order, dtype=np.int64)] if calls else call_pid
    return HostTrace(
        path,
        np.array([r[0] for r in gpu], dtype=np.int64),
        np.array([r[1] for r in gpu], dtype=np.int64),
        gpu_pid,
        np.array([bool(NCCL_PREFIX.match(r[3])) for r in gpu], dtype=bool),
        np.array([_chrome_copy(r[3]) for r in gpu], dtype=np.int8),
        np.array([r[2] for r in gpu], dtype=np.int64),
        np.array([r[0] for r in calls], dtype=np.int64),
        np.array([r[1] for r in calls], dtype=np.int64),
        call_pid,
        np.array([call_kind(r[3]) for r in calls], dtype=np.int8),
        np.array([r[3] for r in calls], dtype=object),
        has_calls,
    )


KEPT_AS = "host_calls"
"""The name a file's host trace is kept under with its columns (and so in the cache)."""
KEPT_VERSION = 3
"""Bumped when what :func:`read_host_trace` reads changes: older kept copies are read anew."""
INTS = ("gpu_start", "gpu_end", "gpu_pid", "gpu_bytes", "call_start", "call_end", "call_pid")


def keep_host(columns: ActivityColumns, host: HostTrace) -> None:
    """Keep ``host`` (its file's host trace) with the file's columns, and so in the cache."""
    names, codes = np.unique(host.call_name.astype(str), return_inverse=True)
    arrays = {k: np.asarray(getattr(host, k), np.int64) for k in INTS}
    arrays |= {
        "gpu_nccl": host.gpu_nccl.astype(np.uint8),
        "gpu_copy": host.gpu_copy.astype(np.int8),
        "call_kind": host.call_kind.astype(np.int8),
        "call_name": codes.reshape(-1).astype(np.int32),
    }
    meta = {"version": KEPT_VERSION, "path": host.path, "has_calls": host.has_calls,
            "copy_kinds": host.copy_kinds,
            "call_names": [str(n) for n in names]}  # fmt: skip
    columns.remember(KEPT_AS, Derived(arrays, meta))
