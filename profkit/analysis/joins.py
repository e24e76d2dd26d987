"""Several files' compact columns joined as one job: the per-rank traces of one run, the
nodes' exports of one job.

torch.profiler writes one Chrome trace per rank; a job of several nodes leaves one nsys
export per node, each holding that node's ranks on that host's clock. Both are joined here
into one set of :class:`ActivityColumns` (each file read once, through the columnar cache,
with its activities' GPU starts and devices: :data:`profkit.traces.columns.TIMED`), so a
job of many files and millions of kernels is read in the memory its columns take, and its
ranked report comes from the one analysis of columns (:func:`.engine.analyze_columns`):

- **Per-rank traces** (:func:`merge_rank_columns`): what makes the traces one run, their
  order, each rank's process key in the joined thread ids and the joined meta are
  :func:`profkit.traces.ranks.rank_set`'s; every activity of a per-rank trace is that
  rank's, launched or not. Where the traces name several hosts, each further host's clock
  is put on the first's (:func:`.clocks.host_clocks`).
- **Nodes** (:func:`merge_node_columns`): each node's ranks are numbered as
  :func:`.rank_layout.ranks_of` numbers one export's, the nodes one after the other in the
  order given (torchrun's numbering when the files are given in node-rank order); every
  process gets a key of its own in the joined thread ids (pids of two hosts can be equal),
  and every node's GPUs are numbered after the nodes' before it; the report shows each
  rank's real pid, host and GPU. Each node's times are put on the first node's clock by
  the session starts, then by the offset its first rank's NCCL kernel ends show
  (:mod:`.clocks`). A node of one GPU is one rank.

What the columns cannot hold is refused with one line: a trace whose device ordinals do
not fit their 16 bits (it keeps no start times), more launching threads or GPUs than
their 16-bit codes hold.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.clocks import (
    NodeClock,
    clock_notes,
    host_clocks,
    lifted,
    no_ends,
    node_clock,
)
from profkit.analysis.engine import analyze_columns
from profkit.analysis.phase_marks import PhaseRanges
from profkit.analysis.phase_ranges import PhaseMode
from profkit.analysis.rank_layout import Layout, ranks_of
from profkit.analysis.report_types import RankedReport
from profkit.errors import BadInput
from profkit.traces.columns import (
    DEVICE,
    DEVICE_LIMIT,
    NO_SHAPE,
    SHAPE,
    START,
    ActivityColumns,
    ShapeReader,
    check_threads,
)
from profkit.traces.job import (
    NSYS_FORMAT,
    FileFacts,
    file_facts,
    nccl_name_codes,
    path_labels,
    process_ids,
    rank_infos,
)
from profkit.traces.ranks import process_key, rank_set, rank_thread_ids
from profkit.traces.schema import MAX_SPAN_NS, PROCESS_MASK, PROCESS_SHIFT, THREAD_MASK

ARRAYS = ("name", "duration", "launch_start", "launch_thread", START, DEVICE)


@dataclass
class JoinFacts:
    """What joining a file into a job needs of its activities (:func:`join_facts`); the
    rest of a join is its names, threads, ranges and meta. A client that holds no activity
    (a read on Dask workers) joins the files from these: its joined columns then hold the
    job's names, threads, ranges and meta, and no activity."""

    file: FileFacts | None
    """What tells the job's kind (where asked for: a client that holds no activity)."""
    timed: bool
    """Its columns keep GPU starts."""
    ranks: list[dict[str, Any]] | None
    """An export's ranks (:func:`.rank_layout.ranks_of` of it alone, as a node); None for
    a per-rank trace, or an export without GPU activity."""
    nccl_ends: tuple[np.ndarray, np.ndarray]
    """Its first rank's NCCL kernels (an export's), or its process's (a per-rank trace's),
    in launch order: names and end times (:func:`nccl_ends`)."""
    max_device: int
    span: list[tuple[int, int]]
    """Its known launches', GPU activities' and ranges' first and last times."""


