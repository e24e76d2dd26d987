"""torch.profiler's ``key_averages()`` as a DataFrame with the course's columns.

Built from the ``FunctionEventAvg`` objects, not by parsing torch's printed table, so the
same rows render as a terminal table, markdown, CSV or JSON. The percentages use torch's
own denominators (``torch.autograd.profiler_util._build_table``): Self CPU % and CPU
total % divide by the summed self CPU time of every row; Self CUDA % divides by the
summed self device time of device-side rows that are not user annotations.

Torch renamed the CUDA fields (``self_cuda_time_total`` -> ``self_device_time_total``,
``cuda_time_total`` -> ``device_time_total``, ``cuda_time`` -> ``device_time``); both
spellings are read, the new one first (the old one warns on recent torch).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from profkit.errors import BadInput

if TYPE_CHECKING:  # imported where a table is built: `profkit torch --help` shows
    import pandas as pd  # SORT_CHOICES without importing pandas (tests/test_startup.py)

MIB = 1024**2
STACK_FRAMES = 2
"""Call-site frames kept (and grouped by) per row with ``--with-stack``."""
# Frames that say nothing about the call site, or split groups apart for nothing:
# built-in methods carry object addresses, ``nn.Module: Linear_14`` a per-instance index.
_NOISE_FRAMES = re.compile(r"^(<built-in |nn\.Module: )|torch/nn/modules/module\.py\(")
# Python frames recorded as events themselves (``file.py(12): fn``) when stacks are on.
_PYTHON_FRAME_ROW = re.compile(r"^(<built-in |nn\.Module: |.*\.py\(\d+\): )")

# Machine names (JSON) -> display headers: the course's columns, with units.
COLUMNS: dict[str, str] = {
    "name": "Name",
    "input_shapes": "Input Shapes",
    "stack": "Source Location",
    "self_cpu_pct": "Self CPU %",
    "self_cpu_ms": "Self CPU (ms)",
    "cpu_total_pct": "CPU total %",
    "cpu_total_ms": "CPU total (ms)",
    "cpu_avg_us": "CPU time avg (µs)",
    "self_cuda_ms": "Self CUDA (ms)",
    "self_cuda_pct": "Self CUDA %",
    "cuda_total_ms": "CUDA total (ms)",
    "cuda_avg_us": "CUDA time avg (µs)",
    "cpu_mem_mib": "CPU Mem (MiB)",
    "self_cpu_mem_mib": "Self CPU Mem (MiB)",
    "cuda_mem_mib": "CUDA Mem (MiB)",
    "self_cuda_mem_mib": "Self CUDA Mem (MiB)",
    "calls": "# of Calls",
}
CUDA_COLUMNS = ("self_cuda_ms", "self_cuda_pct", "cuda_total_ms", "cuda_avg_us")
PROFILER_MEMORY_COLUMNS = ("cpu_mem_mib", "self_cpu_mem_mib", "cuda_mem_mib", "self_cuda_mem_mib")

# --sort values (ours first, then torch's key_averages names) -> the column sorted on.
SORT_KEYS: dict[str, str] = {
    "self_cuda": "self_cuda_ms",
    "cuda_total": "cuda_total_ms",
    "self_cpu": "self_cpu_ms",
    "cpu_total": "cpu_total_ms",
    "calls": "calls",
    "cpu_avg": "cpu_avg_us",
    "cuda_avg": "cuda_avg_us",
    "cpu_mem": "cpu_mem_mib",
    "self_cpu_mem": "self_cpu_mem_mib",
    "cuda_mem": "cuda_mem_mib",
    "self_cuda_mem": "self_cuda_mem_mib",
    "self_cuda_time_total": "self_cuda_ms",
    "self_device_time_total": "self_cuda_ms",
    "cuda_time_total": "cuda_total_ms",
    "device_time_total": "cuda_total_ms",
    "self_cpu_time_total": "self_cpu_ms",
    "cpu_time_total": "cpu_total_ms",
    "count": "calls",
    "self_cpu_memory_usage": "self_cpu_mem_mib",
    "cpu_memory_usage": "cpu_mem_mib",
    "self_cuda_memory_usage": "self_cuda_mem_mib",
    "self_device_memory_usage": "self_cuda_mem_mib",
    "cuda_memory_usage": "cuda_mem_mib",
    "device_memory_usage": "cuda_mem_mib",
}
SORT_CHOICES = tuple(list(SORT_KEYS)[:11])
_DEVICE_TYPES = ("CUDA", "PrivateUse1", "MTIA", "XPU", "HIP")


def check_sort(sort: str | None, profile_memory: bool) -> None:
    """Reject an unknown ``--sort`` before anything runs."""
    if sort is None:
        return
    if sort not in SORT_KEYS:
        raise BadInput(f"unknown --sort {sort!r}; choose one of: {', '.join(SORT_CHOICES)}")
    if SORT_KEYS[sort] in PROFILER_MEMORY_COLUMNS and not profile_memory:
        raise BadInput(f"--sort {sort} needs --profile-memory")


@dataclass
class AveragesTable:
    """One key_averages table: every row, sorted, plus torch's summary totals."""

    rows: pd.DataFrame
    """Machine-named columns (see ``COLUMNS``), sorted, all rows (no row limit)."""
    sort: str
    """The sort key used (``self_cpu`` when CUDA sorting was asked for on a CPU run)."""
    self_cpu_total_ms: float
    self_cuda_total_ms: float | None
    """None when no device time was recorded (a CPU run)."""

    def top(self, row_limit: int) -> pd.DataFrame:
        return self.rows if row_limit <= 0 else self.rows.head(row_limit)

    def display(self, row_limit: int) -> pd.DataFrame:
        """The top rows with the course's column headers; long kernel names shortened.

        Demangled CUDA kernel names run to hundreds of characters; the table shows the
        short form profkit's kernel tables use (the JSON keeps the full names).
        """
        from profkit.analysis.names import short_kernel_name

        table = self.top(row_limit).copy()
        table["name"] = [n if len(n) <= 60 else short_kernel_name(n) for n in table["name"]]
        return table.rename(columns=COLUMNS)


