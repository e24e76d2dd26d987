"""What a kernel report is: :class:`KernelReport`, the ranked
:class:`RankedReport` with its :class:`RankEntry` per rank, the JSON columns they promise
(:data:`CONTRACT`), and the ``source`` every report opens with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.comm import CommStats
from profkit.analysis.steps import RankSteps, job_summary
from profkit.analysis.tables import COUNT_COLUMNS
from profkit.formats import Encoded, dumps, encoded_object

# What ``--format json`` promises (docs/JSON.md, ``profkit kernels``): exactly these keys,
# plus ``graphs`` after ``memset`` where the trace holds whole CUDA graphs.
CONTRACT = {
    "phases": ["phase", "kernels", "memcpy", "memset", "kernel_time_ms", "gpu_time_ms", "share"],
    "ranges": [
        "range", "instances", "kernels", "memcpy", "memset", "kernel_time_ms", "gpu_time_ms",
    ],
    "kernels": [
        "name", "phase", "category", "kind", "instances", "total_ms", "share",
        "avg_us", "med_us", "min_us", "max_us", "std_us",
    ],
    "categories": ["phase", "category", "kernels", "memcpy", "memset", "gpu_time_ms", "share"],
}  # fmt: skip
# Then, where the table has them, the columns the other formats show (JSON carries every
# column, as csv and md do): a phase's and a range's own wall time and, for phases, the
# run's Python timing (a profkit capture); a range's analytic MFLOP and TFLOP/s; a kernel's
# short name and its launch grid and block.
EXTRA = {
    "phases": ["instances", "cpu_time_ms", "python_ms"],
    "ranges": ["cpu_time_ms", "mflop", "tflop_s"],
    "kernels": ["short_name", "grid", "block"],
    "categories": [],
}
RANK_FIELDS = ("rank", "device", "pid", "host")


@dataclass
class KernelReport:
    """The tables of one trace. Shares are fractions (0-1).

    ``kernels`` has one row per (kernel name, phase), its share being of that phase's GPU
    time; ``overall`` one row per kernel name across phases (phase ``all``), its share of
    the total. ``categories``' share is of its phase's GPU time; ``phases``' of the total.
    """

    source: dict[str, Any]
    totals: dict[str, Any]
    phases: pd.DataFrame
    ranges: pd.DataFrame
    kernels: pd.DataFrame
    overall: pd.DataFrame
    categories: pd.DataFrame
    top: int = 20
    notes: list[str] = field(default_factory=list)
    selected: np.ndarray | None = None
    """Which of the trace's activities these tables count (after ``phase``/``range``)."""
    findings: list[dict[str, Any]] | None = None
    """What to fix first (:mod:`profkit.analysis.findings`), largest ``recoverable_ms``
    first; None where they were not asked for."""
    gap_marks: Mapping[int | None, pd.DataFrame] = field(default_factory=dict)
    """Per rank (None for one process): the GPU-idle gaps the host findings attribute, by
    cause (:func:`~profkit.analysis.findings.findings_of`); the lanes picture marks them."""

    @property
    def activities(self) -> int:
        """GPU activities of every kind (0 for a CPU-only trace)."""
        return sum(int(self.totals.get(c, 0)) for c in COUNT_COLUMNS.values())

    def top_kernels(self, phase: str | None = None, n: int | None = None) -> pd.DataFrame:
        """The ``n`` (default ``top``; 0 = all) kernels with the most GPU time overall or in a phase."""
        n = self.top if n is None else n
        table = self.overall if phase is None else self.kernels[self.kernels["phase"] == phase]
        return (table.head(n) if n else table).reset_index(drop=True)

    def to_json(self) -> dict[str, Any]:
        """The ``profkit kernels`` JSON (docs/JSON.md); ``kernels`` holds each phase's top rows."""
        kernels = self.kernels
        if self.top:
            kernels = kernels.groupby("phase", sort=False).head(self.top)
        return {
            "source": self.source,
            "totals": self.totals,
            "phases": table_records(self.phases, CONTRACT["phases"]),
            "ranges": table_records(self.ranges, CONTRACT["ranges"]),
            "kernels": table_records(kernels, CONTRACT["kernels"]),
            "categories": table_records(self.categories, CONTRACT["categories"]),
            **({} if self.findings is None else {"findings": self.findings}),
        }


