"""Each rank of a multi-GPU trace apart, its communication, and the job across ranks.

A multi-rank trace is a multi-process Nsight Systems export (one report of the whole
``torchrun`` tree) or per-rank Chrome traces merged by :mod:`profkit.traces.ranks`. Ranks
are processes that ran GPU activity. A Chrome trace names its rank (``distributedInfo``);
an nsys export does not, so its processes are numbered in order of (device, pid) — the
rank torchrun gives each local process when rank ``r`` drives GPU ``r``.

:func:`analyze_ranks` returns a :class:`RankedReport`: the usual tables of the whole trace
(or of one rank with ``rank=``), plus per rank its phases, top kernels, categories and
:class:`~profkit.analysis.comm.CommStats`, and per step the slowest rank, the spread and
the NCCL time each rank spent waiting for the last one to arrive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.comm import CommStats, comm_stats, is_nccl
from profkit.analysis.report import KernelReport, analyze
from profkit.errors import BadInput
from profkit.traces.schema import Trace

PROCESS_SHIFT = 24
PROCESS_MASK = (1 << 24) - 1  # globalTid: process id in bits 24-47 (nsys sets bits above)
NS_PER_MS = 1_000_000
RANK_FIELDS = ("rank", "device", "pid", "host")


@dataclass
class RankEntry:
    """One rank: who it is, its tables and its communication."""

    info: dict[str, Any]
    report: KernelReport
    comm: CommStats
    totals: dict[str, Any]
    trace: Trace

    def to_json(self) -> dict[str, Any]:
        whole = self.report.to_json()
        return {
            **{key: self.info.get(key) for key in RANK_FIELDS},
            **self.totals,
            "phases": whole["phases"],
            "kernels_top": [
                {k: v for k, v in row.items() if k != "phase"}
                for row in self.report.top_kernels().to_dict(orient="records")
            ],
            "categories": whole["categories"],
            "comm": self.comm.to_json(),
        }


@dataclass
class RankedReport(KernelReport):
    """A :class:`KernelReport` plus ``ranks`` and the ``job`` across them."""

    ranks: list[RankEntry] = field(default_factory=list)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    world_size: int = 0

    def to_json(self) -> dict[str, Any]:
        base = super().to_json()
        base["ranks"] = [entry.to_json() for entry in self.ranks]
        base["job"] = job_summary(self.steps, self.world_size)
        return base


def rank_processes(trace: Trace) -> list[dict[str, Any]]:
    """``{rank, world_size, device, pid, host}`` of each process that ran GPU activity."""
    if trace.meta.get("ranks"):
        return [dict(r) for r in trace.meta["ranks"]]
    pids = kernel_processes(trace)
    if not len(pids):
        return []
    frame = pd.DataFrame({"pid": pids, "device": trace.kernels["device"].to_numpy(np.int64)})
    devices = frame.groupby("pid")["device"].agg(lambda d: int(d.value_counts().index[0]))
    order = sorted(devices.items(), key=lambda item: (item[1], item[0]))
    host = trace.meta.get("host")
    return [
        {"rank": i, "world_size": len(order), "device": dev, "pid": int(pid), "host": host}
        for i, (pid, dev) in enumerate(order)
    ]


def kernel_processes(trace: Trace) -> np.ndarray:
    """The process of each activity: its launching thread's, else its device's main one."""
    k = trace.kernels
    thread = k["launch_thread"].to_numpy(dtype=np.int64, na_value=-1)
    pid = np.where(thread >= 0, (thread >> PROCESS_SHIFT) & PROCESS_MASK, -1)
    device = k["device"].to_numpy(np.int64)
    known = pid >= 0
    if known.all() or not known.any():
        return np.where(known, pid, 0) if not known.any() else pid
    # An activity without a traced launch goes to the process that launched most on its GPU.
    pairs = pd.DataFrame({"device": device[known], "pid": pid[known]})
    main = pairs.groupby("device")["pid"].agg(lambda p: int(p.value_counts().index[0]))
    fallback = pd.Series(device[~known]).map(main).fillna(-1).to_numpy(np.int64)
    pid[~known] = fallback
    return pid


def is_multi_rank(trace: Trace) -> bool:
    """True when more than one process ran GPU activity (or the trace says it has ranks)."""
    if trace.meta.get("ranks"):
        return len(trace.meta["ranks"]) > 1
    return len(pd.unique(kernel_processes(trace))) > 1


def rank_trace(trace: Trace, pid: int, processes: np.ndarray | None = None) -> Trace:
    """The activities and ranges of one process, as a Trace of its own."""
    processes = kernel_processes(trace) if processes is None else processes
    k = trace.kernels[processes == pid].reset_index(drop=True)
    threads = trace.ranges["thread"].to_numpy(np.int64)
    r = trace.ranges[((threads >> PROCESS_SHIFT) & PROCESS_MASK) == pid].reset_index(drop=True)
    return Trace(kernels=k, ranges=r, meta=trace.meta)


def analyze_ranks(
    trace: Trace,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    rank: int | None = None,
) -> RankedReport:
    """Tables of the whole trace (or of ``rank``), each rank's, and the job across ranks."""
    processes = rank_processes(trace)
    if rank is not None and rank not in [p["rank"] for p in processes]:
        known = ", ".join(str(p["rank"]) for p in processes) or "none"
        raise BadInput(f"no rank {rank} in this trace; ranks: {known}")
    pids = kernel_processes(trace)
    entries = [
        _rank_entry(rank_trace(trace, p["pid"], pids), p, top, phase, range) for p in processes
    ]
    chosen = [e for e in entries if rank is None or e.info["rank"] == rank]
    whole = chosen[0].report if rank is not None else analyze(trace, top, phase, range)
    report = RankedReport(**{f: getattr(whole, f) for f in KernelReport.__dataclass_fields__})
    report.source = {**whole.source, "ranks": len(processes), "rank": rank}
    report.ranks = chosen
    report.steps = step_table(entries)
    report.world_size = max([p.get("world_size") or 0 for p in processes] + [len(processes)])
    return report


