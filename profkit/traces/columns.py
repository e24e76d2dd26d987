"""GPU activity as compact columns: what a kernel report needs, at a few bytes per activity.

A :class:`~profkit.traces.schema.Trace` keeps twelve columns per activity, text included:
at 30 million kernels that is over 8 GiB. The kernel report needs only each activity's
name, duration, launch shape and launching call, so :class:`ActivityColumns` keeps those
as integer codes (26 bytes per activity) beside small lookup tables, and the analysis
(:mod:`profkit.analysis.streaming`) walks them in chunks. Readers that stream
(:mod:`profkit.traces.nsys_stream`) build them directly; :func:`from_trace` converts any
reader's tables, and the cache (:mod:`profkit.traces.cache`) stores them as Parquet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profkit.errors import BadInput
from profkit.traces.schema import MAX_SPAN_NS, Trace

Progress = Callable[[int, int], None]
"""``progress(rows_done, rows_total)``: called by long reads as they go."""

ARRAYS = {
    "name": np.int32,  # index into ``names``
    "shape": np.int32,  # index into ``shapes`` (grid, block)
    "duration": np.int64,  # ns, end - start
    "launch_start": np.int64,  # ns; -1 when the launch call is unknown
    "launch_thread": np.int16,  # index into ``threads``; -1 when unknown
}


@dataclass
class ActivityColumns:
    """One entry per GPU activity in each array of :data:`ARRAYS`, plus lookup tables."""

    arrays: dict[str, np.ndarray]
    names: list[str]
    """Full activity names (``[CUDA memcpy Host-to-Device]`` for copies)."""
    kinds: list[str]
    """``kernel`` | ``memcpy`` | ``memset`` | ``graph``, one per entry of ``names``."""
    shapes: list[tuple[str, str]]
    """(grid, block) as ``"x,y,z"`` strings; ``("", "")`` for copies."""
    threads: np.ndarray
    """Global thread ids the ``launch_thread`` codes index."""
    ranges: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrays["name"])

    def launch_bounds(self) -> tuple[int, int] | None:
        """Earliest and latest known launch start (None if none is known), chunk by chunk."""
        low, high = None, None
        launch = self.arrays["launch_start"]
        for lo in range(0, len(launch), 1 << 20):  # no full-length temporaries
            known = launch[lo : lo + (1 << 20)]
            known = known[known >= 0]
            if len(known):
                low = int(known.min()) if low is None else min(low, int(known.min()))
                high = int(known.max()) if high is None else max(high, int(known.max()))
        return None if low is None or high is None else (low, high)

    def launch_threads(self, codes: np.ndarray) -> np.ndarray:
        """Global thread ids of ``launch_thread`` codes (-1 stays -1)."""
        ids = np.append(self.threads.astype(np.int64), -1)
        return ids[codes.astype(np.int64)]


MAX_THREADS = np.iinfo(np.int16).max


def check_threads(count: int) -> None:
    """Launching threads are coded in 16 bits: more than 32,767 of them is refused."""
    if count > MAX_THREADS:
        raise BadInput(f"{count:,} threads launch GPU work: profkit reads at most {MAX_THREADS:,}")


def from_trace(trace: Trace) -> ActivityColumns:
    """The compact columns of a reader's tables (same rows, same order)."""
    k = trace.kernels
    name_codes, names = pd.factorize(k["name"].to_numpy(dtype=object))
    first = np.unique(name_codes, return_index=True)[1]
    kinds = k["kind"].to_numpy(dtype=object)[first].tolist()
    pairs = pd.MultiIndex.from_arrays([k["grid"].fillna(""), k["block"].fillna("")])
    shape_codes, shapes = pd.factorize(pairs)
    launch = k["launch_start"].to_numpy(dtype=np.int64, na_value=-1)
    thread = k["launch_thread"].to_numpy(dtype=np.int64, na_value=-1)
    thread_codes, threads = pd.factorize(thread[launch >= 0])
    check_threads(len(threads))
    codes = np.full(len(k), -1, dtype=np.int64)
    codes[launch >= 0] = thread_codes
    arrays = {
        "name": name_codes,
        "shape": shape_codes,
        "duration": (k["end"].to_numpy(np.int64) - k["start"].to_numpy(np.int64)),
        "launch_start": np.where(launch >= 0, launch, -1),
        "launch_thread": codes,
    }
    return ActivityColumns(
        arrays={name: np.asarray(arrays[name]).astype(t) for name, t in ARRAYS.items()},
        names=[str(n) for n in names],
        kinds=[str(x) for x in kinds],
        shapes=[(str(g), str(b)) for g, b in shapes],
        threads=np.asarray(threads, dtype=np.int64),
        ranges=trace.ranges,
        meta=trace.meta,
    )


def check_column_span(cols: ActivityColumns) -> ActivityColumns:
    """:func:`~profkit.traces.schema.check_time_span` for columns: launch times, range times
    and durations within ``MAX_SPAN_NS`` (the columns keep no GPU start times)."""
    bounds = cols.launch_bounds()
    launch = np.array(bounds if bounds else [], dtype=np.int64)
    values = [launch, *(cols.ranges[c].to_numpy(np.int64) for c in ("start", "end"))]
    values = [v for v in values if len(v)]
    low = min((int(v.min()) for v in values), default=0)
    high = max((int(v.max()) for v in values), default=0)
    longest = int(cols.arrays["duration"].max()) if len(cols) else 0
    if high - low > MAX_SPAN_NS or longest > MAX_SPAN_NS:
        span = max(high - low, longest)
        raise BadInput(
            f"{cols.meta.get('path', 'the trace')}: its timestamps span "
            f"{span / 86_400e9:,.0f} days: a damaged timestamp, not a capture"
        )
    return cols