@dataclass
class RankEntry:
    """One rank: who it is, its tables and its communication."""

    info: dict[str, Any]
    report: KernelReport
    comm: CommStats
    totals: dict[str, Any]
    steps: RankSteps
    # No copy of the rank's trace is kept: the copies of every rank would double the peak.
    tables_text: Encoded | None = None
    """Its tables as JSON text, made already (where a node was analysed: :meth:`encode`)."""
    tables_kept: bool = True
    """False: its report's tables other than its phases were given up (:meth:`encode`)."""

    def to_json(self) -> dict[str, Any] | Encoded:
        who = {key: self.info.get(key) for key in RANK_FIELDS}
        if self.tables_text is not None:
            return encoded_object(who, self.tables_text)
        return {**who, **self.made_json()}

    def encode(self, keep_tables: bool = True) -> None:
        """Make its tables' JSON text now (on the worker that analysed its node: the
        client then only writes it in). ``keep_tables`` False: its report then keeps only
        its source, totals, notes and phase table (what the job's views read of a rank;
        its other tables are in the text), which is most of what a worker sends."""
        self.tables_text = Encoded(dumps(self.made_json()))
        if not keep_tables:
            r = self.report
            self.report = replace(
                r, ranges=r.ranges.iloc[:0], kernels=r.kernels.iloc[:0],
                overall=r.overall.iloc[:0], categories=r.categories.iloc[:0], selected=None,
            )  # fmt: skip
            self.tables_kept = False

    def made_json(self) -> dict[str, Any]:
        """Its totals and tables as JSON (what does not depend on who it is in the job)."""
        if self.tables_text is not None:
            return json.loads(self.tables_text)
        return {
            **self.totals,
            "phases": table_records(self.report.phases, CONTRACT["phases"]),
            "kernels_top": [
                {k: v for k, v in row.items() if k != "phase"}
                for row in self.report.top_kernels().to_dict(orient="records")
            ],
            "categories": table_records(self.report.categories, CONTRACT["categories"]),
            "comm": self.comm.to_json(),
        }


@dataclass
class RankedReport(KernelReport):
    """A :class:`KernelReport` plus ``ranks`` and the ``job`` across them."""

    ranks: list[RankEntry] = field(default_factory=list)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    world_size: int = 0
    every_rank: list[dict[str, Any]] = field(default_factory=list)
    """Every rank's info (``rank``, ``pid``, ...), whichever ``--rank`` keeps in ``ranks``:
    what is found across ranks (a straggler) reads them all."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """Several nodes' reports read as one job: each node's file, host, ranks and clock
    (:class:`profkit.analysis.clocks.NodeClock`); empty for one report."""

    _job: tuple[pd.DataFrame, dict[str, Any]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def job(self) -> dict[str, Any]:
        """The JSON's ``job`` (:func:`.steps.job_summary` of its steps), made once: the
        findings, the job's tables and the JSON all read it (1,024 ranks: 0.15 s each)."""
        if self._job is None or self._job[0] is not self.steps:
            self._job = (self.steps, job_summary(self.steps, self.world_size))
        return self._job[1]

    def to_json(self) -> dict[str, Any]:
        base = super().to_json()
        base["ranks"] = [entry.to_json() for entry in self.ranks]
        base["job"] = self.job()
        if self.nodes:
            base["nodes"] = self.nodes
        if "findings" in base:  # last, as in a one-process report
            base["findings"] = base.pop("findings")
        return base


def table_records(table: pd.DataFrame, columns: list[str]) -> list[dict[str, Any]]:
    """The JSON rows of a report table: ``columns`` (and ``graphs`` after ``memset``), then
    the :data:`EXTRA` columns it has."""
    kind = next((k for k, v in CONTRACT.items() if v == columns), None)
    columns = columns + [c for c in EXTRA.get(kind or "", []) if c in table and c not in columns]
    if "graphs" in table and "memset" in columns:
        columns = [
            *columns[: columns.index("memset") + 1],
            "graphs",
            *columns[columns.index("memset") + 1 :],
        ]
    records = table[columns].to_dict(orient="records") if len(table) else []
    extra = set(columns) - set(CONTRACT.get(kind or "", []))
    for record in records:  # an extra that does not apply (a range's mflop) is null
        for key in extra & record.keys():
            value = record[key]
            if isinstance(value, float) and value != value:
                record[key] = None
    return records


def run_config(sidecar: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any] | None:
    """The run's config: the sidecar's beside the trace, else the trace's own (a Chrome
    trace written by ``profkit torch`` carries it in its header)."""
    for config in (sidecar.get("config"), meta.get("config")):
        if isinstance(config, dict):
            return config
    return None


def source_of(
    meta: dict[str, Any],
    phase: str | None,
    range_: str | None,
    top: int,
    config: dict[str, Any] | None,
) -> dict[str, Any]:
    """The report's ``source``: the trace's path and format, what its reader dropped or
    clamped, the run's config, and the query."""
    source = {"path": meta.get("path"), "format": meta.get("format")}
    # What the reader dropped or clamped (negative durations, non-finite times): counts
    # appear only when non-zero, beside the warnings that say why.
    for key in ("tool", "tool_version", "gpu", "dropped_events", "clamped_activities",
                "clamped_ranges"):  # fmt: skip
        if meta.get(key):
            source[key] = meta[key]
    if config:
        source["config"] = config
    source.update(phase=phase, range=range_, top=top)
    return source