def _rank_entry(
    trace: Trace, info: dict[str, Any], top: int, phase: str | None, range_: str | None
) -> RankEntry:
    report = analyze(trace, top, phase, range_)
    mask = report.selected if report.selected is not None else slice(None)
    selected = trace.kernels[mask]
    is_kernel = selected["kind"].to_numpy(dtype=object) == "kernel"
    duration = (selected["end"] - selected["start"]).clip(lower=0).to_numpy(np.int64)
    totals = {
        "kernels": int(is_kernel.sum()),
        "kernel_time_ms": int(duration[is_kernel].sum()) / NS_PER_MS,
        "gpu_time_ms": int(duration.sum()) / NS_PER_MS,
    }
    return RankEntry(info, report, comm_stats(selected), totals, trace)


def step_starts(trace: Trace, first_phase: str) -> np.ndarray:
    """Start of each instance of the first phase on the thread that holds most of them."""
    r = trace.ranges[trace.ranges["name"] == first_phase]
    if r.empty:
        return np.empty(0, np.int64)
    owner = r["thread"].value_counts().index[0]
    return np.sort(r.loc[r["thread"] == owner, "start"].to_numpy(np.int64))


def rank_steps(entry: RankEntry, trace: Trace) -> pd.DataFrame:
    """Per step of one rank: GPU span (first start to last end), NCCL kernels and time."""
    phases = [p for p in entry.report.phases["phase"] if p != "unattributed"]
    starts = step_starts(trace, phases[0]) if phases else np.empty(0, np.int64)
    k = trace.kernels
    if not len(starts) or k.empty:
        return pd.DataFrame(columns=["step", "start", "end", "nccl_ms"])
    point = k["launch_start"].to_numpy(dtype=np.int64, na_value=-1)
    point = np.where(point >= 0, point, k["start"].to_numpy(np.int64))
    step = np.searchsorted(starts, point, side="right") - 1
    frame = pd.DataFrame(
        {
            "step": step,
            "start": k["start"].to_numpy(np.int64),
            "end": k["end"].to_numpy(np.int64),
            "nccl": is_nccl(k["name"]) & (k["kind"].to_numpy(dtype=object) == "kernel"),
        }
    )[step >= 0]
    frame["nccl_ns"] = np.where(frame["nccl"], frame["end"] - frame["start"], 0)
    out = frame.groupby("step").agg(
        start=("start", "min"), end=("end", "max"), nccl_ns=("nccl_ns", "sum")
    )
    out["nccl_ms"] = out.pop("nccl_ns") / NS_PER_MS
    return out.reset_index()