def clean_stack(frames: list[str] | None) -> list[str]:
    """A recorded stack without the frames that hide the call site (see ``_NOISE_FRAMES``)."""
    return [f for f in frames or [] if f and not _NOISE_FRAMES.search(f)]


def averages_table(
    averages: Iterable[Any],
    sort: str | None = None,
    group_by_shape: bool = False,
    with_stack: bool = False,
    profile_memory: bool = False,
) -> AveragesTable:
    """Build the table from ``prof.key_averages(...)`` (a list of ``FunctionEventAvg``).

    ``sort=None`` sorts by self CUDA time when device time was recorded, else by self CPU
    time; a CUDA sort on a run without device time falls back to self CPU time. With
    ``with_stack`` the rows of the Python frames that torch records as events of their own
    are left out (they are the Source Location column); their time stays in the
    percentages' denominators, as in torch's own table.
    """
    import pandas as pd

    events = list(averages)
    self_cpu_sum = sum(_us(e, "self_cpu_time_total") for e in events)
    self_device_sum = sum(
        _us(e, "self_device_time_total", "self_cuda_time_total")
        for e in events
        if _is_device(e) and not getattr(e, "is_user_annotation", False)
    )
    has_device = any(_us(e, "self_device_time_total", "self_cuda_time_total") > 0 for e in events)
    if with_stack:
        events = [e for e in events if not _PYTHON_FRAME_ROW.match(str(e.key))]
    rows = [_row(e, self_cpu_sum, self_device_sum) for e in events]
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("input_shapes", "stack")])
    if group_by_shape:
        df.insert(1, "input_shapes", [str(getattr(e, "input_shapes", "") or "") for e in events])
    if with_stack:
        df.insert(1, "stack", [_stack(e) for e in events])
    if not has_device:
        df = df.drop(columns=list(CUDA_COLUMNS))
    if not profile_memory:
        df = df.drop(columns=list(PROFILER_MEMORY_COLUMNS))
    elif not has_device:
        df = df.drop(columns=["cuda_mem_mib", "self_cuda_mem_mib"])
    used = sort or ("self_cuda" if has_device else "self_cpu")
    column = SORT_KEYS.get(used, "self_cpu_ms")
    if column not in df.columns:
        used, column = "self_cpu", "self_cpu_ms"
    df = df.sort_values([column, "name"], ascending=[False, True], kind="stable")
    return AveragesTable(
        rows=df.reset_index(drop=True),
        sort=used,
        self_cpu_total_ms=self_cpu_sum / 1e3,
        self_cuda_total_ms=self_device_sum / 1e3 if has_device else None,
    )


def _row(e: Any, self_cpu_sum: float, self_device_sum: float) -> dict[str, Any]:
    count = int(getattr(e, "count", 0))
    self_cpu = _us(e, "self_cpu_time_total")
    cpu_total = _us(e, "cpu_time_total")
    self_dev = _us(e, "self_device_time_total", "self_cuda_time_total")
    dev_total = _us(e, "device_time_total", "cuda_time_total")
    return {
        "name": str(e.key),
        "self_cpu_pct": _pct(self_cpu, self_cpu_sum),
        "self_cpu_ms": self_cpu / 1e3,
        "cpu_total_pct": 0.0 if getattr(e, "is_async", False) else _pct(cpu_total, self_cpu_sum),
        "cpu_total_ms": cpu_total / 1e3,
        "cpu_avg_us": cpu_total / count if count else 0.0,
        "self_cuda_ms": self_dev / 1e3,
        "self_cuda_pct": _pct(self_dev, self_device_sum),
        "cuda_total_ms": dev_total / 1e3,
        "cuda_avg_us": dev_total / count if count else 0.0,
        "cpu_mem_mib": _us(e, "cpu_memory_usage") / MIB,
        "self_cpu_mem_mib": _us(e, "self_cpu_memory_usage") / MIB,
        "cuda_mem_mib": _us(e, "device_memory_usage", "cuda_memory_usage") / MIB,
        "self_cuda_mem_mib": _us(e, "self_device_memory_usage", "self_cuda_memory_usage") / MIB,
        "calls": count,
    }


def _us(event: Any, *names: str) -> float:
    """The first of ``names`` the event has (new spelling first), as a float."""
    for name in names:
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


def _is_device(event: Any) -> bool:
    return str(getattr(event, "device_type", "")).rsplit(".", 1)[-1] in _DEVICE_TYPES


def _stack(event: Any) -> str:
    return " <- ".join(clean_stack(getattr(event, "stack", None))[:STACK_FRAMES])