def join_facts(cols: ActivityColumns, with_file: bool = False) -> JoinFacts:
    """A file's :class:`JoinFacts`, from its columns (read with their GPU starts);
    ``with_file``: with what tells the job's kind (:func:`~profkit.traces.job.file_facts`)."""
    timed = START in cols.arrays
    export = cols.meta.get("format") == NSYS_FORMAT
    layout = ranks_of(cols, fewest=1) if export and timed else None
    if timed:
        cols.load(list(ARRAYS))
    pid = int(layout.info[0]["pid"]) if layout is not None else None
    ends = nccl_ends(cols, pid) if timed and (pid is not None or not export) else no_ends()
    device = int(cols.arrays[DEVICE].max(initial=0)) if DEVICE in cols.arrays else 0
    return JoinFacts(
        file_facts(cols) if with_file else None, timed,
        None if layout is None else layout.info, ends, device,
        _span(cols),
    )  # fmt: skip


def _file(facts: JoinFacts) -> FileFacts:
    if facts.file is None:
        raise ValueError("a join without the columns' activities needs their file facts")
    return facts.file


def merge_rank_columns(
    columns: list[ActivityColumns], consume: bool = False
) -> tuple[ActivityColumns, Layout]:
    """The per-rank traces' columns as one multi-process set, and its ranks (each info's
    ``pid`` the rank's process key in the merged thread ids; ``meta["ranks"]`` has the real
    ones): :func:`merge_ranks` without the traces' order and clock shifts."""
    merged, layout, _, _ = merge_ranks(columns, consume)
    return merged, layout


def merge_ranks(
    columns: list[ActivityColumns],
    consume: bool = False,
    facts: list[JoinFacts] | None = None,
    activities: bool = True,
) -> tuple[ActivityColumns, Layout, list[int], list[int]]:
    """The per-rank traces' columns as one multi-process set, its ranks (see
    :func:`merge_rank_columns`), the traces' order in it (rank order: indexes of
    ``columns``) and each one's shift onto the job's clock (ns, in that order).

    Raises :class:`~profkit.errors.BadInput` where they cannot be the ranks of one run, with
    :func:`~profkit.traces.ranks.rank_set`'s words, or where the columns cannot
    hold them (see the module doc). ``consume``: each trace's arrays are given up as they
    are copied into the merged ones. ``facts``: the traces' (:func:`join_facts`; else
    found in their columns); without ``activities`` (their columns hold none) the merged
    ones hold none either.
    """
    infos = rank_infos(columns) if facts is None else [_file(f).rank for f in facts]
    ranked = rank_set([c.meta for c in columns], infos)
    for i, cols in enumerate(columns):
        if not (START in cols.arrays if facts is None else facts[i].timed):
            raise BadInput(
                f"{cols.meta.get('path')}: device ordinals beyond {DEVICE_LIMIT:,}: its GPU "
                "activity cannot be joined to the other ranks'"
            )
    check_threads(sum(len(c.threads) for c in columns))
    if activities:
        for cols in columns:
            cols.load(list(ARRAYS))
    labels = path_labels([str(c.meta.get("path")) for c in columns])
    known = [info or {} for info in infos]
    ends = (lambda i: nccl_ends(columns[i])) if facts is None else (lambda i: facts[i].nccl_ends)
    hosts = host_clocks(known, labels, ends)
    ordered = [columns[i] for i in ranked.order]
    shifts = [hosts.shifts[i] if hosts else 0 for i in ranked.order]
    range_counts = [len(c.ranges) for c in ordered]
    rekeys = [
        functools.partial(rank_thread_ids, process=process_key(info)) for info in ranked.ranks
    ]
    kept = _kept_known(ordered, shifts)
    counts = [len(c) for c in ordered]  # before a join gives their arrays up
    spans = [_span(c) for c in ordered] if facts is None else [facts[i].span for i in ranked.order]
    _check_joined_span(spans, kept, ordered)
    if activities:
        read_shapes = shapes_of(ordered)
        merged = joined_columns(ordered, rekeys, kept, 0, consume)
    else:  # no activity: the traces' names, threads and ranges
        read_shapes = None
        merged = joined_tables(ordered, rekeys, kept)
    meta = ranked.meta
    if hosts is not None:
        meta["nodes"] = hosts.nodes
        meta["warnings"] = list(meta["warnings"]) + clock_notes(hosts.nodes)
    merged.meta, merged.read_shapes = meta, read_shapes
    layout = Layout(
        info=[{**info, "pid": process_key(info)} for info in ranked.ranks],
        rank=np.repeat(np.arange(len(ordered), dtype=np.int16), counts),
        range_rank=np.repeat(np.arange(len(ordered), dtype=np.int64), range_counts),
    )
    return merged, layout, list(ranked.order), kept


