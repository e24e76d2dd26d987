"""Findings: what to fix first, with the evidence and the milliseconds it would save.

Each rule is a small function over what the engine already computed (the report's tables,
its ranks and job) and, for the host-side rules, each process's GPU intervals and API
calls (:class:`~profkit.traces.host_calls.HostTrace`). Each yields findings
``{kind, severity, recoverable_ms, share, rank, phase, evidence, advice}``; docs/FINDINGS.md
lists the rules, their thresholds and how ``recoverable_ms`` is estimated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pandas as pd

from profkit.analysis.findings.copies import pageable_copy
from profkit.analysis.findings.host import host_findings, span_of
from profkit.analysis.findings.model import Finding
from profkit.analysis.findings.optimizer import unfused_optimizer
from profkit.analysis.findings.precision import fp32_gemm
from profkit.analysis.findings.ranks import exposed_comm, straggler
from profkit.analysis.phase_marks import PhaseRanges, under_phase_names
from profkit.traces.job import NSYS_FORMAT
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT

if TYPE_CHECKING:
    from profkit.analysis.report_types import KernelReport
    from profkit.traces.columns import ActivityColumns
    from profkit.traces.host_calls import HostTrace

__all__ = [
    "Finding",
    "HostPart",
    "finding_line",
    "findings_markdown",
    "findings_of",
    "host_part",
    "host_side",
]
TOP_FINDINGS = 5
"""How many findings the terminal and markdown show (JSON has them all)."""


def findings_of(
    report: KernelReport,
    files: list[ActivityColumns],
    hosts: list[HostTrace],
    host_found: HostPart | None = None,
    phase_ranges: PhaseRanges | None = None,
) -> tuple[list[dict[str, Any]], list[str], GapMarks]:
    """The report's findings as JSON objects, largest ``recoverable_ms`` first; the notes
    of rules the traces could not feed (each said once); per rank (None for one process)
    the GPU-idle gaps the host findings attribute, by cause (``start``, ``end``,
    ``launch``, ``cause``: ``idle``, ``sync`` or ``launch``), for the lanes picture.
    ``host_found``: the host side, found already (:func:`host_part`, where each node's
    file lies); ``phase_ranges``: the marks ``--phase-ranges`` made the phases."""
    part = host_part(report, files, hosts, phase_ranges) if host_found is None else host_found
    every, notes = list(part.found), list(part.notes)
    shown = {int(e.info["rank"]) for e in getattr(report, "ranks", None) or []}
    # --rank R shows rank R's host findings; the straggler's bound is its own host idle,
    # whichever rank is shown
    found = [f for f in every if f.rank is None or f.rank in shown]
    gpu_side = unfused_optimizer(report) + fp32_gemm(report, _gpu_name(report, files), notes)
    span_ns = sum(span for rank, span in part.spans if rank is None or rank in shown)
    for f in gpu_side if span_ns else []:
        # GPU time given back shortens the steps only where the GPU is the bottleneck:
        # its share is of the captured span (in a launch-bound run, a small one)
        f.measured_over(span_ns / 1e6)
    found += gpu_side
    found += exposed_comm(report)
    idle = {f.rank: f.evidence["by_step_ms"] for f in every if f.kind == "host_idle"}
    found += straggler(report, idle)
    found.sort(key=lambda f: -f.recoverable_ms)
    marks: dict[int | None, list[pd.DataFrame]] = {}
    for f in found:
        if f.gaps is not None:
            marks.setdefault(f.rank, []).append(f.gaps)
    return [f.to_json() for f in found], list(dict.fromkeys(notes)), GapMarks(marks)


class GapMarks(Mapping[int | None, pd.DataFrame]):
    """Per rank (None: one process), the gaps its findings attribute, in start order:
    made when a picture asks for a rank's (a frame a rank costs ms, 1,024 ranks a second)."""

    def __init__(self, parts: dict[int | None, list[pd.DataFrame]]) -> None:
        self._parts: dict[int | None, list[pd.DataFrame]] = parts
        self._made: dict[int | None, pd.DataFrame] = {}

    def __getitem__(self, rank: int | None) -> pd.DataFrame:
        if rank not in self._made:
            gaps = pd.concat(self._parts[rank]).sort_values("start", ignore_index=True)
            self._made[rank] = gaps
        return self._made[rank]

    def __iter__(self) -> Iterator[int | None]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)


@dataclass
class HostPart:
    """The host side of the findings: every process's (rank's) host findings, whichever
    ``--rank`` is shown, the notes of rules its trace could not feed, and each process's
    captured span (ns), over which GPU-side findings are measured."""

    found: list[Finding]
    notes: list[str]
    spans: list[tuple[int | None, int]]

    def renumbered(self, first: int) -> HostPart:
        """This part with ranks counted from ``first`` (a node's, in its job)."""
        return HostPart(
            [replace(f, rank=None if f.rank is None else first + f.rank) for f in self.found],
            self.notes,
            [(None if r is None else first + r, span) for r, span in self.spans],
        )


def host_part(
    report: KernelReport,
    files: list[ActivityColumns],
    hosts: list[HostTrace],
    phase_ranges: PhaseRanges | None = None,
) -> HostPart:
    """The host side of the findings of every process (rank) of the report."""
    ranks = getattr(report, "every_rank", None) or [e.info for e in getattr(report, "ranks", [])]
    return host_side(report.phases, ranks, files, hosts, phase_ranges)


