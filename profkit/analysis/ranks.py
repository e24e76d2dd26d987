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

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.attribution import (
    UNATTRIBUTED,
    Attribution,
    PhaseMode,
    TraceHints,
    attribute,
    default_phase_domain,
)
from profkit.analysis.by_process import processes_of, restrict
from profkit.analysis.comm import Intervals, comm_stats_of, is_nccl
from profkit.analysis.report import Activities, check_options, tables_of
from profkit.analysis.report_types import RANK_FIELDS as RANK_FIELDS
from profkit.analysis.report_types import KernelReport
from profkit.analysis.report_types import RankedReport as RankedReport
from profkit.analysis.report_types import RankEntry as RankEntry
from profkit.analysis.steps import RankSteps, step_table
from profkit.analysis.tables import GRAPH, range_counts
from profkit.errors import BadInput
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT, Trace

NS_PER_MS = 1_000_000


def rank_processes(trace: Trace, pids: np.ndarray | None = None) -> list[dict[str, Any]]:
    """``{rank, world_size, device, pid, host}`` of each process that ran GPU activity
    (``pids``: :func:`kernel_processes` of the trace, where the caller has it)."""
    if trace.meta.get("ranks"):
        return [dict(r) for r in trace.meta["ranks"]]
    pids = kernel_processes(trace) if pids is None else pids
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


def analyze_ranks(
    trace: Trace,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    rank: int | None = None,
    phases: PhaseMode = "auto",
) -> RankedReport:
    """Tables of the whole trace (or of ``rank``), each rank's, and the job across ranks.

    The activities are attributed once; each rank's tables are built from its rows of that
    one attribution (:func:`~profkit.analysis.by_process.restrict`), which is what
    attributing the rank's rows alone would give.
    """
    pids = kernel_processes(trace)
    processes = rank_processes(trace, pids)
    if rank is not None and rank not in [p["rank"] for p in processes]:
        known = ", ".join(str(p["rank"]) for p in processes) or "none"
        raise BadInput(f"no rank {rank} in this trace; ranks: {known}")
    check_options(top, phases)
    att = attribute(trace.kernels, trace.ranges, None, TraceHints.of(trace.meta), phases)
    whole = _Whole.of(trace, att, pids)
    entries = [_rank_entry(whole, p, top, phase, range) for p in processes]
    chosen = [e for e in entries if rank is None or e.info["rank"] == rank]
    if rank is not None:
        report_of_all = chosen[0].report
    else:
        report_of_all = tables_of(
            att, whole.acts, trace.ranges, trace.meta, top, phase, range, whole.counts_of_all
        )
    fields = KernelReport.__dataclass_fields__
    report = RankedReport(**{f: getattr(report_of_all, f) for f in fields})
    report.source = {**report_of_all.source, "ranks": len(processes), "rank": rank}
    report.ranks = chosen
    report.steps = step_table([e.steps for e in entries])
    report.world_size = max([p.get("world_size") or 0 for p in processes] + [len(processes)])
    report.nodes = list(trace.meta.get("nodes") or [])
    return report


@dataclass
class _Whole:
    """The whole trace, attributed once, with the per-activity arrays each rank takes rows of."""

    trace: Trace
    att: Attribution
    acts: Activities
    intervals: Intervals
    pids: np.ndarray  # per activity: its process (:func:`kernel_processes`)
    range_pids: np.ndarray  # per range: its thread's process
    launch_start: np.ndarray  # -1: no launch call
    is_kernel: np.ndarray
    nccl: np.ndarray
    _counts: dict[str, np.ndarray] | None = None

    @classmethod
    def of(cls, trace: Trace, att: Attribution, pids: np.ndarray) -> _Whole:
        k = trace.kernels
        acts = Activities.of(k)
        is_kernel = k["kind"].to_numpy(dtype=object) == "kernel"
        threads = trace.ranges["thread"].to_numpy(np.int64)
        return cls(
            trace=trace,
            att=att,
            acts=acts,
            intervals=Intervals.of(k),
            pids=pids,
            range_pids=(threads >> PROCESS_SHIFT) & PROCESS_MASK,
            launch_start=k["launch_start"].to_numpy(dtype=np.int64, na_value=-1),
            is_kernel=is_kernel,
            # Once per distinct name: per rank it would factorize the names again.
            nccl=is_kernel & is_nccl(acts.names)[acts.name],
        )

    def attribution_of(self, rows: np.ndarray, range_rows: np.ndarray) -> Attribution | None:
        """What attributing these rows alone gives: the one attribution restricted to them;
        None where the rank would look for its phases in another NVTX domain."""
        r = self.trace.ranges
        ranges = r.iloc[range_rows]
        if default_phase_domain(ranges) != self.att.phase_domain:
            return None
        launched = self.launch_start[rows] >= 0
        threads = np.concatenate(
            [self.acts.launch_thread[rows][launched], ranges["thread"].to_numpy(np.int64)]
        )
        names = r["name"].to_numpy(dtype=object)
        return restrict(self.att, rows, range_rows, names, self.launch_start, processes_of(threads))

    def attributed_anew(self, rows: np.ndarray, ranges: pd.DataFrame) -> Attribution:
        """The attribution of these activities and ranges alone, made from scratch."""
        hints = TraceHints.of(self.trace.meta)
        kernels = self.trace.kernels.iloc[rows].reset_index(drop=True)
        return attribute(kernels, ranges, None, hints, self.att._mode)

    def counts_of_all(self) -> dict[str, np.ndarray]:
        """Per range: what every activity it encloses adds up to (``tables.range_counts``).

        A range's activities all belong to its process, so a rank's rows of these are what
        the rank's activities alone add up to."""
        if self._counts is None:
            kinds = self.acts.name_kinds[self.acts.name]
            self._counts = range_counts(self.att, kinds, self.acts.duration)
        return self._counts

    def counts_of(self, rows: np.ndarray, range_rows: np.ndarray) -> dict[str, np.ndarray]:
        """:meth:`counts_of_all` of one rank: its ranges' rows, ``graphs`` where it has any."""
        counts = {key: value[range_rows] for key, value in self.counts_of_all().items()}
        if "graphs" in counts and not (self.acts.name_kinds[self.acts.name[rows]] == GRAPH).any():
            del counts["graphs"]
        return counts


