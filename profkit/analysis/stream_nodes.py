"""Several nodes' Nsight Systems exports read as one job from their compact columns.

:func:`.nodes.merge_node_traces` joins the nodes' full tables (twelve columns an activity,
text included); :func:`merge_node_columns` joins their :class:`ActivityColumns` (a few bytes
an activity, each node's read chunk by chunk and through the cache), so a job of many nodes
and millions of kernels is read in the memory its columns take, and its ranked report comes
from the streaming analysis (:func:`.stream_ranks.analyze_rank_columns`). The merge is the
same as the full tables':

- each node's ranks are numbered as :func:`.stream_ranks.ranks_of` numbers one export's,
  the nodes one after the other in the order given;
- every process gets a key of its own in the merged thread ids (pids of two hosts can be
  equal), the ranks' first in rank order, and every node's GPUs are numbered after the
  nodes' before it; the report shows each rank's real pid, host and GPU;
- each node's times are put on the first node's clock by the session starts, then by the
  offset its first rank's NCCL kernel ends show (:func:`.nodes.estimate_offset`).

:func:`analyze_node_columns` gives the report, or None where the columns cannot: a node of
one process (its columns keep no start times), a node whose ranks a tie would decide, or
more threads or GPUs than the columns' 16-bit codes hold. The caller then reads the full
tables, as for anything :func:`.stream_ranks.ranks_of` leaves to them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.comm import is_nccl
from profkit.analysis.nodes import (
    NodeClock,
    NodeFacts,
    _clock,
    _no_ends,
    _warnings_of,
    lifted,
    merged_thread_names,
    path_labels,
    process_ids,
    rekeyed_ids,
)
from profkit.analysis.ranks import RankedReport
from profkit.analysis.stream_rank_tables import NotStreamable
from profkit.analysis.stream_ranks import Layout, analyze_rank_columns, ranks_of
from profkit.traces.columns import (
    DEVICE,
    MAX_THREADS,
    NO_SHAPE,
    SHAPE,
    START,
    ActivityColumns,
    ShapeReader,
)
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT

ARRAYS = ("name", "duration", "launch_start", "launch_thread", START, DEVICE)
DEVICE_LIMIT = np.iinfo(np.int16).max


def node_facts(cols: ActivityColumns) -> NodeFacts | None:
    """:class:`.nodes.NodeFacts` of one export's columns; None for columns without start
    times (one process's: its capture window is not in them)."""
    meta = cols.meta
    if START not in cols.arrays:
        return None
    cols.load([*ARRAYS[:4], START])
    start = meta.get("session_start_utc_ns")
    return NodeFacts(
        str(meta.get("path")), meta.get("format") == "nsys-sqlite", meta.get("host"),
        None if start is None else int(start), sorted(process_ids(_launching(cols)).tolist()),
        bool(_nccl_names(cols).any()), _window(cols),
    )  # fmt: skip


def analyze_node_columns(
    nodes: list[ActivityColumns],
    top: int = 20,
    phase: str | None = None,
    range_: str | None = None,
    rank: int | None = None,
    consume: bool = False,
) -> RankedReport | None:
    """The ranked report of the nodes of one job (:func:`.nodes.why_not_one_job` says
    they are) from their columns; None where the full tables must give it. ``consume``:
    the nodes' arrays are given up as they are merged (:func:`merge_node_columns`)."""
    merged = merge_node_columns(nodes, consume)
    if merged is None:
        return None
    cols, layout, real = merged
    try:
        report = analyze_rank_columns(cols, layout, top, phase, range_, rank)
    except NotStreamable:
        return None
    for entry in report.ranks:  # the merged keys gave the analysis its processes
        entry.info.update(real[entry.info["rank"]])
    report.nodes = list(cols.meta["nodes"])
    return report


def merge_node_columns(
    nodes: list[ActivityColumns], consume: bool = False
) -> tuple[ActivityColumns, Layout, list[dict[str, Any]]] | None:
    """The nodes' columns as one export's, its ranks, and each rank's real pid, host and
    GPU (the layout's ``pid`` is its merged process key); None where the columns cannot
    be merged (see the module doc). ``consume``: each node's arrays are given up as soon
    as they are copied into the merged ones (the node keeps only what reads its shapes),
    so memory holds them about once; the nodes' columns are of no further use then."""
    layouts = []
    for cols in nodes:
        layout = ranks_of(cols)  # None also for columns without starts, or Chrome ranks
        if layout is None:
            return None
        cols.load(list(ARRAYS))
        layouts.append(layout)
    # GPUs numbered apart, node after node (ranks_of orders ranks by GPU), in 16 bits.
    stride = max(int(c.arrays[DEVICE].max(initial=0)) for c in nodes) + 1
    if len(nodes) * stride > DEVICE_LIMIT:
        return None
    if sum(len(c.threads) for c in nodes) > MAX_THREADS:
        return None
    labels = path_labels([str(c.meta.get("path")) for c in nodes])
    first = nodes[0].meta
    reference = _no_ends()
    clocks: list[NodeClock] = []
    shifts: list[int] = []
    keys_of: list[dict[int, int]] = []
    real: list[dict[str, Any]] = []
    next_key = 1
    for node, (cols, layout) in enumerate(zip(nodes, layouts, strict=True)):
        meta = cols.meta
        pids = [int(info["pid"]) for info in layout.info]
        threads = np.asarray(cols.threads, np.int64)
        pids += (
            process_ids(threads).tolist() + process_ids(cols.ranges["thread"].to_numpy()).tolist()
        )
        keys = {pid: next_key + i for i, pid in enumerate(dict.fromkeys(pids))}
        next_key += len(keys)
        ends = nccl_ends(cols, int(layout.info[0]["pid"]))
        if node == 0:
            reference = ends
        numbered = list(range(len(real), len(real) + len(layout.info)))
        clock, shift = _clock(labels[node], first, meta, reference, ends, numbered, node == 0)
        clocks.append(clock)
        shifts.append(shift)
        keys_of.append(keys)
        for info in layout.info:
            real.append({"pid": info["pid"], "host": meta.get("host"), "device": info["device"],
                         "process": keys[int(info["pid"])]})  # fmt: skip
    nodes_json = [asdict(c) for c in clocks]
    meta = {
        **{key: v for key, v in first.items() if key not in ("thread_names", "warnings")},
        "path": ", ".join(labels),
        "paths": [c.meta.get("path") for c in nodes],
        "thread_names": merged_thread_names([c.meta for c in nodes], keys_of),
        "nodes": nodes_json,
        "warnings": _warnings_of([c.meta for c in nodes], labels, nodes_json),
    }
    read_shapes = shapes_of(nodes)
    rekeys = [functools.partial(rekeyed_ids, keys=keys) for keys in keys_of]
    merged = joined_columns(nodes, rekeys, lifted(shifts), stride, consume)
    merged.meta, merged.read_shapes = meta, read_shapes
    layout = ranks_of(merged)
    if layout is None or [i["pid"] for i in layout.info] != [r["process"] for r in real]:
        return None  # the merged columns would number the ranks otherwise
    for info in layout.info:
        info["world_size"] = len(real)
    return merged, layout, real


def joined_columns(
    nodes: list[ActivityColumns],
    rekeys: Sequence[Callable[[np.ndarray], np.ndarray]],
    shifts: list[int],
    stride: int,
    consume: bool,
) -> ActivityColumns:
    """Several traces' columns (nodes' exports, or per-rank traces) as one: their
    activities, threads and ranges, each trace's written into arrays of the whole length
    (given up after, with ``consume``). ``rekeys[i]`` gives trace *i*'s thread ids their
    merged process keys, ``shifts[i]`` is added to its times (an unknown launch stays
    unknown), and its GPUs are numbered after ``i * stride`` (0: kept as they are)."""
    total = sum(len(c) for c in nodes)
    arrays = {name: np.empty(total, dtype=nodes[0].arrays[name].dtype) for name in ARRAYS}
    names: dict[str, int] = {}
    kinds: list[str] = []
    threads: list[np.ndarray] = []
    ranges: list[pd.DataFrame] = []
    at = 0
    for node, (cols, rekey, shift) in enumerate(zip(nodes, rekeys, shifts, strict=True)):
        code = np.array([names.setdefault(n, len(names)) for n in cols.names], dtype=np.int32)
        known = len(kinds)  # the names first seen in this node, in their order
        kinds += [k for n, k in zip(cols.names, cols.kinds, strict=True) if names[n] >= known]
        rows = slice(at, at + len(cols))
        a = cols.arrays
        launch, thread = a["launch_start"], a["launch_thread"]
        arrays["name"][rows] = code[a["name"]]
        arrays["duration"][rows] = a["duration"]
        arrays["launch_start"][rows] = np.where(launch >= 0, launch + shift, launch)
        before = sum(len(t) for t in threads)  # launch threads coded after the nodes before
        arrays["launch_thread"][rows] = np.where(thread >= 0, thread + before, thread)
        arrays[START][rows] = a[START] + shift
        arrays[DEVICE][rows] = a[DEVICE].astype(np.int32) + node * stride  # GPUs apart
        at += len(cols)
        threads.append(rekey(np.asarray(cols.threads, dtype=np.int64)))
        moved = cols.ranges.copy()
        moved["start"], moved["end"] = moved["start"] + shift, moved["end"] + shift
        moved["thread"] = rekey(moved["thread"].to_numpy(np.int64))
        ranges.append(moved)
        if consume:  # copied: free the node's arrays (what reads its shapes stays)
            cols.arrays = {SHAPE: a[SHAPE]} if SHAPE in a else {}
    return ActivityColumns(
        arrays=arrays,
        names=list(names),
        kinds=kinds,
        shapes=[],
        threads=np.concatenate(threads),
        ranges=pd.concat(ranges, ignore_index=True),
    )


def shapes_of(nodes: list[ActivityColumns]) -> ShapeReader:
    """Shapes of the activities of :func:`joined_columns`: each trace's, asked of its own
    columns."""
    bounds = np.cumsum([0] + [len(c) for c in nodes])

    def read(index: np.ndarray) -> list[tuple[str, str]]:
        shapes = [NO_SHAPE] * len(index)
        node = np.searchsorted(bounds, index, side="right") - 1
        for n, cols in enumerate(nodes):
            at = np.flatnonzero(node == n)
            if len(at):
                found = cols.shapes_at(index[at] - bounds[n])
                for i, shape in zip(at.tolist(), found, strict=True):
                    shapes[i] = shape
        return shapes

    return read


def _launching(cols: ActivityColumns) -> np.ndarray:
    """Global ids of the threads that launched GPU work."""
    return cols.launch_threads(np.unique(cols.arrays["launch_thread"]))


def _nccl_names(cols: ActivityColumns) -> np.ndarray:
    """Per name code: whether it is an NCCL kernel."""
    kernel = np.array([k == "kernel" for k in cols.kinds], dtype=bool)
    return kernel & is_nccl(np.array(cols.names, dtype=object))


def _window(cols: ActivityColumns) -> tuple[int, int]:
    if not len(cols):
        return 0, 0
    start = cols.arrays[START]
    return int(start.min()), int((start + cols.arrays["duration"]).max())


def nccl_ends(cols: ActivityColumns, pid: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Process ``pid``'s NCCL kernels in launch order: names and end times (``pid`` None:
    the columns are one process's, a per-rank trace's); the columns keep start times."""
    a = cols.arrays
    thread = cols.launch_threads(a["launch_thread"])
    mine = _nccl_names(cols)[a["name"]] & (thread >= 0)
    if pid is not None:
        mine &= ((thread >> PROCESS_SHIFT) & PROCESS_MASK) == pid
    rows = np.flatnonzero(mine)
    order = np.lexsort((a[START][rows], a["launch_start"][rows]))  # stable: launch, then start
    rows = rows[order]
    names = np.array(cols.names, dtype=object)[a["name"][rows]]
    return names, a[START][rows] + a["duration"][rows]