def analyze_rank_file_columns(
    columns: list[ActivityColumns],
    top: int = 20,
    phase: str | None = None,
    range_: str | None = None,
    rank: int | None = None,
    consume: bool = False,
    phases: PhaseMode = "auto",
    phase_ranges: PhaseRanges | None = None,
) -> RankedReport:
    """The ranked report of per-rank traces of one run from their columns, ranks without
    GPU activity included (a CPU run's traces: their phases' CPU time, no kernels).
    ``consume``: as for :func:`merge_rank_columns`; ``phases``: where phases come from
    (auto, annotated, inferred)."""
    cols, layout = merge_rank_columns(columns, consume)
    report = analyze_columns(
        cols, top, phase, range_, phases=phases, layout=layout, rank=rank, phase_ranges=phase_ranges
    )
    assert isinstance(report, RankedReport)  # a layout gives one
    as_job_of_rank_files(report, cols.meta)
    return report


def as_job_of_rank_files(report: RankedReport, meta: dict[str, Any]) -> None:
    """The ranked report of merged per-rank traces (``meta``: the merged columns') told who
    its ranks are: each one's real pid, host and GPU (the layout's pid was its merged
    process key), and the hosts' clocks."""
    real = {int(info["rank"]): info for info in meta["ranks"]}
    for entry in report.ranks:
        entry.info = dict(real[int(entry.info["rank"])])
    report.every_rank = [dict(real[int(info["rank"])]) for info in report.every_rank]
    report.nodes = list(meta.get("nodes") or [])


def _kept_known(columns: list[ActivityColumns], shifts: list[int]) -> list[int]:
    """The shifts, all raised by one amount where one would move a known launch below 0
    (an unknown launch reads as a negative time): Chrome traces count from the epoch, so
    only a trace near its clock's 0 (a hand-made one) is raised."""
    lows = [
        bounds[0] + shift
        for cols, shift in zip(columns, shifts, strict=True)
        if (bounds := cols.launch_bounds()) is not None
    ]
    lift = max(0, -min(lows, default=0))
    return [shift + lift for shift in shifts]


def analyze_node_columns(
    nodes: list[ActivityColumns],
    top: int = 20,
    phase: str | None = None,
    range_: str | None = None,
    rank: int | None = None,
    consume: bool = False,
    phases: PhaseMode = "auto",
    phase_ranges: PhaseRanges | None = None,
) -> RankedReport:
    """The ranked report of the nodes of one job (:func:`profkit.traces.job.why_not_one_job`
    says they are) from their columns, each read with its GPU starts. ``consume``: the
    nodes' arrays are given up as they are merged (:func:`merge_node_columns`); ``phases``:
    where phases come from (auto, annotated, inferred)."""
    cols, layout, real = merge_node_columns(nodes, consume)
    report = analyze_columns(
        cols, top, phase, range_, phases=phases, layout=layout, rank=rank, phase_ranges=phase_ranges
    )
    assert isinstance(report, RankedReport)  # a layout gives one
    as_job_of_nodes(report, real, cols.meta["nodes"])
    return report


def as_job_of_nodes(
    report: RankedReport, real: list[dict[str, Any]], nodes: list[dict[str, Any]]
) -> None:
    """The ranked report of merged nodes told who its ranks are: each shown rank's and
    every rank's (``--rank`` or not: findings read them) real pid, host and GPU, and the
    nodes (their clocks)."""
    real_ids([e.info for e in report.ranks], real)
    real_ids(report.every_rank, real)
    report.nodes = list(nodes)


def real_ids(infos: list[dict[str, Any]], real: list[dict[str, Any]]) -> None:
    """Ranks' infos given their real pid, host and GPU (:func:`merge_nodes`' ``real``): the
    merged process keys gave the analysis its processes."""
    for info in infos:
        info.update(real[info["rank"]])


