"""Per-rank traces of one distributed run, and what joining them into one job is.

torch.profiler writes one Chrome trace per process (``NAME-rank0.json.gz``, ...); each
says its rank and world size in ``distributedInfo``. Nsight Systems, profiling the whole
``torchrun`` tree, writes one report holding every process, with global thread ids
(process id in bits 24-47). Joining per-rank traces makes the first look like the second:
thread ids become ``process << 24 | tid`` so that the ranges and launches of different
processes never mix, and ``meta["ranks"]`` lists who is who.

:func:`rank_set` owns what such a join is: the checks (every trace names a rank, one
world size), the rank order, each rank's process key (:func:`rank_thread_ids`) and the
joined meta; :mod:`profkit.analysis.joins` applies it to the ranks' compact columns.

Times are kept as they are: ranks on one host share its clock. Traces of several hosts
are compared on their own clocks, which can be offset (docs/MULTI_GPU.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from profkit.errors import BadInput
from profkit.traces.schema import PROCESS_SHIFT, THREAD_MASK

Ids = TypeVar("Ids", int, np.ndarray, pd.Series)


MAX_PID = (1 << 22) - 1  # Linux's pid_max at its largest; ids above do not fit the key bits


def rank_of_meta(meta: dict[str, Any]) -> dict[str, Any] | None:
    """``{rank, world_size, pid, host, device, path}`` of a per-rank trace from its meta
    (the device as its header says it), or None.

    The rank and world size come from ``distributedInfo`` (torch.profiler writes it once
    ``torch.distributed`` is initialised), else from profkit's own header. The one place
    a header's say is checked: a rank, world size or pid that is not a whole number in its
    range, a rank outside its world, a host that is not a name: :class:`BadInput`, one line
    naming the file and the field.
    """
    dist = meta.get("distributedInfo")
    profkit: dict[str, Any] = meta["profkit"] if isinstance(meta.get("profkit"), dict) else {}
    from_dist = isinstance(dist, dict) and "rank" in dist
    source = dist if from_dist else profkit
    if not isinstance(source, dict) or source.get("rank") is None:
        return None
    where = "distributedInfo" if from_dist else "the profkit header"
    path = meta.get("path") or "the trace"
    rank = _whole(source["rank"], f"{where}'s rank", path, 0, 1 << 30)
    world = source.get("world_size")
    world = None if world in (None, 0) else _whole(world, f"{where}'s world_size", path, 1, 1 << 30)
    if world is not None and rank >= world:
        raise BadInput(
            f"{path}: {where} says rank {rank} of a world of {world}: not one run's rank"
        )
    pid = meta.get("pid") if meta.get("pid") is not None else profkit.get("pid")
    host = profkit.get("host")
    if host is not None and not isinstance(host, str):
        raise BadInput(f"{path}: the profkit header's host is {_shown(host)}, not a host name")
    return {
        "rank": rank,
        "world_size": world,
        "pid": None if pid is None else _whole(pid, "its pid", path, 0, MAX_PID),
        "host": host,
        "device": profkit.get("device"),
        "path": meta.get("path"),
    }


def _whole(value: Any, what: str, path: str, low: int, high: int) -> int:
    """``value`` if it is a whole number from ``low`` to ``high`` (JSON's ``1.0`` included;
    ``true`` is not a number), else one line naming it."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadInput(
            f"{path}: {what} is {_shown(value)}, not a whole number from {low:,} to {high:,}"
        )
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def rank_info_of(meta: dict[str, Any], devices: Any) -> dict[str, Any] | None:
    """:func:`rank_of_meta`, the rank's device being the most frequent of its activities'
    ``devices`` (array of device ordinals), else the header's."""
    info = rank_of_meta(meta)
    if info is None:
        return None
    # As int64 (the compact columns keep int16): a tie between two devices goes to the lower.
    counts = pd.Series(np.asarray(devices, dtype=np.int64)).value_counts()
    if len(counts):
        info["device"] = int(counts.index[0])
    return info


def names_distinct_ranks(infos: list[dict[str, Any] | None]) -> bool:
    """Whether traces of these :func:`rank_info_of` are the ranks of one run: each names a
    distinct rank."""
    if len(infos) < 2 or any(i is None for i in infos):
        return False
    ranks = [i["rank"] for i in infos if i is not None]
    return len(set(ranks)) == len(ranks)


def rank_thread_ids(threads: Ids, process: int) -> Ids:
    """A rank's thread ids in the merged set: its process key in the process bits, as
    nsys's global thread ids (``process << 24 | tid``); a missing id (NA) stays missing."""
    return (threads & THREAD_MASK) + (process << PROCESS_SHIFT)