def _nccl_waits(
    entries: list[RankEntry], traces: list[Trace], steps: list[pd.DataFrame]
) -> pd.DataFrame:
    """Per (step, rank): NCCL time spent before the last rank's matching kernel started.

    The k-th NCCL kernel of a step on each rank is taken to be one collective (ranks issue
    collectives in the same order); it cannot finish before every rank has joined, so on
    a rank that started it early, ``min(latest start - own start, duration)`` is waiting.
    """
    rows = []
    for entry, trace, step_frame in zip(entries, traces, steps, strict=True):
        k = trace.kernels
        nccl = is_nccl(k["name"]) & (k["kind"].to_numpy(dtype=object) == "kernel")
        if not nccl.any() or step_frame.empty:
            continue
        starts = step_starts(trace, _first_phase(entry))
        sel = k[nccl]
        point = sel["launch_start"].to_numpy(dtype=np.int64, na_value=-1)
        point = np.where(point >= 0, point, sel["start"].to_numpy(np.int64))
        frame = pd.DataFrame(
            {
                "step": np.searchsorted(starts, point, side="right") - 1,
                "start": sel["start"].to_numpy(np.int64),
                "duration": (sel["end"] - sel["start"]).to_numpy(np.int64),
                "rank": entry.info["rank"],
            }
        ).sort_values(["step", "start"], kind="stable")
        frame["k"] = frame.groupby("step").cumcount()
        rows.append(frame[frame["step"] >= 0])
    if len(rows) < 2:
        return pd.DataFrame(columns=["step", "rank", "wait_ms"])
    frame = pd.concat(rows, ignore_index=True)
    present = frame.groupby(["step", "k"])["rank"].transform("nunique") == len(rows)
    frame = frame[present]  # collectives every rank ran
    latest = frame.groupby(["step", "k"])["start"].transform("max")
    frame = frame.assign(
        wait_ns=np.minimum(latest - frame["start"], frame["duration"]).clip(lower=0)
    )
    waits = frame.groupby(["step", "rank"])["wait_ns"].sum().reset_index()
    waits["wait_ms"] = waits.pop("wait_ns") / NS_PER_MS
    return waits


def _first_phase(entry: RankEntry) -> str:
    phases = [p for p in entry.report.phases["phase"] if p != "unattributed"]
    return phases[0] if phases else ""


def step_table(entries: list[RankEntry]) -> pd.DataFrame:
    """One row per (step, rank): ``step_ms`` (GPU span), ``nccl_ms``, ``nccl_wait_ms``."""
    traces = [e.trace for e in entries]
    steps = [rank_steps(e, t) for e, t in zip(entries, traces, strict=True)]
    frames = [
        s.assign(rank=e.info["rank"]) for e, s in zip(entries, steps, strict=True) if not s.empty
    ]
    if not frames:
        return pd.DataFrame(columns=["step", "rank", "step_ms", "nccl_ms", "nccl_wait_ms"])
    table = pd.concat(frames, ignore_index=True)
    table["step_ms"] = (table["end"] - table["start"]) / NS_PER_MS
    waits = _nccl_waits(entries, traces, steps)
    table = table.merge(waits, on=["step", "rank"], how="left")
    table["nccl_wait_ms"] = table.pop("wait_ms").fillna(0.0).astype(float)
    return (
        table[["step", "rank", "step_ms", "nccl_ms", "nccl_wait_ms"]]
        .sort_values(["step", "rank"])
        .reset_index(drop=True)
    )