def merge_node_columns(
    nodes: list[ActivityColumns], consume: bool = False, facts: list[JoinFacts] | None = None
) -> tuple[ActivityColumns, Layout, list[dict[str, Any]]]:
    """:func:`merge_nodes` without the nodes' clock shifts."""
    merged, layout, real, _ = merge_nodes(nodes, consume, facts)
    return merged, layout, real


def merge_nodes(
    nodes: list[ActivityColumns],
    consume: bool = False,
    facts: list[JoinFacts] | None = None,
    activities: bool = True,
) -> tuple[ActivityColumns, Layout, list[dict[str, Any]], list[int]]:
    """The nodes' columns as one export's, its ranks, and each rank's real pid, host and
    GPU (the layout's ``pid`` is its merged process key). ``consume``: each node's arrays
    are given up as soon as they are copied into the merged ones (the node keeps only what
    reads its shapes), so memory holds them about once; the nodes' columns are of no
    further use then; and each node's shift onto the job's clock (ns, added to its times).
    Raises :class:`~profkit.errors.BadInput` where the merged codes would not fit their 16
    bits (GPUs, launching threads). ``facts``: the nodes' (:func:`join_facts`; else found
    in their columns); without ``activities`` (their columns hold none) the merged ones
    hold none either, and the layout no activity's rank."""
    if facts is None:
        facts = [join_facts(cols) for cols in nodes]
    layouts: list[list[dict[str, Any]]] = []
    for cols, found in zip(nodes, facts, strict=True):
        if not found.timed:
            raise ValueError(f"{cols.meta.get('path')}: a node's columns need its GPU starts")
        if found.ranks is None:  # a node of one GPU is one rank
            raise BadInput(f"{cols.meta.get('path')}: no GPU activity, so no rank of a job")
        layouts.append(found.ranks)
    # GPUs numbered apart, node after node (ranks_of orders ranks by GPU), in 16 bits.
    stride = max(f.max_device for f in facts) + 1
    if len(nodes) * stride > DEVICE_LIMIT:
        raise BadInput(
            f"{len(nodes)} nodes of up to {stride} GPUs each: profkit numbers at most "
            f"{DEVICE_LIMIT:,} GPUs in one job"
        )
    check_threads(sum(len(c.threads) for c in nodes))
    labels = path_labels([str(c.meta.get("path")) for c in nodes])
    first = nodes[0].meta
    reference = no_ends()
    clocks: list[NodeClock] = []
    shifts: list[int] = []
    keys_of: list[dict[int, int]] = []
    real: list[dict[str, Any]] = []
    next_key = 1
    for node, (cols, ranks) in enumerate(zip(nodes, layouts, strict=True)):
        meta = cols.meta
        pids = [int(info["pid"]) for info in ranks]
        threads = np.asarray(cols.threads, np.int64)
        pids += (
            process_ids(threads).tolist() + process_ids(cols.ranges["thread"].to_numpy()).tolist()
        )
        keys = {pid: next_key + i for i, pid in enumerate(dict.fromkeys(pids))}
        next_key += len(keys)
        ends = facts[node].nccl_ends
        if node == 0:
            reference = ends
        numbered = list(range(len(real), len(real) + len(ranks)))
        clock, shift = node_clock(labels[node], first, meta, reference, ends, numbered, node == 0)
        clocks.append(clock)
        shifts.append(shift)
        keys_of.append(keys)
        for info in ranks:
            real.append({"pid": info["pid"], "host": meta.get("host"), "device": info["device"],
                         "process": keys[int(info["pid"])]})  # fmt: skip
    nodes_json = [asdict(c) for c in clocks]
    meta = {
        **{key: v for key, v in first.items() if key not in ("thread_names", "warnings")},
        "path": ", ".join(labels),
        "paths": [c.meta.get("path") for c in nodes],
        "thread_names": merged_thread_names([c.meta for c in nodes], keys_of),
        "nodes": nodes_json,
        "warnings": warnings_of([c.meta for c in nodes], labels, nodes_json),
    }
    rekeys = [functools.partial(rekeyed_ids, keys=keys) for keys in keys_of]
    shifts = lifted(shifts)
    _check_joined_span([f.span for f in facts], shifts, nodes)  # each node's found once
    if activities:
        read_shapes: ShapeReader | None = shapes_of(nodes)
        merged = joined_columns(nodes, rekeys, shifts, stride, consume)
    else:  # no activity: the nodes' names, threads and ranges
        read_shapes = None
        merged = joined_tables(nodes, rekeys, shifts)
    merged.meta, merged.read_shapes = meta, read_shapes
    layout = ranks_of(merged, fewest=1) if activities else _node_layout(layouts, real, stride)
    # Each node's ranks keep their order: GPUs apart node by node, keys in rank order.
    assert layout is not None and [i["pid"] for i in layout.info] == [r["process"] for r in real]
    for info in layout.info:
        info["world_size"] = len(real)
    return merged, layout, real, shifts


