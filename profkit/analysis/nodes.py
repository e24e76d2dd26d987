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

:func:`merge_ranks_of_hosts` does the same for per-rank Chrome traces whose profkit header
names several hosts (they count from the epoch: only the hosts' offset is estimated).

:func:`is_node_set` tells such a set from exports to compare by the loader's rule
(:func:`profkit.traces.job.why_not_one_job`: all nsys exports with NCCL kernels and traced
launches, captured at overlapping wall-clock times, no process given twice), here from the
full tables (:func:`not_one_job` says which condition fails). This module's merges are the
full tables' engine, kept as the tests' reference; commands read nodes as columns
(:mod:`.stream_nodes`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.comm import is_nccl
from profkit.analysis.ranks import kernel_processes, rank_processes
from profkit.traces.job import NodeFacts, path_labels, process_ids, why_not_one_job
from profkit.traces.ranks import merge_rank_traces, rank_info
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
MIN_PAIRS = 8
"""Collectives an offset estimate pairs at the least: with 3 or 4, a pairing off by some
collectives fit as well as the true one in a few windows of the real 2-rank export."""
AGREE_NS = 50_000
"""Pairs whose end difference lies this close to the median agree; one collective's ends
on two ranks of one host differ by up to ~20 µs, so offsets below this are left alone."""
MAX_OFFSET_NS = 1_000_000_000
"""How far from the session starts' alignment an offset is looked for: clocks that NTP
keeps are ms apart; ones a second apart are not synchronised at all."""
ANCHORS = 32  # collectives of the other node whose possible partners give the shifts
TIE = 0.02  # scores this close are a tie
SPREAD_FACTOR = 5


@dataclass(frozen=True)
class NodeClock:
    """How a node's times were put on the first node's clock (ms): the session starts'
    difference (``base_ms``), then the offset its collectives show (:class:`Offset`:
    ``offset_ms``, the median of its NCCL kernel ends minus the first node's over the
    ``agreeing`` of ``pairs`` collectives, ``spread_ms`` their median absolute deviation,
    ``ambiguous``), ``applied`` where it was taken out."""

    path: str
    host: str | None
    ranks: list[int]
    base_ms: float
    offset_ms: float | None
    spread_ms: float | None
    pairs: int
    agreeing: int
    ambiguous: bool
    applied: bool


def is_node_set(traces: list[Trace]) -> bool:
    """Whether these traces are the nodes of one job (see the module doc)."""
    return len(traces) > 1 and not_one_job(traces) is None


def facts_of_trace(trace: Trace) -> NodeFacts:
    """:class:`~profkit.traces.job.NodeFacts` of one export's full tables."""
    meta, k = trace.meta, trace.kernels
    window = (int(k["start"].min()), int(k["end"].max())) if len(k) else (0, 0)
    start = meta.get("session_start_utc_ns")
    return NodeFacts(
        str(meta.get("path")), meta.get("format") == FORMAT, meta.get("host"),
        None if start is None else int(start), sorted(_gpu_pids(trace)),
        is_nccl_trace(trace), window,
    )  # fmt: skip


def not_one_job(traces: list[Trace]) -> str | None:
    """Why these nsys exports are not the nodes of one job (None: they are); for traces of
    other formats, that they are not nsys exports."""
    return why_not_one_job([facts_of_trace(t) for t in traces])


def is_nccl_trace(trace: Trace) -> bool:
    """Whether a trace holds NCCL kernels (a rank of a multi-GPU job)."""
    return bool(_nccl(trace.kernels).any())


def node_labels(traces: list[Trace]) -> list[str]:
    """How each file is named in tables and notes (:func:`path_labels`)."""
    return path_labels([str(t.meta.get("path")) for t in traces])


def merge_node_traces(traces: list[Trace]) -> Trace:
    """One Trace of every node's activities and ranges, on the first node's clock, with
    ``meta["ranks"]`` in global rank order and ``meta["nodes"]`` (:class:`NodeClock`)."""
    kernels: list[pd.DataFrame] = []
    ranges: list[pd.DataFrame] = []
    ranks: list[dict[str, Any]] = []
    clocks: list[NodeClock] = []
    reference = _no_ends()
    next_key = 1
    labels = node_labels(traces)
    placed: list[tuple[Trace, list[dict[str, Any]], dict[int, int], list[int]]] = []
    shifts: list[int] = []
    for node, trace in enumerate(traces):
        meta = trace.meta
        local = rank_processes(trace, kernel_processes(trace))
        # Every process its own key, the ranks' first (in rank order), after the last node's.
        pids = [int(info["pid"]) for info in local]
        pids += (
            _pids(trace.kernels["launch_thread"]).tolist() + _pids(trace.ranges["thread"]).tolist()
        )
        keys = {int(pid): next_key + i for i, pid in enumerate(dict.fromkeys(pids))}
        next_key += len(keys)
        ends = _nccl_ends(trace, local[0]["pid"]) if local else _no_ends()
        if node == 0:
            reference = ends
        before = sum(len(p[1]) for p in placed)
        numbered = list(range(before, before + len(local)))
        clock, shift = _clock(
            labels[node], traces[0].meta, meta, reference, ends, numbered, node == 0
        )
        clocks.append(clock)
        shifts.append(shift)
        placed.append((trace, local, keys, numbered))
    for node, ((trace, local, keys, numbered), shift) in enumerate(
        zip(placed, lifted(shifts), strict=True)
    ):
        meta = trace.meta
        moved = _shifted(trace, shift)  # copies: the caller's trace stays as it was
        k, r = moved.kernels, moved.ranges
        k["launch_thread"] = _rekeyed(k["launch_thread"], keys)
        r["thread"] = _rekeyed(r["thread"], keys)
        k["device"] = k["device"] + node * DEVICE_STRIDE
        for info, rank in zip(local, numbered, strict=True):
            ranks.append({**info, "rank": rank, "process": keys[int(info["pid"])],
                          "host": meta.get("host"), "path": meta.get("path")})  # fmt: skip
        kernels.append(k)
        ranges.append(r)
    for info in ranks:
        info["world_size"] = len(ranks)
    nodes = [asdict(c) for c in clocks]
    first = traces[0].meta
    meta = {
        **{key: v for key, v in first.items() if key not in ("thread_names", "warnings")},
        "path": ", ".join(labels),
        "paths": [t.meta.get("path") for t in traces],
        "thread_names": merged_thread_names([t.meta for t in traces], [p[2] for p in placed]),
        "ranks": ranks,
        "nodes": nodes,
        "warnings": _warnings_of([t.meta for t in traces], labels, nodes),
    }
    return Trace(
        kernels=conform(pd.concat(kernels, ignore_index=True), KERNEL_COLUMNS),
        ranges=conform(pd.concat(ranges, ignore_index=True), RANGE_COLUMNS),
        meta=meta,
    )


def merge_ranks_of_hosts(traces: list[Trace]) -> Trace:
    """Per-rank Chrome traces of one run merged (:func:`profkit.traces.ranks.
    merge_rank_traces`), each host's put on the clock of the host of the lowest rank.

    Chrome traces count from the epoch (``baseTimeNanoseconds``), so the ranks of one host
    share its clock and those of several hosts differ by what NTP leaves: each further
    host's offset is estimated from its lowest rank's NCCL kernel ends against the first
    host's (:func:`host_clocks`) and taken out where resolved, as for nodes' nsys
    exports; ``meta["nodes"]`` then lists the hosts. One host, or a trace that names none
    (profkit's header does): merged as they are.
    """
    infos = [rank_info(t) or {} for t in traces]
    hosts = host_clocks(infos, node_labels(traces), lambda i: _nccl_ends(traces[i]))
    if hosts is None:
        return merge_rank_traces(traces)
    shifted = [_shifted(t, ns) if ns else t for t, ns in zip(traces, hosts.shifts, strict=True)]
    merged = merge_rank_traces(shifted)
    merged.meta["nodes"] = hosts.nodes
    merged.meta["warnings"] = list(merged.meta.get("warnings") or []) + clock_notes(hosts.nodes)
    return merged


@dataclass(frozen=True)
class HostClocks:
    """How per-rank traces of several hosts were put on one clock: ``nodes`` one
    :class:`NodeClock` (as a dict) per host, in order of their lowest rank, and ``shifts``
    the ns to add to each trace's times (in the order the traces were given)."""

    nodes: list[dict[str, Any]]
    shifts: list[int]


def host_clocks(
    infos: list[dict[str, Any]],
    labels: list[str],
    nccl_ends_of: Callable[[int], tuple[np.ndarray, np.ndarray]],
) -> HostClocks | None:
    """The clocks of per-rank traces (their :func:`~profkit.traces.ranks.rank_info` and
    :func:`path_labels`) where they name several hosts; None for one host, or where a trace
    names none. ``nccl_ends_of(i)``: trace *i*'s NCCL kernels in launch order, names and
    end times (:func:`estimate_offset` pairs each further host's lowest rank's with the
    lowest rank's of all). The one owner of this alignment for tables and columns."""
    hosts = [i.get("host") for i in infos]
    if None in hosts or len(set(hosts)) < 2:
        return None
    order = sorted(range(len(infos)), key=lambda i: int(infos[i]["rank"]))
    by_host: dict[str, list[int]] = {}
    for i in order:
        by_host.setdefault(str(hosts[i]), []).append(i)
    reference = nccl_ends_of(order[0])
    clocks, shifts = [], [0] * len(infos)
    for index, (host, members) in enumerate(by_host.items()):
        ranks = sorted(int(infos[i]["rank"]) for i in members)
        label = ", ".join(labels[i] for i in members)
        found = None if index == 0 else estimate_offset(reference, nccl_ends_of(members[0]))
        clock = _found_clock(label, host, ranks, 0, found)
        clocks.append(clock)
        if clock.applied and found is not None:
            for i in members:
                shifts[i] = -found.ns
    return HostClocks([asdict(c) for c in clocks], shifts)


def lifted(shifts: list[int]) -> list[int]:
    """Each node's shift onto the first node's clock, all raised by one amount where some
    are negative (a node whose session began before the first's), so that no time goes
    below 0: an unknown launch reads as a negative time, and a known one must not."""
    lift = max(0, -min(shifts, default=0))
    return [shift + lift for shift in shifts]


def _shifted(trace: Trace, ns: int) -> Trace:
    """A copy of ``trace`` with every time moved by ``ns``."""
    k, r = trace.kernels.copy(), trace.ranges.copy()
    for column in ("start", "end", "launch_start"):
        k[column] = k[column] + ns
    r["start"], r["end"] = r["start"] + ns, r["end"] + ns
    return Trace(kernels=k, ranges=r, meta=trace.meta)


def _clock(
    label: str,
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
        return NodeClock(label, meta.get("host"), ranks, 0.0, None, None, 0, 0, False, False), 0
    found = estimate_offset(reference, (ends[0], ends[1] + base))
    clock = _found_clock(label, meta.get("host"), ranks, base, found)
    return clock, base - (found.ns if clock.applied and found is not None else 0)


def _found_clock(
    label: str, host: str | None, ranks: list[int], base: int, found: Offset | None
) -> NodeClock:
    """The :class:`NodeClock` of what :func:`estimate_offset` found (None: nothing paired);
    an ambiguous offset is neither shown nor applied."""
    if found is None:
        return NodeClock(label, host, ranks, base / 1e6, None, None, 0, 0, False, False)
    trusted = not found.ambiguous
    return NodeClock(
        label, host, ranks, base / 1e6,
        found.ns / 1e6 if trusted else None, found.spread / 1e6 if trusted else None,
        found.pairs, found.agreeing, found.ambiguous, _resolved(found),
    )  # fmt: skip


@dataclass(frozen=True)
class Offset:
    """What the collectives say of one clock against another (ns): ``ns`` the median end
    difference of the pairs that agree (``agreeing`` of ``pairs``), ``spread`` their median
    absolute deviation; ``ambiguous`` where another pairing, at another offset, agrees as
    well (collectives too evenly spaced to tell), and ``ns`` is then not to be trusted."""

    ns: int
    spread: int
    pairs: int
    agreeing: int
    ambiguous: bool


def estimate_offset(
    reference: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray]
) -> Offset | None:
    """How far ``other``'s clock runs ahead of ``reference``'s, from one rank's NCCL kernels
    on each: ``(names, end times)`` in launch order; None where no pairing has enough
    collectives.

    Every rank runs a communicator's collectives in the same order and they end together,
    but the two captures may start at different collectives, so the sequences are paired
    at each shift that puts some collective's ends within :data:`MAX_OFFSET_NS` of each
    other (the session starts have already aligned the clocks to about that), where at
    least half of the shorter sequence, and :data:`MIN_PAIRS`, pair kernels of the same
    name. A shift is scored by how many of its pairs end within :data:`AGREE_NS` of its
    median difference: the true pairing agrees nearly everywhere, a pairing off by some
    collectives breaks wherever their spacing changes (a step boundary, a bucket of
    another size). Where two pairings at offsets more than ``AGREE_NS`` apart score within
    :data:`TIE` of each other, the answer is ambiguous."""
    codes = pd.factorize(np.concatenate([reference[0], other[0]]))[0]
    ref_name, name = codes[: len(reference[0])], codes[len(reference[0]) :]
    ref_end, end = reference[1], other[1]
    need = max(MIN_PAIRS, (min(len(ref_end), len(end)) + 1) // 2)
    scored = []
    for shift in _shifts(ref_end, end):
        lo, hi = max(0, shift), min(len(ref_end), len(end) + shift)
        if hi - lo < need:
            continue
        same = ref_name[lo:hi] == name[lo - shift : hi - shift]
        if same.sum() < need:
            continue
        diff = end[lo - shift : hi - shift][same] - ref_end[lo:hi][same]
        agree = np.abs(diff - int(np.median(diff))) <= AGREE_NS
        scored.append((agree.mean(), diff[agree], int(same.sum())))
    if not scored:
        return None
    share, diff, pairs = max(scored, key=lambda s: s[0])
    ns = int(np.median(diff))
    rivals = [
        s for s in scored if s[0] >= share - TIE and abs(int(np.median(s[1])) - ns) > AGREE_NS
    ]
    spread = int(np.median(np.abs(diff - ns)))
    return Offset(ns, spread, pairs, len(diff), ambiguous=bool(rivals))


def _shifts(ref_end: np.ndarray, end: np.ndarray) -> list[int]:
    """The shifts (reference index minus other index) that put a collective's ends within
    :data:`MAX_OFFSET_NS`, from up to :data:`ANCHORS` collectives of ``other``: the search
    costs those, not every shift of two long sequences."""
    if not len(ref_end) or not len(end):
        return []
    order = np.argsort(ref_end, kind="stable")
    sorted_end = ref_end[order]
    shifts: set[int] = set()
    for j in np.unique(np.linspace(0, len(end) - 1, min(ANCHORS, len(end))).astype(np.int64)):
        lo = np.searchsorted(sorted_end, end[j] - MAX_OFFSET_NS, side="left")
        hi = np.searchsorted(sorted_end, end[j] + MAX_OFFSET_NS, side="right")
        shifts.update((order[lo:hi] - j).tolist())
    return sorted(shifts)


def _resolved(found: Offset) -> bool:
    """Whether an offset is one pairing's alone, and larger than the collectives' ends can
    be told apart by."""
    return not found.ambiguous and abs(found.ns) > max(AGREE_NS, SPREAD_FACTOR * found.spread)


def _nccl(kernels: pd.DataFrame) -> np.ndarray:
    is_kernel = kernels["kind"].to_numpy(dtype=object) == "kernel"
    return is_kernel & is_nccl(kernels["name"])


def _nccl_ends(trace: Trace, pid: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One process's NCCL kernels in launch order: names and end times (``pid`` None: the
    trace is one process's)."""
    k = trace.kernels
    thread = k["launch_thread"].to_numpy(dtype=np.int64, na_value=-1)
    mine = _nccl(k) & (thread >= 0)
    if pid is not None:
        mine &= ((thread >> PROCESS_SHIFT) & PROCESS_MASK) == pid
    rows = k[mine].sort_values(["launch_start", "start"], kind="stable")
    return rows["name"].to_numpy(dtype=object), rows["end"].to_numpy(np.int64)


def _no_ends() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=object), np.zeros(0, np.int64)


def _gpu_pids(trace: Trace) -> set[int]:
    return set(_pids(trace.kernels["launch_thread"]).tolist())


def _pids(threads: pd.Series) -> np.ndarray:
    return process_ids(threads.to_numpy(dtype=np.int64, na_value=-1))


def _rekeyed(threads: pd.Series, keys: dict[int, int]) -> pd.Series:
    """:func:`rekeyed_ids` of a column of thread ids (NA kept)."""
    values = threads.to_numpy(dtype=np.int64, na_value=-1)
    out = rekeyed_ids(values, keys)
    return pd.Series(out, index=threads.index).where(values >= 0, pd.NA).astype(threads.dtype)


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


def _warnings_of(
    metas: list[dict[str, Any]], labels: list[str], clocks: list[dict[str, Any]]
) -> list[str]:
    """Each node's warnings (named by its file), then what the clocks showed."""
    said: list[str] = []
    for meta, label in zip(metas, labels, strict=True):
        said += [f"{label}: {w}" for w in meta.get("warnings") or []]
    return said + clock_notes(clocks)


def clock_notes(clocks: list[dict[str, Any]]) -> list[str]:
    """What the clocks of the nodes (or hosts) after the first showed."""
    said: list[str] = []
    first = clocks[0]["path"]
    for clock in clocks[1:]:
        if clock["ambiguous"]:
            said.append(
                f"{clock['path']}: its collectives pair with {first}'s equally well at more "
                "than one offset (too evenly spaced to tell), so its clock offset is unknown: "
                "times across nodes are as the session starts put them"
            )
        elif clock["offset_ms"] is None:
            said.append(
                f"{clock['path']}: no run of NCCL kernels pairs with {first}'s, so its clock "
                "offset is unknown: times across nodes are as the session starts put them"
            )
        elif clock["applied"]:
            said.append(
                f"{clock['path']}: its clock ran {clock['offset_ms']:+.3f} ms from {first}'s "
                f"(the ends of {clock['agreeing']} of {clock['pairs']} paired collectives, "
                f"spread {clock['spread_ms']:.3f} ms): taken out"
            )
    return said
