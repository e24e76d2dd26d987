"""Several nodes' Nsight Systems reports of one job, merged into one multi-rank :class:`Trace`.

Across hosts each node profiles its own ``torchrun`` tree, so a job of N nodes leaves N
exports (``node0.sqlite``, ...), each holding that node's ranks on that host's clock.
:func:`merge_node_traces` makes them one trace, as :mod:`profkit.traces.ranks` does for
per-rank Chrome traces:

- **Ranks.** Within an export the processes that ran GPU work are numbered in (GPU, pid)
  order, as for one node; the nodes follow each other in the order they were given, so
  node *k*'s local rank *r* is global rank ``ranks before it + r`` (torchrun's numbering
  when the files are given in node-rank order). Pids of different hosts can be equal, so
  every process gets a key of its own in the merged thread ids (``process`` in
  ``meta["ranks"]``; ``pid`` stays the real one), and every node's GPUs are numbered apart
  in the merged activities (``device`` in ``meta["ranks"]`` stays the node's own index).
- **Clocks.** Each export counts time from its own session start, whose UTC time it
  records (``TARGET_INFO_SESSION_START_TIME``): nodes are first put on the first node's
  clock by those start times. What is left is the hosts' clock offset (NTP leaves tens of
  µs to ms). The ends of one collective meet on every rank to a few µs, so the offset is
  estimated from the NCCL kernels' ends (:func:`estimate_offset`) and, where it is larger
  than what those ends can resolve, taken out. ``meta["nodes"]`` says, per node, what was
  found and whether it was applied.

:func:`is_node_set` tells such a set from exports to compare: all nsys exports with NCCL
kernels, captured at overlapping wall-clock times, no process given twice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.comm import is_nccl
from profkit.analysis.ranks import kernel_processes, rank_processes
from profkit.traces.schema import (
    KERNEL_COLUMNS,
    PROCESS_MASK,
    PROCESS_SHIFT,
    RANGE_COLUMNS,
    THREAD_MASK,
    Trace,
    conform,
)

FORMAT = "nsys-sqlite"
DEVICE_STRIDE = 1 << 10
"""Merged device numbers: node *k*'s GPU *d* is ``k * DEVICE_STRIDE + d``."""
MIN_PAIRS = 3  # matched collectives an offset estimate needs
MIN_APPLIED_NS = 50_000
"""Offsets below this (and below :data:`SPREAD_FACTOR` spreads) are left alone: one
collective's ends on two ranks differ by up to ~20 µs on one host, so a smaller estimate
cannot be told from that."""
SPREAD_FACTOR = 5


@dataclass(frozen=True)
class NodeClock:
    """How a node's times were put on the first node's clock (ms): the session starts'
    difference (``base_ms``), then the offset its collectives show (``offset_ms``: the
    median of its NCCL kernel ends minus the first node's, over ``pairs`` collectives,
    ``spread_ms`` their median absolute deviation), ``applied`` where it was taken out."""

    path: str
    host: str | None
    ranks: list[int]
    base_ms: float
    offset_ms: float | None
    spread_ms: float | None
    pairs: int
    applied: bool


def is_node_set(traces: list[Trace]) -> bool:
    """Whether these traces are the nodes of one job (see the module doc)."""
    if len(traces) < 2 or any(t.meta.get("format") != FORMAT for t in traces):
        return False
    windows = []
    seen: set[tuple[Any, int]] = set()
    for trace in traces:
        start = trace.meta.get("session_start_utc_ns")
        nccl = _nccl(trace.kernels)
        if start is None or not nccl.any() or trace.kernels.empty:
            return False
        k = trace.kernels
        windows.append((start + int(k["start"].min()), start + int(k["end"].max())))
        for pid in _gpu_pids(trace):
            if (trace.meta.get("host"), pid) in seen:
                return False  # the same process twice: one capture given twice
            seen.add((trace.meta.get("host"), pid))
    return max(w[0] for w in windows) < min(w[1] for w in windows)