def _node_layout(
    nodes: list[list[dict[str, Any]]], real: list[dict[str, Any]], stride: int
) -> Layout:
    """The joined nodes' ranks as :func:`.rank_layout.ranks_of` finds them in joined columns
    (their GPUs numbered apart node by node, their pids the merged process keys), without
    any activity's rank: the nodes' ranks one after the other."""
    info: list[dict[str, Any]] = []
    for node, ranks in enumerate(nodes):
        for own in ranks:
            r = len(info)
            info.append({"rank": r, "world_size": len(real), "device": own["device"] + node * stride,
                         "pid": real[r]["process"], "host": nodes[0][0].get("host")})  # fmt: skip
    return Layout(info, np.zeros(0, np.int16), np.zeros(0, np.int64))


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
    unknown), and its GPUs are numbered after ``i * stride`` (0: kept as they are). The
    caller has checked the joined span (:func:`_check_joined_span`).
    """
    joined = joined_tables(nodes, rekeys, shifts)
    code_of = {n: i for i, n in enumerate(joined.names)}
    total = sum(len(c) for c in nodes)
    arrays = {name: np.empty(total, dtype=nodes[0].arrays[name].dtype) for name in ARRAYS}
    at = before = 0  # activities, launching threads of the traces before
    for node, (cols, shift) in enumerate(zip(nodes, shifts, strict=True)):
        code = np.array([code_of[n] for n in cols.names], dtype=np.int32)
        rows = slice(at, at + len(cols))
        a = cols.arrays
        launch, thread = a["launch_start"], a["launch_thread"]
        arrays["name"][rows] = code[a["name"]]
        arrays["duration"][rows] = a["duration"]
        arrays["launch_start"][rows] = np.where(launch >= 0, launch + shift, launch)
        arrays["launch_thread"][rows] = np.where(thread >= 0, thread + before, thread)
        arrays[START][rows] = a[START] + shift
        arrays[DEVICE][rows] = a[DEVICE].astype(np.int32) + node * stride  # GPUs apart
        at += len(cols)
        before += len(cols.threads)
        if consume:  # copied: free the node's arrays (what reads its shapes stays)
            cols.arrays = {SHAPE: a[SHAPE]} if SHAPE in a else {}
    joined.arrays = arrays
    return joined


def joined_tables(
    files: list[ActivityColumns],
    rekeys: Sequence[Callable[[np.ndarray], np.ndarray]],
    shifts: list[int],
) -> ActivityColumns:
    """:func:`joined_columns` without any activity: the traces' names (in the order first
    seen), launching threads and ranges, joined (no check of their span)."""
    names: dict[str, int] = {}
    kinds: list[str] = []
    threads: list[np.ndarray] = []
    ranges: list[pd.DataFrame] = []
    range_shift: list[np.ndarray] = []
    range_thread: list[np.ndarray] = []
    for cols, rekey, shift in zip(files, rekeys, shifts, strict=True):
        known = len(names)  # the names first seen in this trace, in their order
        for n, k in zip(cols.names, cols.kinds, strict=True):
            if names.setdefault(n, len(names)) >= known:
                kinds.append(k)
        threads.append(rekey(np.asarray(cols.threads, dtype=np.int64)))
        ranges.append(cols.ranges)  # moved and rekeyed once joined: a frame's edits cost ms
        range_shift.append(np.full(len(cols.ranges), shift, dtype=np.int64))
        range_thread.append(rekey(cols.ranges["thread"].to_numpy(np.int64)))
    joined = pd.concat(ranges, ignore_index=True)
    if len(joined):
        moved = np.concatenate(range_shift)
        joined["start"] = joined["start"].to_numpy() + moved
        joined["end"] = joined["end"].to_numpy() + moved
        joined["thread"] = np.concatenate(range_thread)
    return ActivityColumns(
        arrays={}, names=list(names), kinds=kinds, shapes=[], threads=np.concatenate(threads),
        ranges=joined,
    )  # fmt: skip


def _span(cols: ActivityColumns) -> list[tuple[int, int]]:
    """A file's known launches', GPU activities' and ranges' first and last times."""
    a = cols.arrays
    bounds = [cols.launch_bounds()]
    if len(cols) and START in a:
        end = a[START] + a["duration"]
        bounds.append((int(a[START].min()), int(end.max())))
    if len(cols.ranges):
        r = cols.ranges
        bounds.append((int(r["start"].min()), int(r["end"].max())))
    return [b for b in bounds if b is not None]


def _check_joined_span(
    spans: list[list[tuple[int, int]]], shifts: list[int], files: list[ActivityColumns]
) -> None:
    """The one check of a join's span: every file's launches, GPU times and ranges
    (``spans``, :func:`_span`) moved by its shift, within ``MAX_SPAN_NS`` of each other
    (each file alone may be fine: clocks a lifetime apart are not one job)."""
    lows, highs = [], []
    for bounds, shift in zip(spans, shifts, strict=True):
        for low, high in bounds:
            lows.append(low + shift)
            highs.append(high + shift)
    if lows and max(highs) - min(lows) > MAX_SPAN_NS:
        days = (max(highs) - min(lows)) / 86_400e9
        names = ", ".join(path_labels([str(c.meta.get("path")) for c in files]))
        raise BadInput(
            f"{names}: joined on one clock their times span {days:,.0f} days, so they are "
            "not the traces of one job (a damaged clock or timestamp in one of them)"
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


def nccl_ends(cols: ActivityColumns, pid: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Process ``pid``'s NCCL kernels in launch order: names and end times (``pid`` None:
    the columns are one process's, a per-rank trace's); the columns keep start times."""
    a = cols.arrays
    thread = cols.launch_threads(a["launch_thread"])
    mine = nccl_name_codes(cols)[a["name"]] & (thread >= 0)
    if pid is not None:
        mine &= ((thread >> PROCESS_SHIFT) & PROCESS_MASK) == pid
    rows = np.flatnonzero(mine)
    order = np.lexsort((a[START][rows], a["launch_start"][rows]))  # stable: launch, then start
    rows = rows[order]
    names = np.array(cols.names, dtype=object)[a["name"][rows]]
    return names, a[START][rows] + a["duration"][rows]