def host_side(
    phase_table: pd.DataFrame,
    ranks: list[dict[str, Any]],
    files: list[ActivityColumns],
    hosts: list[HostTrace],
    phase_ranges: PhaseRanges | None = None,
) -> HostPart:
    """:func:`host_part` of a report whose phase table and ranks' infos (none: one
    process) are these. Its marks are read under their phases' names, as the report's
    phases were found (``phase_ranges``: ``--phase-ranges``)."""
    found: list[Finding] = []
    notes: list[str] = []
    phases = {str(p) for p in phase_table["phase"]} if "phase" in phase_table else set()
    named = [under_phase_names(f.ranges, phase_ranges) for f in files]
    processes = _processes(ranks, files, hosts, named)
    for process in processes:
        found += host_findings(*process, notes, phases)
        found += pageable_copy(*process, notes, phases)
    return HostPart(found, notes, [(p[2], span_of(p[0])) for p in processes])


def _processes(
    ranks: list[dict[str, Any]],
    files: list[ActivityColumns],
    hosts: list[HostTrace],
    named: list[pd.DataFrame],
) -> list[tuple[HostTrace, Any, int | None]]:
    """(host trace, phase ranges, rank) per process: one for one process, one per rank
    (every rank, whichever ``--rank`` shows); ``named``: each file's ranges, its marks
    under their phases' names."""
    if not ranks:
        return [(hosts[0], named[0], None)]
    out: list[tuple[HostTrace, Any, int | None]] = []
    # (one per-rank trace alone: its rank analysed where it lies, profkit.analysis.node_parts)
    chrome = files[0].meta.get("format") != NSYS_FORMAT
    per_rank = len(hosts) == len(ranks) and (len(hosts) > 1 or chrome)
    for index, info in enumerate(ranks):
        pid, rank = info.get("pid"), int(info["rank"])
        if per_rank:  # per-rank traces: one file each
            # the ranks come in rank order, the files as given: matched by path
            paths = [str(f.meta.get("path")) for f in files]
            at = paths.index(str(info["path"])) if str(info.get("path")) in paths else index
            out.append((hosts[at], named[at], rank))
        else:  # one export of several processes, or several nodes' exports
            # a node's file first where the rank names it (pids of two hosts can be equal)
            own = [
                i for i, f in enumerate(files) if str(f.meta.get("path")) == str(info.get("path"))
            ]
            seen = [i for i in own + list(range(len(hosts))) if (hosts[i].gpu_pid == pid).any()]
            at = seen[0] if seen else 0
            ranges = named[at]
            mine = ((ranges["thread"].to_numpy() >> PROCESS_SHIFT) & PROCESS_MASK) == pid
            out.append((hosts[at].of_process(pid), ranges[mine], rank))
    return out


def _gpu_name(report: KernelReport, files: list[ActivityColumns]) -> str | None:
    """The GPU's model as the trace names it (nsys: the export's ``gpu``; Chrome: its
    ``deviceProperties``)."""
    named = report.source.get("gpu") or next(
        (g for f in files for g in f.meta.get("gpus") or [] if g), None
    )
    return str(named) if named else None


def finding_line(finding: dict[str, Any]) -> str:
    """One line: what, where, the milliseconds it would give back, the number that matters."""
    who = "" if finding["rank"] is None else f"rank {finding['rank']}: "
    where = "" if not finding["phase"] else f" ({finding['phase']})"
    ev = finding["evidence"]
    extra = {
        "host_idle": lambda: f"{ev['per_step_ms']:.2f} ms a step, {ev['where']}",
        "host_sync": lambda: f"{ev['count']} syncs",
        "launch_bound": lambda: (
            f"GPU busy {ev['busy_share']:.0%}, median kernel {ev['kernel_us']['p50']:.1f} µs"
        ),
        "unfused_optimizer": lambda: f"{ev['kernels']} foreach kernels, {ev['time_ms']:.2f} ms",
        "exposed_comm": lambda: (
            f"{ev['exposed_ms']:.2f} ms exposed, {ev['wait_ms']:.2f} ms of it waiting"
        ),
        "straggler": lambda: f"last in {ev['count']} of {ev['steps']} steps",
        "fp32_gemm": lambda: f"{ev['kernels']} fp32 GEMM kernels, {ev['time_ms']:.2f} ms",
        "pageable_copy": lambda: f"{ev['count']} copies, {ev['bytes'] / 2**20:.1f} MiB",
    }.get(finding["kind"], lambda: "")()
    return (
        f"[{finding['severity']}] {who}{finding['kind']}{where}: "
        f"{finding['recoverable_ms']:.2f} ms recoverable ({finding['share']:.0%}); {extra}"
    )


def findings_markdown(findings: list[dict[str, Any]] | None, top: int = TOP_FINDINGS) -> str:
    """The short "Findings" section (empty when findings were not asked for)."""
    if findings is None:
        return ""
    lines = ["## Findings", ""]
    if not findings:
        lines.append("No finding: nothing the rules (docs/FINDINGS.md) look for stands out.")
    lines += [f"- {finding_line(f)}" for f in findings[:top]]
    if len(findings) > top:
        lines.append(f"- ... {len(findings) - top} more in `--format json`")
    return "\n".join(lines) + "\n"