def _rank_entry(
    whole: _Whole, info: dict[str, Any], top: int, phase: str | None, range_: str | None
) -> RankEntry:
    process = info.get("process", info["pid"])  # merged nodes: a key of its own
    rows = np.flatnonzero(whole.pids == process)
    range_rows = np.flatnonzero(whole.range_pids == process)
    ranges = whole.trace.ranges.iloc[range_rows].reset_index(drop=True)
    att = whole.attribution_of(rows, range_rows)
    # Range totals of the one attribution hold for the rank only where it is the rank's.
    counts = None if att is None else (lambda: whole.counts_of(rows, range_rows))
    if att is None:
        att = whole.attributed_anew(rows, ranges)
    acts = whole.acts.take(rows)
    report = tables_of(att, acts, ranges, whole.trace.meta, top, phase, range_, counts)
    totals = {key: report.totals[key] for key in ("kernels", "kernel_time_ms", "gpu_time_ms")}
    names = [p for p in report.phases["phase"] if p != UNATTRIBUTED]
    intervals = whole.intervals.take(rows)
    is_kernel, nccl = whole.is_kernel[rows], whole.nccl[rows]
    first = names[0] if names else ""
    launch = whole.launch_start[rows]
    steps = RankSteps.of(int(info["rank"]), ranges, first, intervals, launch, is_kernel, nccl)
    mask = report.selected if report.selected is not None else np.ones(len(rows), dtype=bool)
    selected = intervals.take(mask)
    nccl_names = whole.acts.names[whole.acts.name[rows][mask][nccl[mask]]]
    comm = comm_stats_of(selected, is_kernel[mask], nccl[mask], nccl_names)
    return RankEntry(info, report, comm, totals, steps)


def rank_tables(report: RankedReport) -> list[tuple[str, pd.DataFrame]]:
    """Display tables of the ranks: one row per rank, collectives, phases, steps."""
    rows, collectives, phases = [], [], []
    # The host only where ranks span several (several nodes' reports): else one value.
    several_hosts = len({entry.info.get("host") for entry in report.ranks}) > 1
    keys = ("rank", "host", "device", "pid") if several_hosts else ("rank", "device", "pid")
    for entry in report.ranks:
        who = {key: entry.info.get(key) for key in keys}
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
    if report.nodes:
        tables.append(("Nodes — each report's clock against the first's", _node_table(report)))
    if collectives:
        tables.append(("NCCL kernels by collective, per rank", pd.DataFrame(collectives)))
    tables.append(("Phases per rank", pd.DataFrame(phases)))
    if not report.steps.empty:
        title = "Steps across ranks — GPU span of each step; NCCL time waiting for the last rank"
        tables.append((title, report.steps))
    return tables


def _node_table(report: RankedReport) -> pd.DataFrame:
    """One row per node: its file, host, ranks and how its clock was aligned."""
    rows = []
    for node in report.nodes:
        ranks = node["ranks"]
        rows.append(
            {
                "node": node["path"],
                "host": node["host"],
                "ranks": f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0]),
                "session_start_ms": node["base_ms"],
                "clock_offset_us": _us(node["offset_ms"]),
                "spread_us": _us(node["spread_ms"]),
                "paired": node["pairs"],
                "agreeing": node["agreeing"],
                "offset_taken_out": _taken_out(node),
            }
        )
    return pd.DataFrame(rows)


def _taken_out(node: dict[str, Any]) -> str:
    if node["applied"]:
        return "yes"
    return "no (ambiguous)" if node["ambiguous"] else "no"


def _us(ms: float | None) -> float | None:
    return None if ms is None else ms * 1000


def ranks_markdown(report: RankedReport) -> str:
    """The rank tables as markdown sections (appended to the kernel report)."""
    from profkit.formats import markdown_table

    return "".join(
        f"\n## {title}\n\n{markdown_table(table, 2)}\n" for title, table in rank_tables(report)
    )