def rekeyed_ids(threads: np.ndarray, keys: dict[int, int]) -> np.ndarray:
    """Thread ids with their process bits replaced by the process's merged key (-1 kept;
    every process of the node is a key)."""
    known = threads >= 0
    pids = np.array(sorted(keys), dtype=np.int64)
    to = np.array([keys[p] for p in pids.tolist()], dtype=np.int64)
    key = to[np.searchsorted(pids, (threads[known] >> PROCESS_SHIFT) & PROCESS_MASK)]
    out = threads.copy()
    out[known] = (key << PROCESS_SHIFT) | (threads[known] & THREAD_MASK)
    return out


def merged_thread_names(
    metas: list[dict[str, Any]], keys_of: list[dict[int, int]]
) -> dict[int, str]:
    """The nodes' thread names (``meta["thread_names"]``), by merged thread id."""
    found: dict[int, str] = {}
    for meta, keys in zip(metas, keys_of, strict=True):
        for tid, name in (meta.get("thread_names") or {}).items():
            pid = (int(tid) >> PROCESS_SHIFT) & PROCESS_MASK
            if pid in keys:
                found[(keys[pid] << PROCESS_SHIFT) | (int(tid) & THREAD_MASK)] = name
    return found


def warnings_of(
    metas: list[dict[str, Any]], labels: list[str], clocks: list[dict[str, Any]]
) -> list[str]:
    """Each node's warnings (named by its file), then what the clocks showed."""
    said: list[str] = []
    for meta, label in zip(metas, labels, strict=True):
        said += [f"{label}: {w}" for w in meta.get("warnings") or []]
    return said + clock_notes(clocks)
