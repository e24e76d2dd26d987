"""What a ``profkit torch`` run made: its options, one profiled run per mode, the files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit.errors import BadInput
from profkit.formats import plural
from profkit.torchprof.tables import AveragesTable, check_sort
from profkit.workload.config import WorkloadConfig

MODE_TITLES = {
    "forward": "Forward only",
    "forward-backward": "Full step: forward + backward",
    "train": "Full step: forward + backward + optimizer",
}


@dataclass(frozen=True)
class TorchOptions:
    """What torch.profiler records and how the table is cut."""

    record_shapes: bool = False
    with_stack: bool = False
    profile_memory: bool = False
    sort: str | None = None
    """A ``SORT_KEYS`` name; None: self CUDA time on CUDA, self CPU time otherwise."""
    row_limit: int = 25
    """Rows shown per table; 0 shows all."""
    group_by_shape: bool = False
    """One row per (op, input shapes); turns on ``record_shapes``."""

    def __post_init__(self) -> None:
        check_sort(self.sort, self.profile_memory)
        if self.row_limit < 0:
            raise BadInput(f"--row-limit must be 0 (all rows) or more, got {self.row_limit}")


@dataclass
class ProfiledRun:
    """One profiled run: its table, trace and step times."""

    mode: str
    table: AveragesTable
    trace_path: Path
    step_ms: list[float]
    """Wall time of each profiled step (profiler overhead included)."""


@dataclass
class TorchProfile:
    """What ``profkit torch`` made: one run per mode, the files, and warnings."""

    name: str
    config: WorkloadConfig
    device: str
    options: TorchOptions
    runs: list[ProfiledRun] = field(default_factory=list)
    report_path: Path | None = None
    warnings: list[str] = field(default_factory=list)

    def tables(self) -> list[tuple[str, Any]]:
        """(title, display table) per run, row limit applied."""
        return [(self.title(run), run.table.display(self.options.row_limit)) for run in self.runs]

    def title(self, run: ProfiledRun) -> str:
        c = self.config
        return (
            f"{MODE_TITLES.get(run.mode, run.mode)} — {c.size}, ctx {c.ctx}, {c.dtype}, "
            f"{self.device}, {plural(len(run.step_ms), 'step')}, sorted by {run.table.sort}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``--format json`` contract."""
        return {
            "name": self.name,
            "config": self.config.to_dict(),
            "device": self.device,
            "options": {
                "record_shapes": self.options.record_shapes or self.options.group_by_shape,
                "with_stack": self.options.with_stack,
                "profile_memory": self.options.profile_memory,
                "group_by_shape": self.options.group_by_shape,
                "row_limit": self.options.row_limit,
            },
            "report_path": str(self.report_path) if self.report_path else None,
            "warnings": self.warnings,
            "runs": [
                {
                    "mode": run.mode,
                    "trace_path": str(run.trace_path),
                    "sort": run.table.sort,
                    "step_ms": run.step_ms,
                    "self_cpu_total_ms": run.table.self_cpu_total_ms,
                    "self_cuda_total_ms": run.table.self_cuda_total_ms,
                    "rows_total": len(run.table.rows),
                    "rows": run.table.top(self.options.row_limit),
                }
                for run in self.runs
            ],
        }
