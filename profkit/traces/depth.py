"""Nesting depth of annotation ranges, computed with sorts instead of per-thread stacks.

Shared by every reader: a range's depth is the number of ranges of its lane (a thread, or a
thread and NVTX domain) still open when it starts. For push/pop ranges, which nest
properly, that is exactly the depth of the range stack; start/end ranges, which may
overlap without nesting, get the number of ranges open around their start.
"""

from __future__ import annotations

import numpy as np


def nesting_depth(lane: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Depth of each range within its lane (0 = outermost), in the input order.

    ``lane`` is any integer key (thread id, or a code for thread and domain); ``start`` and
    ``end`` are int64 times with ``end >= start``. A range ending exactly when another
    starts is closed by then.
    """
    n = len(start)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    lane_codes = _dense_codes(lane)
    # Sort by lane, start ascending, end descending: an enclosing range comes before the
    # ranges it encloses, also when both start at the same instant.
    order = np.lexsort((-end, start, lane_codes))
    sorted_lane = lane_codes[order]
    lane_first = np.searchsorted(sorted_lane, sorted_lane, side="left")
    opened_before = np.arange(n) - lane_first  # ranges of the lane sorted before this one
    # Ranges of the lane already closed at this one's start: one searchsorted over
    # (lane, time) keys packed into int64.
    base = int(start.min())
    span = int(end.max()) - base + 1
    if (int(lane_codes.max()) + 1) * span >= 2**62:
        raise ValueError("range times span too long to pack with their lanes")
    end_keys = np.sort(lane_codes * span + (end - base))
    closed = np.searchsorted(end_keys, sorted_lane * span + (start[order] - base), side="right")
    closed -= np.searchsorted(end_keys, sorted_lane * span, side="left")
    depth = np.empty(n, dtype=np.int64)
    depth[order] = opened_before - closed
    return np.maximum(depth, 0)


def _dense_codes(values: np.ndarray) -> np.ndarray:
    _, codes = np.unique(values, return_inverse=True)
    return codes.astype(np.int64)
