"""A Chrome trace's ranges table, and the conversions every part of the Chrome reader shares.

``to_ns`` turns Kineto's microsecond floats into exact integer nanoseconds, ``valid_times``
drops (and counts) times no clock gives, ``int64_ids`` keeps 64-bit ids; the ranges get
their per-thread nesting depth. The GPU activities are gathered as arrays by
:mod:`.chrome_activities`.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from profkit.traces.schema import RANGE_COLUMNS, conform, empty_ranges

_PROFILER_STEP = re.compile(r"ProfilerStep#\d+")
# |ts| and dur bounds, µs: about year 2096 since the epoch; nanoseconds plus a base of up to
# MAX_BASE_NS then stay inside int64.
MAX_US = 4e15
MAX_BASE_NS = 1 << 62
_U64 = 1 << 64
NON_FINITE = "non-finite or out-of-range time"
NEGATIVE = "negative duration (counted as 0)"
_I64 = 1 << 63


class Issues(dict[str, int]):
    """Events a table dropped or changed, by reason; the reader turns them into warnings."""

    def add(self, reason: str, count: int) -> None:
        if count:
            self[reason] = self.get(reason, 0) + int(count)


def valid_times(ts: Any, dur: Any, issues: Issues) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``ts``/``dur`` as float arrays, the mask of events to keep, negative durations set to 0.

    An event whose time is not finite (``"nan"``, ``inf``) or far outside any clock is
    dropped; a negative duration is kept as 0 µs. Both are counted in ``issues``.
    """
    ts = np.asarray(ts, dtype=np.float64)
    dur = np.asarray(dur, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        keep = (np.abs(ts) < MAX_US) & (np.abs(dur) < MAX_US)  # False for nan and inf
    issues.add(NON_FINITE, int((~keep).sum()))
    negative = keep & (dur < 0)
    issues.add(NEGATIVE, int(negative.sum()))
    return ts, np.where(negative, 0.0, dur), keep


def int64_ids(values: list[int]) -> np.ndarray:
    """Ids as int64; unsigned 64-bit ids (2^64 - 1 from some tools) keep their bits, ids
    beyond 64 bits become -1 (unknown)."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        return np.array(
            [v if -_I64 <= v < _I64 else v - _U64 if _I64 <= v < _U64 else -1 for v in values],
            dtype=np.int64,
        )


def to_ns(us: Any, base_ns: int = 0) -> np.ndarray:
    """Microsecond floats (Kineto ``ts``/``dur``) to integer nanoseconds, plus ``base_ns``.

    Whole and fractional microseconds are converted apart: ``ts * 1000`` on a ~4e12 µs
    double can be off by a nanosecond, the split cannot (while ts < 2**43 µs).
    """
    values = np.asarray(us, dtype=np.float64)
    whole = np.floor(values)
    frac_ns = np.rint((values - whole) * 1000.0).astype(np.int64)
    return whole.astype(np.int64) * 1000 + frac_ns + np.int64(base_ns)


def ranges_table(
    columns: tuple[list[str], list[float], list[float], list[int]],
    base_ns: int,
    issues: Issues | None = None,
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    names, ts, dur, tids = columns
    if not names:
        return empty_ranges(), []
    ts_us, dur_us, keep = valid_times(ts, dur, issues if issues is not None else Issues())
    if not keep.any():
        return empty_ranges(), []
    start = to_ns(ts_us[keep], base_ns)
    df = pd.DataFrame(
        {
            "name": np.asarray(names, dtype=object)[keep],
            "start": start,
            "end": start + to_ns(dur_us[keep]),
            "thread": int64_ids(tids)[keep],
        }
    )
    is_step = df["name"].str.fullmatch(_PROFILER_STEP.pattern)
    steps = [
        {"name": r.name, "start": int(r.start), "end": int(r.end), "thread": int(r.thread)}
        for r in df[is_step].sort_values("start").itertuples(index=False)
    ]
    df = df[~is_step].sort_values(["thread", "start", "end"], ascending=[True, True, False])
    df["depth"] = _depths(df["thread"].to_numpy(), df["start"].to_numpy(), df["end"].to_numpy())
    df["domain"] = ""
    df = df.sort_values(["start", "depth"], kind="stable")
    return conform(df, RANGE_COLUMNS), steps


def _depths(threads: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Nesting depth of each range on its thread; input sorted by thread, start, -end."""
    depth = np.zeros(len(starts), dtype=np.int64)
    open_ends: list[int] = []
    current = None
    for i in range(len(starts)):
        if threads[i] != current:
            current, open_ends = threads[i], []
        while open_ends and open_ends[-1] <= starts[i]:
            open_ends.pop()
        depth[i] = len(open_ends)
        open_ends.append(ends[i])
    return depth


def kernel_function_name(name: str) -> str:
    """A kernel's function name without namespaces, template arguments or parameters.

    ``void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)`` becomes
    ``vectorized_elementwise_kernel``: what nsys stores as ``shortName``, so the
    ``short_name`` column means the same in both formats. (The readable names the tables
    show come from :func:`profkit.analysis.names.short_kernel_name`.)
    """
    depth = 0
    kept: list[str] = []
    for char in name:
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(depth - 1, 0)
        elif char == "(" and depth == 0:
            break
        elif depth == 0:
            kept.append(char)
    bare = "".join(kept).strip()
    last = bare.split()[-1] if bare.split() else name
    return last.rsplit("::", 1)[-1] or name
