"""The two tables every trace reader returns, whatever the backend.

Nsight Systems exports and torch.profiler Chrome traces meet here, so every analysis
works on both. Times are integer nanoseconds on one clock per trace (ranges and kernel
launches share it; GPU times are on the same clock in both formats).

``kernels`` — one row per GPU activity (kernel, memcpy or memset):

=================  =========================================================
name               full (demangled) kernel name; ``[memcpy HtoD]`` style for copies
short_name         short name (nsys ``shortName``; the reader derives one otherwise)
kind               one of :data:`KINDS`: ``kernel`` | ``memcpy`` | ``memset`` | ``graph``
                   (a whole CUDA graph traced as one activity)
start, end         GPU start and end, ns
device, stream     device index and stream id
correlation_id     ties the activity to its launching API call
grid, block        ``"x,y,z"`` strings (empty for copies)
launch_start       start of the launching runtime/driver API call, ns (NA if unknown)
launch_thread      global id of the thread that made the launch call (NA if unknown)
=================  =========================================================

``ranges`` — one row per annotation range (NVTX push/pop or start/end, record_function):

=================  =========================================================
name               range text
start, end         ns
thread             global id of the thread that opened it
depth              nesting depth on its thread, 0 = outermost
domain             NVTX domain name ("" for the default domain)
=================  =========================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profkit.errors import BadInput

# Text columns hold Python str objects ("python" storage), never Arrow buffers. pandas 3's
# plain "string" picks pyarrow storage wherever pyarrow is installed, which copies every
# row's text into the buffer: 3 M kernel rows of long demangled names took 2.9 GiB and
# 3 s more to read (H100 machine), where python storage lets rows share a few str objects.
STRING = pd.StringDtype("python")

KINDS = ("kernel", "memcpy", "memset", "graph")
"""The values of the kernels table's ``kind`` column: kernel launches, copies, memsets, and
whole CUDA graphs (nsys ``--cuda-graph-trace=graph``). Counts are reported per kind."""

NCCL_PREFIX = re.compile(r"^\s*nccl", re.IGNORECASE)
"""Names of NCCL's kernels, whatever the generation (``ncclKernel_AllReduce_RING_LL_Sum_float``,
``ncclDevKernel_SendRecv``, ...): the one rule for the loader (which exports are nodes of a
job) and the analysis (communication per rank; docs/MULTI_GPU.md)."""

KERNEL_COLUMNS: dict[str, Any] = {
    "name": STRING,
    "short_name": STRING,
    "kind": STRING,
    "start": "int64",
    "end": "int64",
    "device": "int64",
    "stream": "int64",
    "correlation_id": "int64",
    "grid": STRING,
    "block": STRING,
    "launch_start": "Int64",
    "launch_thread": "Int64",
}
RANGE_COLUMNS: dict[str, Any] = {
    "name": STRING,
    "start": "int64",
    "end": "int64",
    "thread": "int64",
    "depth": "int64",
    "domain": STRING,
}

# Thread ids (``thread``, ``launch_thread``) are laid out as an nsys ``globalTid``: the
# thread id in bits 0-23, the process id in bits 24-47, nsys's VM bits above. Chrome traces
# are given the same layout (:mod:`.ranks`). ``thread >> PROCESS_SHIFT`` alone keeps the VM
# bits too: a process key that stays unique; ``& PROCESS_MASK`` after it is the pid.
PROCESS_SHIFT = 24
THREAD_MASK = (1 << PROCESS_SHIFT) - 1
PROCESS_MASK = (1 << 24) - 1


def empty_kernels() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in KERNEL_COLUMNS.items()})


def empty_ranges() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in RANGE_COLUMNS.items()})


def conform(df: pd.DataFrame, columns: dict[str, Any]) -> pd.DataFrame:
    """Select and type the schema's columns in order (raises KeyError if one is missing)."""
    return df[list(columns)].astype(columns).reset_index(drop=True)


@dataclass
class Trace:
    """What a reader returns: the two tables plus facts about the source."""

    kernels: pd.DataFrame
    ranges: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    """``path``, ``format`` (``nsys-sqlite`` | ``chrome``), and what the reader knows:
    tool version, GPU name, the profkit run config from a sidecar file, warnings."""


# A capture of a few hours spans ~2^44 ns; a span past this (about 13 days) means a
# timestamp is damaged, and analysis that packs (thread, time) into one int64 cannot work.
MAX_SPAN_NS = 1 << 50


def check_time_span(trace: Trace) -> Trace:
    """Raise :class:`BadInput` if the trace's times span more than ``MAX_SPAN_NS``; return it.

    Every reader's result passes here (``load_trace``): one timestamp from another era (a
    damaged cell, ``2**63 - 1``) would otherwise fail deep inside the analysis.
    """
    k, r = trace.kernels, trace.ranges
    columns = [k["start"], k["end"], k["launch_start"].dropna(), r["start"], r["end"]]
    values = [c.to_numpy(np.int64) for c in columns if len(c)]
    if not values:
        return trace
    low = min(int(v.min()) for v in values)
    high = max(int(v.max()) for v in values)
    check_span(low, high, trace.meta.get("path", "the trace"))
    return trace


def check_span(low: int, high: int, path: str) -> None:
    """Raise :class:`BadInput` if times from ``low`` to ``high`` (ns) span more than
    ``MAX_SPAN_NS``: :func:`check_time_span`'s check, for readers that see the times
    without building the tables."""
    if high - low > MAX_SPAN_NS:
        days = (high - low) / 86_400e9
        raise BadInput(
            f"{path}: its timestamps span {days:,.0f} days "
            f"(from {low:,} to {high:,} ns): a damaged timestamp, not a capture"
        )