def job_summary(steps: pd.DataFrame, world_size: int) -> dict[str, Any]:
    """Per step: slowest and fastest rank, spread; per rank: mean step and NCCL wait."""
    if steps.empty:
        return {"world_size": world_size, "steps": [], "ranks": []}
    per_step = []
    for step, group in steps.groupby("step", sort=True):
        slow = group.loc[group["step_ms"].idxmax()]
        fast = group.loc[group["step_ms"].idxmin()]
        per_step.append(
            {
                "step": int(step),
                "slowest_rank": int(slow["rank"]),
                "slowest_ms": float(slow["step_ms"]),
                "fastest_rank": int(fast["rank"]),
                "fastest_ms": float(fast["step_ms"]),
                "spread_ms": float(slow["step_ms"] - fast["step_ms"]),
                "nccl_wait_ms": {
                    str(int(r)): float(w)
                    for r, w in zip(group["rank"], group["nccl_wait_ms"], strict=True)
                },
            }
        )
    by_rank = steps.groupby("rank").agg(
        step_ms=("step_ms", "mean"),
        nccl_ms=("nccl_ms", "sum"),
        nccl_wait_ms=("nccl_wait_ms", "sum"),
    )
    ranks = [
        {
            "rank": int(r),
            "mean_step_ms": float(row["step_ms"]),
            "nccl_ms": float(row["nccl_ms"]),
            "nccl_wait_ms": float(row["nccl_wait_ms"]),
        }
        for r, row in by_rank.iterrows()
    ]
    slowest = pd.Series([s["slowest_rank"] for s in per_step]).value_counts()
    return {
        "world_size": world_size,
        "slowest_rank": int(slowest.index[0]),
        "mean_spread_ms": float(np.mean([s["spread_ms"] for s in per_step])),
        "steps": per_step,
        "ranks": ranks,
    }


def rank_tables(report: RankedReport) -> list[tuple[str, pd.DataFrame]]:
    """Display tables of the ranks: one row per rank, collectives, phases, steps."""
    rows, collectives, phases = [], [], []
    for entry in report.ranks:
        who = {key: entry.info.get(key) for key in ("rank", "device", "pid")}
        comm = entry.comm
        rows.append(
            {
                **who,
                **entry.totals,
                "nccl_kernels": comm.kernels,
                "nccl_ms": comm.time_ms,
                "overlapped_ms": comm.overlapped_ms,
                "exposed_ms": comm.exposed_ms,
            }
        )
        collectives += [{"rank": who["rank"], **c} for c in comm.by_collective]
        table = entry.report.phases[["phase", "kernels", "gpu_time_ms"]]
        phases += [{"rank": who["rank"], **r} for r in table.to_dict(orient="records")]
    tables = [(f"Ranks — world size {report.world_size}", pd.DataFrame(rows))]
    if collectives:
        tables.append(("NCCL kernels by collective, per rank", pd.DataFrame(collectives)))
    tables.append(("Phases per rank", pd.DataFrame(phases)))
    if not report.steps.empty:
        title = "Steps across ranks — GPU span of each step; NCCL time waiting for the last rank"
        tables.append((title, report.steps))
    return tables


def ranks_markdown(report: RankedReport) -> str:
    """The rank tables as markdown sections (appended to the kernel report)."""
    from profkit.formats import markdown_table

    return "".join(
        f"\n## {title}\n\n{markdown_table(table, 2)}\n" for title, table in rank_tables(report)
    )


def step_kernels(entry: RankEntry, step: int) -> pd.DataFrame:
    """The kernels of one step of one rank: ``start``, ``end`` (ns) and ``nccl`` (bool)."""
    k = entry.trace.kernels
    starts = step_starts(entry.trace, _first_phase(entry))
    if not len(starts) or k.empty:
        return pd.DataFrame({"start": [], "end": [], "nccl": []})
    point = k["launch_start"].to_numpy(dtype=np.int64, na_value=-1)
    point = np.where(point >= 0, point, k["start"].to_numpy(np.int64))
    index = np.searchsorted(starts, point, side="right") - 1
    is_kernel = k["kind"].to_numpy(dtype=object) == "kernel"
    chosen = (index == step) & is_kernel
    return pd.DataFrame(
        {
            "start": k["start"].to_numpy(np.int64)[chosen],
            "end": k["end"].to_numpy(np.int64)[chosen],
            "nccl": is_nccl(k["name"])[chosen],
        }
    )
