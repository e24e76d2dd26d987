"""Per-rank traces of one distributed run, merged into one multi-process :class:`Trace`.

torch.profiler writes one Chrome trace per process (``NAME-rank0.json.gz``, ...); each
says its rank and world size in ``distributedInfo``. Nsight Systems, profiling the whole
``torchrun`` tree, writes one report holding every process, with global thread ids
(process id in bits 24-47). :func:`merge_rank_traces` makes the first look like the
second: thread ids become ``pid << 24 | tid`` so that the ranges and launches of
different processes never mix, and ``meta["ranks"]`` lists who is who.

Times are kept as they are: ranks on one host share its clock. Traces of several hosts
are compared on their own clocks, which can be offset (docs/MULTI_GPU.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from profkit.errors import BadInput
from profkit.traces.schema import (
    KERNEL_COLUMNS,
    PROCESS_SHIFT,
    RANGE_COLUMNS,
    THREAD_MASK,
    Trace,
    conform,
)


def rank_info(trace: Trace) -> dict[str, Any] | None:
    """``{rank, world_size, pid, host, device}`` of a per-rank trace, or None.

    The rank and world size come from ``distributedInfo`` (torch.profiler writes it once
    ``torch.distributed`` is initialised), else from profkit's own header.
    """
    info = rank_of_meta(trace.meta)
    if info is None:
        return None
    devices = trace.kernels["device"].value_counts()
    if len(devices):
        info["device"] = int(devices.index[0])
    return info


def rank_of_meta(meta: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`rank_info` from a trace's meta alone (the device as its header says it)."""
    dist = meta.get("distributedInfo")
    profkit: dict[str, Any] = meta["profkit"] if isinstance(meta.get("profkit"), dict) else {}
    source = dist if isinstance(dist, dict) and "rank" in dist else profkit
    if not isinstance(source, dict) or source.get("rank") is None:
        return None
    return {
        "rank": int(source["rank"]),
        "world_size": int(source.get("world_size") or 0) or None,
        "pid": meta.get("pid") if meta.get("pid") is not None else profkit.get("pid"),
        "host": profkit.get("host"),
        "device": profkit.get("device"),
        "path": meta.get("path"),
    }


def is_rank_set(traces: list[Trace]) -> bool:
    """Whether these traces are the ranks of one run: each names a distinct rank."""
    infos = [rank_info(t) for t in traces]
    if len(traces) < 2 or any(i is None for i in infos):
        return False
    ranks = [i["rank"] for i in infos if i is not None]
    return len(set(ranks)) == len(ranks)


def merge_rank_traces(traces: list[Trace]) -> Trace:
    """One Trace of every rank's activities and ranges, ``meta["ranks"]`` in rank order."""
    infos = [rank_info(t) for t in traces]
    if any(i is None for i in infos):
        missing = [t.meta.get("path") for t, i in zip(traces, infos, strict=True) if i is None]
        raise BadInput(f"{missing[0]} names no rank (no distributedInfo): not a per-rank trace")
    _check_one_run(traces, infos)
    order = sorted(range(len(traces)), key=lambda i: infos[i]["rank"])  # type: ignore[index]
    kernels, ranges, ranks, threads = [], [], [], {}
    for index in order:
        trace, info = traces[index], dict(infos[index] or {})
        process = int(info["pid"]) if info.get("pid") is not None else int(info["rank"]) + 1
        info["pid"] = process
        offset = process << PROCESS_SHIFT
        k = trace.kernels.copy()
        k["launch_thread"] = (k["launch_thread"] & THREAD_MASK) + offset
        r = trace.ranges.copy()
        r["thread"] = (r["thread"] & THREAD_MASK) + offset
        kernels.append(k)
        ranges.append(r)
        ranks.append(info)
        for tid, name in (trace.meta.get("threads") or {}).items():
            threads[(int(tid) & THREAD_MASK) + offset] = f"rank {info['rank']} {name}"
    first = traces[order[0]].meta
    meta = {
        **{k: v for k, v in first.items() if k not in ("pid", "threads", "profiler_steps")},
        "path": ", ".join(str(traces[i].meta.get("path")) for i in order),
        "paths": [traces[i].meta.get("path") for i in order],
        "threads": threads,
        "ranks": ranks,
        "warnings": _rank_warnings([traces[i].meta.get("warnings") or [] for i in order], ranks),
    }
    return Trace(
        kernels=conform(pd.concat(kernels, ignore_index=True), KERNEL_COLUMNS),
        ranges=conform(pd.concat(ranges, ignore_index=True), RANGE_COLUMNS),
        meta=meta,
    )


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


def _check_one_run(traces: list[Trace], infos: list[dict[str, Any] | None]) -> None:
    """Raise :class:`BadInput` where the traces cannot be the ranks of one run: their world
    sizes differ, or there are more of them than the world size says (a run of 3 ranks
    left its rank 2 beside a later run of 2, say)."""
    sizes = {i["world_size"] for i in infos if i is not None and i.get("world_size")}
    names = ", ".join(Path(str(t.meta.get("path"))).name for t in traces)
    if len(sizes) > 1:
        listed = ", ".join(str(size) for size in sorted(sizes))
        raise BadInput(
            f"these traces come from runs of different world sizes ({listed}): {names}; "
            "give the ranks of one run"
        )
    if sizes and len(traces) > min(sizes):
        raise BadInput(
            f"{len(traces)} traces for a world size of {min(sizes)}: {names}; "
            "give the ranks of one run"
        )
