"""What every reader's compact columns share, whatever the format.

Nsight Systems exports and torch.profiler Chrome traces meet here, so every analysis
works on both. Times are integer nanoseconds on one clock per trace (ranges and kernel
launches share it; GPU times are on the same clock in both formats). The GPU activities
are compact columns (:mod:`.columns`); the annotation ranges are one small table:

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
from typing import Any

import pandas as pd

from profkit.errors import BadInput

# Text columns hold Python str objects ("python" storage), never Arrow buffers. pandas 3's
# plain "string" picks pyarrow storage wherever pyarrow is installed, which copies every
# row's text into the buffer: 3 M kernel rows of long demangled names took 2.9 GiB and
# 3 s more to read (H100 machine), where python storage lets rows share a few str objects.
STRING = pd.StringDtype("python")

KINDS = ("kernel", "memcpy", "memset", "graph")
"""The kinds of GPU activity: kernel launches, copies, memsets, and
whole CUDA graphs (nsys ``--cuda-graph-trace=graph``). Counts are reported per kind."""

NCCL_PREFIX = re.compile(r"^\s*nccl", re.IGNORECASE)
"""Names of NCCL's kernels, whatever the generation (``ncclKernel_AllReduce_RING_LL_Sum_float``,
``ncclDevKernel_SendRecv``, ...): the one rule for the loader (which exports are nodes of a
job) and the analysis (communication per rank; docs/MULTI_GPU.md)."""

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


def empty_ranges() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in RANGE_COLUMNS.items()})


def conform(df: pd.DataFrame, columns: dict[str, Any]) -> pd.DataFrame:
    """Select and type the schema's columns in order (raises KeyError if one is missing)."""
    return df[list(columns)].astype(columns).reset_index(drop=True)


# A capture of a few hours spans ~2^44 ns; a span past this (about 13 days) means a
# timestamp is damaged, and analysis that packs (thread, time) into one int64 cannot work.
MAX_SPAN_NS = 1 << 50


def check_span(low: int, high: int, path: str) -> None:
    """Raise :class:`BadInput` if times from ``low`` to ``high`` (ns) span more than
    ``MAX_SPAN_NS``: one timestamp from another era (a damaged cell, ``2**63 - 1``) would
    otherwise fail deep inside the analysis, which packs (thread, time) into one int64."""
    if high - low > MAX_SPAN_NS:
        days = (high - low) / 86_400e9
        raise BadInput(
            f"{path}: its timestamps span {days:,.0f} days "
            f"(from {low:,} to {high:,} ns): a damaged timestamp, not a capture"
        )