def merge_node_traces(traces: list[Trace]) -> Trace:
    """One Trace of every node's activities and ranges, on the first node's clock, with
    ``meta["ranks"]`` in global rank order and ``meta["nodes"]`` (:class:`NodeClock`)."""
    kernels: list[pd.DataFrame] = []
    ranges: list[pd.DataFrame] = []
    ranks: list[dict[str, Any]] = []
    clocks: list[NodeClock] = []
    threads: dict[int, str] = {}
    reference = _no_ends()
    next_key = 1
    for node, trace in enumerate(traces):
        meta = trace.meta
        local = rank_processes(trace, kernel_processes(trace))
        # Every process its own key, the ranks' first (in rank order), after the last node's.
        keys = {int(info["pid"]): 0 for info in local}
        k, r = trace.kernels.copy(), trace.ranges.copy()
        for pid in _pids(k["launch_thread"]).tolist() + _pids(r["thread"]).tolist():
            keys.setdefault(int(pid), 0)
        keys = {pid: next_key + i for i, pid in enumerate(keys)}
        next_key += len(keys)
        ends = _nccl_ends(trace, local[0]["pid"]) if local else _no_ends()
        if node == 0:
            reference = ends
        numbered = list(range(len(ranks), len(ranks) + len(local)))
        clock, shift = _clock(traces[0].meta, meta, reference, ends, numbered, node == 0)
        for column in ("start", "end", "launch_start"):
            k[column] = k[column] + shift
        r["start"], r["end"] = r["start"] + shift, r["end"] + shift
        k["launch_thread"] = _rekeyed(k["launch_thread"], keys)
        r["thread"] = _rekeyed(r["thread"], keys)
        k["device"] = k["device"] + node * DEVICE_STRIDE
        for info, rank in zip(local, numbered, strict=True):
            ranks.append({**info, "rank": rank, "process": keys[int(info["pid"])],
                          "host": meta.get("host"), "path": meta.get("path")})  # fmt: skip
        clocks.append(clock)
        for tid, name in (meta.get("thread_names") or {}).items():
            pid = (int(tid) >> PROCESS_SHIFT) & PROCESS_MASK
            if pid in keys:
                threads[(keys[pid] << PROCESS_SHIFT) | (int(tid) & THREAD_MASK)] = name
        kernels.append(k)
        ranges.append(r)
    for info in ranks:
        info["world_size"] = len(ranks)
    nodes = [asdict(c) for c in clocks]
    first = traces[0].meta
    meta = {
        **{key: v for key, v in first.items() if key not in ("thread_names", "warnings")},
        "path": ", ".join(_path(t.meta) for t in traces),
        "paths": [t.meta.get("path") for t in traces],
        "thread_names": threads,
        "ranks": ranks,
        "nodes": nodes,
        "warnings": _warnings(traces, nodes),
    }
    return Trace(
        kernels=conform(pd.concat(kernels, ignore_index=True), KERNEL_COLUMNS),
        ranges=conform(pd.concat(ranges, ignore_index=True), RANGE_COLUMNS),
        meta=meta,
    )


def _clock(
    first: dict[str, Any],
    meta: dict[str, Any],
    reference: tuple[np.ndarray, np.ndarray],
    ends: tuple[np.ndarray, np.ndarray],
    ranks: list[int],
    is_first: bool,
) -> tuple[NodeClock, int]:
    """A node's :class:`NodeClock`, and the ns to add to its times to put them on the first
    node's clock (``reference``: the first node's NCCL ends, ``ends``: this node's)."""
    base = int(meta["session_start_utc_ns"]) - int(first["session_start_utc_ns"])
    if is_first:
        return NodeClock(_path(meta), meta.get("host"), ranks, 0.0, None, None, 0, False), 0
    offset, spread, pairs = estimate_offset(reference, (ends[0], ends[1] + base))
    applied = offset is not None and _resolved(offset, spread)
    clock = NodeClock(
        _path(meta), meta.get("host"), ranks, base / 1e6,
        None if offset is None else offset / 1e6, None if spread is None else spread / 1e6,
        pairs, applied,
    )  # fmt: skip
    return clock, base - (offset if applied and offset is not None else 0)