@dataclass
class RankSet:
    """Per-rank traces as one run: ``order`` the traces' indices in rank order, ``ranks``
    each rank's :func:`rank_info_of` in that order (``pid`` the real one; ``process``, where
    given, the key its thread ids get instead: :func:`process_key`) and ``meta`` the
    merged trace's."""

    order: list[int]
    ranks: list[dict[str, Any]]
    meta: dict[str, Any]


def process_key(info: dict[str, Any]) -> int:
    """The process bits a rank's thread ids get in the merged set (:func:`rank_set`)."""
    return int(info.get("process", info["pid"]))


def rank_set(metas: list[dict[str, Any]], infos: list[dict[str, Any] | None]) -> RankSet:
    """The merge of per-rank traces with these metas and :func:`rank_info_of`: raises
    :class:`BadInput` where they cannot be the ranks of one run (a trace names no rank,
    world sizes differ, more traces than the world size).

    Each rank's process key is its pid (its rank + 1 where the trace names none), so that
    thread ids read as nsys's; where two ranks would share one (pids of two hosts can be
    equal), the later rank gets a key above every pid instead (``process``), so that their
    activities never mix.
    """
    if any(i is None for i in infos):
        missing = [m.get("path") for m, i in zip(metas, infos, strict=True) if i is None]
        raise BadInput(f"{missing[0]} names no rank (no distributedInfo): not a per-rank trace")
    known = [dict(i) for i in infos if i is not None]
    _check_one_run([str(m.get("path")) for m in metas], known)
    order = sorted(range(len(known)), key=lambda i: known[i]["rank"])
    ranks, threads = [], {}
    for index in order:
        info = known[index]
        info["pid"] = int(info["pid"]) if info.get("pid") is not None else int(info["rank"]) + 1
        ranks.append(info)
    taken: set[int] = set()
    spare = max(int(info["pid"]) for info in ranks) + 1
    for info in ranks:
        if info["pid"] in taken:
            info["process"], spare = spare, spare + 1
        taken.add(process_key(info))
    autograd: set[int] = set()
    steps: list[dict[str, Any]] = []
    for index, info in zip(order, ranks, strict=True):
        key, meta_of = process_key(info), metas[index]
        for tid, name in (meta_of.get("threads") or {}).items():
            threads[rank_thread_ids(int(tid), key)] = f"rank {info['rank']} {name}"
        # Phase inference's hints, every rank's on its merged thread ids (a rank's alone,
        # or ids no merged thread has, would leave the other ranks' backward unfound).
        autograd.update(rank_thread_ids(int(t), key) for t in meta_of.get("autograd_threads") or ())
        steps += [
            {**step, "thread": rank_thread_ids(int(step["thread"]), key)}
            for step in meta_of.get("profiler_steps") or ()
            if isinstance(step, dict) and "thread" in step
        ]
    first = metas[order[0]]
    meta = {
        **{k: v for k, v in first.items() if k not in ("pid", "threads", "profiler_steps")},
        "path": ", ".join(str(metas[i].get("path")) for i in order),
        "paths": [metas[i].get("path") for i in order],
        "threads": threads,
        "autograd_threads": sorted(autograd),
        "profiler_steps": sorted(steps, key=lambda step: (int(step["start"]), step["thread"])),
        "ranks": ranks,
        "warnings": _rank_warnings([metas[i].get("warnings") or [] for i in order], ranks),
    }
    return RankSet(order, ranks, meta)


def _rank_warnings(said: list[list[str]], ranks: list[dict[str, Any]]) -> list[str]:
    """The ranks' warnings, each once: as it is where every rank says it, else with the
    ranks that say it (``rank 1: ...``)."""
    who: dict[str, list[int]] = {}
    for warnings, info in zip(said, ranks, strict=True):
        for warning in dict.fromkeys(warnings):
            who.setdefault(warning, []).append(int(info["rank"]))
    return [
        warning if len(by) == len(ranks) else f"rank {', '.join(map(str, by))}: {warning}"
        for warning, by in who.items()
    ]


def _check_one_run(paths: list[str], infos: list[dict[str, Any]]) -> None:
    """Raise :class:`BadInput` where the traces cannot be the ranks of one run: their world
    sizes differ, or there are more of them than the world size says (a run of 3 ranks
    left its rank 2 beside a later run of 2, say)."""
    sizes = {i["world_size"] for i in infos if i.get("world_size")}
    names = ", ".join(Path(p).name for p in paths)
    if len(sizes) > 1:
        listed = ", ".join(str(size) for size in sorted(sizes))
        raise BadInput(
            f"these traces come from runs of different world sizes ({listed}): {names}; "
            "give the ranks of one run"
        )
    if sizes and len(paths) > min(sizes):
        raise BadInput(
            f"{len(paths)} traces for a world size of {min(sizes)}: {names}; "
            "give the ranks of one run"
        )
