"""The two tables of a Chrome trace, from the columns the reader collected.

``to_ns`` turns Kineto's microsecond floats into exact integer nanoseconds; the ranges
get their per-thread nesting depth; GPU activities get nsys-style names for copies and
sets, a short name, and their launch (runtime/driver call) by correlation id.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from profkit.traces.schema import (
    KERNEL_COLUMNS,
    RANGE_COLUMNS,
    conform,
    empty_kernels,
    empty_ranges,
)

_PROFILER_STEP = re.compile(r"ProfilerStep#\d+")
_MEMCPY_KIND = re.compile(r"memcpy\s+(\w+)", re.IGNORECASE)
# |ts| and dur bounds, µs: about year 2096 since the epoch; nanoseconds plus a base of up to
# MAX_BASE_NS then stay inside int64.
MAX_US = 4e15
MAX_BASE_NS = 1 << 62
_U64 = 1 << 64
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
    issues.add("non-finite or out-of-range time", int((~keep).sum()))
    negative = keep & (dur < 0)
    issues.add("negative duration (counted as 0)", int(negative.sum()))
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


def kernels_table(
    gpu: tuple[list[Any], ...],
    launches: tuple[list[Any], ...],
    base_ns: int,
    issues: Issues | None = None,
) -> pd.DataFrame:
    names, kinds, ts, dur, dev, stream, corr, grid, block = gpu
    issues = issues if issues is not None else Issues()
    ts_us, dur_us, keep = valid_times(ts, dur, issues)
    if not keep.any():
        return empty_kernels()
    start = to_ns(ts_us[keep], base_ns)
    df = pd.DataFrame(
        {
            "name": np.asarray(names, dtype=object)[keep],
            "kind": np.asarray(kinds, dtype=object)[keep],
            "start": start,
            "end": start + to_ns(dur_us[keep]),
            "device": int64_ids(dev)[keep],
            "stream": int64_ids(stream)[keep],
            "correlation_id": int64_ids(corr)[keep],
            "grid": np.asarray(grid, dtype=object)[keep],
            "block": np.asarray(block, dtype=object)[keep],
        }
    )
    df["name"] = _activity_names(df["name"], df["kind"])
    unique = df["name"].unique()
    shorts = {n: (n if n.startswith("[") else kernel_function_name(n)) for n in unique}
    df["short_name"] = df["name"].map(shorts)
    l_corr, l_ts, l_tid = launches
    l_us, _, l_keep = valid_times(l_ts, np.zeros(len(l_ts)), issues)
    launch = pd.DataFrame(
        {
            "correlation_id": int64_ids(l_corr)[l_keep],
            # Nullable from the start: the left merge's misses must not turn them into
            # floats, which cannot hold every int64 id (2^63 - 1 comes back out of range).
            "launch_start": pd.array(to_ns(l_us[l_keep], base_ns), dtype="Int64"),
            "launch_thread": pd.array(int64_ids(l_tid)[l_keep], dtype="Int64"),
        }
    )
    # One launch per correlation id: the outermost (earliest) call if a runtime call and
    # the driver call inside it were both recorded under the same id.
    launch = launch.sort_values("launch_start").drop_duplicates("correlation_id")
    df = df.merge(launch, on="correlation_id", how="left")
    df.loc[df["correlation_id"] < 0, ["launch_start", "launch_thread"]] = pd.NA
    df = df.sort_values(["start", "end"], kind="stable")
    return conform(df, KERNEL_COLUMNS)


def _activity_names(names: pd.Series, kinds: pd.Series) -> pd.Series:
    """Copies and sets named like nsys's: ``[memcpy HtoD]``, ``[memset]``."""
    out = names.copy()
    copies = kinds == "memcpy"
    if copies.any():
        kind = names[copies].str.extract(_MEMCPY_KIND, expand=False).fillna("")
        out[copies] = ("[memcpy " + kind + "]").str.replace(" ]", "]", regex=False)
    out[kinds == "memset"] = "[memset]"
    return out


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