def estimate_offset(
    reference: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray]
) -> tuple[int | None, int | None, int]:
    """How far ``other``'s clock runs ahead of ``reference``'s, in ns, from one rank's NCCL
    kernels on each: ``(names, end times)`` in launch order. Every rank runs a
    communicator's collectives in the same order, but the two captures may start at
    different collectives, so each shift of one sequence against the other is tried; a
    shift counts where at least half the shorter sequence pairs kernels of the same name.
    Of the shifts whose end differences agree best (median absolute deviation within twice
    the least), the one with the smallest offset is taken: the session starts already put
    the clocks within NTP's error, far less than a step, so a shift by whole steps (which
    repeat the same collectives) shows as an offset of a step. Returns (offset, spread,
    pairs), (None, None, 0) where no shift pairs enough."""
    codes = pd.factorize(np.concatenate([reference[0], other[0]]))[0]
    ref_name, name = codes[: len(reference[0])], codes[len(reference[0]) :]
    ref_end, end = reference[1], other[1]
    shorter = min(len(ref_end), len(end))
    found = []
    for shift in range(-(len(end) - 1), len(ref_end)):
        lo, hi = max(0, shift), min(len(ref_end), len(end) + shift)
        if hi - lo < max(MIN_PAIRS, (shorter + 1) // 2):
            continue
        same = ref_name[lo:hi] == name[lo - shift : hi - shift]
        if same.sum() < max(MIN_PAIRS, (shorter + 1) // 2):
            continue
        diff = end[lo - shift : hi - shift][same] - ref_end[lo:hi][same]
        median = int(np.median(diff))
        found.append((float(np.median(np.abs(diff - median))), median, int(same.sum())))
    if not found:
        return None, None, 0
    best = min(spread for spread, _, _ in found)
    spread, offset, pairs = min(
        (f for f in found if f[0] <= 2 * best + 1), key=lambda f: (abs(f[1]), f[0])
    )
    return offset, int(spread), pairs


def _resolved(offset: int, spread: int | None) -> bool:
    """Whether an offset is larger than the collectives' ends can be told apart by."""
    return abs(offset) > max(MIN_APPLIED_NS, SPREAD_FACTOR * (spread or 0))


def _nccl(kernels: pd.DataFrame) -> np.ndarray:
    is_kernel = kernels["kind"].to_numpy(dtype=object) == "kernel"
    return is_kernel & is_nccl(kernels["name"])


def _nccl_ends(trace: Trace, pid: int) -> tuple[np.ndarray, np.ndarray]:
    """One process's NCCL kernels in launch order: names and end times."""
    k = trace.kernels
    thread = k["launch_thread"].to_numpy(dtype=np.int64, na_value=-1)
    mine = _nccl(k) & (thread >= 0) & (((thread >> PROCESS_SHIFT) & PROCESS_MASK) == pid)
    rows = k[mine].sort_values(["launch_start", "start"], kind="stable")
    return rows["name"].to_numpy(dtype=object), rows["end"].to_numpy(np.int64)


def _no_ends() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=object), np.zeros(0, np.int64)


def _gpu_pids(trace: Trace) -> set[int]:
    return set(_pids(trace.kernels["launch_thread"]).tolist())


def _pids(threads: pd.Series) -> np.ndarray:
    values = threads.to_numpy(dtype=np.int64, na_value=-1)
    return np.unique((values[values >= 0] >> PROCESS_SHIFT) & PROCESS_MASK)


def _rekeyed(threads: pd.Series, keys: dict[int, int]) -> pd.Series:
    """Thread ids with their process bits replaced by the process's merged key (NA kept)."""
    values = threads.to_numpy(dtype=np.int64, na_value=-1)
    known = values >= 0
    pids = np.array(sorted(keys), dtype=np.int64)  # every process of the node is a key
    to = np.array([keys[p] for p in pids.tolist()], dtype=np.int64)
    key = to[np.searchsorted(pids, (values[known] >> PROCESS_SHIFT) & PROCESS_MASK)]
    out = values.copy()
    out[known] = (key << PROCESS_SHIFT) | (values[known] & THREAD_MASK)
    return pd.Series(out, index=threads.index).where(known, pd.NA).astype(threads.dtype)


def _path(meta: dict[str, Any]) -> str:
    return Path(str(meta.get("path"))).name


def _warnings(traces: list[Trace], clocks: list[dict[str, Any]]) -> list[str]:
    """Each node's warnings (named by its file), then what the clocks showed."""
    said: list[str] = []
    for trace in traces:
        name = _path(trace.meta)
        said += [f"{name}: {w}" for w in trace.meta.get("warnings") or []]
    first = clocks[0]["path"]
    for clock in clocks[1:]:
        if clock["offset_ms"] is None:
            said.append(
                f"{clock['path']}: no run of NCCL kernels pairs with {first}'s, so its clock "
                "offset is unknown: times across nodes are as the session starts put them"
            )
        elif clock["applied"]:
            said.append(
                f"{clock['path']}: its clock ran {clock['offset_ms']:+.3f} ms from {first}'s "
                f"(the ends of {clock['pairs']} collectives, spread {clock['spread_ms']:.3f} "
                "ms): taken out"
            )
    return said
