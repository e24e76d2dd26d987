"""A Chrome trace's GPU activities as numpy arrays, gathered a batch of events at a time.

The reader's one pass over the events (:mod:`.chrome`) gives :class:`ActivityArrays` each
batch's kernels, copies and sets, and its launching runtime/driver calls, as plain lists;
they become arrays at once (times checked and turned into nanoseconds, names and launch
shapes coded as they come), so no Python object per activity outlives its batch. Once
the last batch is in, :meth:`ActivityArrays.finish` ties each activity to its launch by
correlation id and orders the activities by GPU start and end: :class:`Activities`, which
become the compact columns (:func:`columns_of`, what the reader returns).

The columns are exactly what the per-activity tables of profkit's first reader gave: same
rows in the same order, same codes (tests/test_golden.py holds its outputs). What that takes: times
split into whole and fractional microseconds (``to_ns``) before the trace's base is
added, in int64 as before; the launch kept per correlation id is the first after a
quicksort by launch start (what ``sort_values`` then ``drop_duplicates`` kept, ties
included); activities in a stable sort by (start, end) of document order; names, shapes
and threads coded in order of first appearance in that order (``pd.factorize``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profkit.traces.chrome_fields import (
    NEGATIVE,
    NON_FINITE,
    Issues,
    int64_ids,
    to_ns,
    valid_times,
)
from profkit.traces.columns import (
    DEVICE,
    DEVICE_LIMIT,
    KEPT,
    SHAPE,
    START,
    ActivityColumns,
    check_threads,
)

KINDS = ("kernel", "memcpy", "memset")
_MEMCPY_KIND = re.compile(r"memcpy\s+(\w+)", re.IGNORECASE)
_GPU = ("pair", "start", "duration", "device", "correlation", "shape")
_LAUNCH = ("correlation", "start", "thread")


@dataclass
class GpuBatch:
    """One batch's GPU activities as the event loop found them, a list per field; ``pair``
    is the (name, kind) code (:meth:`ActivityArrays.name_code`), ``shape`` the (grid,
    block) code (:meth:`ActivityArrays.shape_code`)."""

    pair: list[int]
    ts: list[float]
    dur: list[float]
    device: list[int]
    correlation: list[int]
    shape: list[int]
    launch_correlation: list[int]
    launch_ts: list[float]
    launch_thread: list[int]

    @classmethod
    def empty(cls) -> GpuBatch:
        return cls([], [], [], [], [], [], [], [], [])


@dataclass
class Activities:
    """Every GPU activity of a trace, ordered by (start, end): arrays of equal length."""

    pair: np.ndarray  # int32, index into ``pairs``
    pairs: list[tuple[str, str]]  # (name as written, kind)
    start: np.ndarray  # int64 ns, GPU start
    end: np.ndarray  # int64 ns
    device: np.ndarray  # int64
    shape: np.ndarray  # int32, index into ``shapes``
    shapes: list[tuple[str, str]]
    launched: np.ndarray  # bool: the launch call is known
    launch_start: np.ndarray  # int64 ns (0 where not launched)
    launch_thread: np.ndarray  # int64 thread id (0 where not launched)

    def __len__(self) -> int:
        return len(self.start)

    def unlaunched(self) -> int:
        return int(len(self) - np.count_nonzero(self.launched))

    def bounds(self) -> tuple[int, int] | None:
        """Earliest and latest time of the activities and their known launches."""
        values = [self.start, self.end, self.launch_start[self.launched]]
        values = [v for v in values if len(v)]
        if not values:
            return None
        return min(int(v.min()) for v in values), max(int(v.max()) for v in values)

    def display_names(self) -> tuple[np.ndarray, list[str]]:
        """Each pair's code among the names the activities are shown by (copies and sets
        named as nsys names them: ``[memcpy HtoD]``, ``[memset]``), and those names."""
        codes: dict[str, int] = {}
        of_pair = [codes.setdefault(_display_name(n, k), len(codes)) for n, k in self.pairs]
        return np.asarray(of_pair, dtype=np.int64), list(codes)


class ActivityArrays:
    """The GPU activities and launches of the batches seen so far, as arrays."""

    def __init__(self) -> None:
        self.codes: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
        """Per kind: name -> (name, kind) code; the event loop looks names up here."""
        self._pairs: list[tuple[str, str]] = []
        self._shape_keys: dict[tuple[Any, Any], int] = {}
        self._shape_codes: dict[tuple[str, str], int] = {}
        self._gpu: dict[str, list[np.ndarray]] = {field: [] for field in _GPU}
        self._launch: dict[str, list[np.ndarray]] = {field: [] for field in _LAUNCH}
        self._gpu_issues = Issues()
        self._launch_issues = Issues()

    def name_code(self, name: Any, kind: str) -> int:
        """The code of (``str(name)``, ``kind``), new if not seen yet (the event loop
        looks string names up in :attr:`codes` first)."""
        text = str(name)
        codes = self.codes[kind]
        code = codes.get(text)
        if code is None:
            code = codes[text] = len(self._pairs)
            self._pairs.append((text, kind))
        return code

    def shape_code(self, grid: Any, block: Any) -> int:
        """The code of an activity's (grid, block) as ``"x,y,z"`` strings (``""`` where not
        a list). Raises as the conversion does (TypeError, ValueError, OverflowError)
        for values that are no dimensions: the event is malformed."""
        key = (
            tuple(grid) if type(grid) is list else None,
            tuple(block) if type(block) is list else None,
        )
        code = self._shape_keys.get(key)  # 1, 1.0 and True give one key, and one text
        if code is None:
            text = (dim3(grid), dim3(block))
            code = self._shape_codes.setdefault(text, len(self._shape_codes))
            self._shape_keys[key] = code
        return code

    def add(self, batch: GpuBatch) -> None:
        """Keep ``batch``'s activities and launches whose times are sound (counted
        otherwise), as arrays."""
        if batch.ts:
            ts, dur, keep = valid_times(batch.ts, batch.dur, self._gpu_issues)
            fields = {
                "pair": np.asarray(batch.pair, dtype=np.int32),
                "start": to_ns(ts[keep]),  # the base is added once the header is whole
                "duration": to_ns(dur[keep]),
                "device": int64_ids(batch.device),
                "correlation": int64_ids(batch.correlation),
                "shape": np.asarray(batch.shape, dtype=np.int32),
            }
            for field, values in fields.items():
                self._gpu[field].append(values if field in ("start", "duration") else values[keep])
        if batch.launch_ts:
            zero = np.zeros(len(batch.launch_ts))
            ts, _, keep = valid_times(batch.launch_ts, zero, self._launch_issues)
            self._launch["correlation"].append(int64_ids(batch.launch_correlation)[keep])
            self._launch["start"].append(to_ns(ts[keep]))
            self._launch["thread"].append(int64_ids(batch.launch_thread)[keep])

    def finish(self, base_ns: int, issues: Issues) -> Activities:
        """The activities in (start, end) order, each with its launch; what was dropped or
        changed added to ``issues`` (the activities', then the launches' when any
        activity is kept, as the tables counted them)."""
        for reason in (NON_FINITE, NEGATIVE):
            issues.add(reason, self._gpu_issues.get(reason, 0))
        gpu = {field: _joined(self._gpu[field], field) for field in _GPU}
        self._gpu.clear()
        base = np.int64(base_ns)
        start = gpu["start"] + base  # int64 as to_ns(ts, base) wrapped: the same bits
        end = start + gpu["duration"]
        order = np.lexsort((end, start))  # stable: ties keep document order
        correlation = gpu["correlation"][order]
        if len(start):
            issues.add(NON_FINITE, self._launch_issues.get(NON_FINITE, 0))
        launched, launch_start, launch_thread = self._match(correlation, base)
        return Activities(
            pair=gpu["pair"][order],
            pairs=self._pairs,
            start=start[order],
            end=end[order],
            device=gpu["device"][order],
            shape=gpu["shape"][order],
            shapes=list(self._shape_codes),
            launched=launched,
            launch_start=launch_start,
            launch_thread=launch_thread,
        )

    def _match(
        self, correlation: np.ndarray, base: np.int64
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each activity's launch: known?, start, thread. One launch per correlation id,
        the earliest (a runtime call and the driver call inside it may share the id);
        ties broken as the launch table's quicksort broke them."""
        launches = {field: _joined(self._launch[field], field) for field in _LAUNCH}
        self._launch.clear()
        starts = launches["start"] + base
        by_start = np.argsort(starts, kind="quicksort")
        ids, first = np.unique(launches["correlation"][by_start], return_index=True)
        chosen = by_start[first]
        at = np.minimum(np.searchsorted(ids, correlation), max(len(ids) - 1, 0))
        launched = (correlation >= 0) & (ids[at] == correlation if len(ids) else False)
        launch_start = np.where(launched, starts[chosen][at] if len(ids) else 0, 0)
        thread = np.where(launched, launches["thread"][chosen][at] if len(ids) else 0, 0)
        return np.asarray(launched, dtype=bool), launch_start.astype(np.int64), thread


def columns_of(
    activities: Activities, ranges: pd.DataFrame, meta: dict[str, Any], timed: bool
) -> ActivityColumns:
    """The compact columns of ``activities``; ``timed``: with GPU starts and devices, where every device fits their 16 bits."""
    of_pair, display = activities.display_names()
    names_of_rows, first_name = pd.factorize(of_pair[activities.pair])
    first = np.unique(names_of_rows, return_index=True)[1]
    kinds = [activities.pairs[int(p)][1] for p in activities.pair[first]]
    shape_codes, first_shape = pd.factorize(activities.shape)
    known = activities.launched & (activities.launch_start >= 0)
    launch = np.where(known, activities.launch_start, -1)
    thread_codes, threads = pd.factorize(activities.launch_thread[known])
    check_threads(len(threads))
    codes = np.full(len(activities), -1, dtype=np.int64)
    codes[known] = thread_codes
    arrays: dict[str, np.ndarray] = {
        "name": names_of_rows,
        SHAPE: shape_codes,
        "duration": activities.end - activities.start,
        "launch_start": launch,
        "launch_thread": codes,
    }
    device = activities.device
    if timed and ((device >= -DEVICE_LIMIT - 1) & (device <= DEVICE_LIMIT)).all():
        arrays.update({START: activities.start, DEVICE: device})
    return ActivityColumns(
        arrays={name: arrays[name].astype(t) for name, t in KEPT.items() if name in arrays},
        names=[display[int(c)] for c in first_name],
        kinds=kinds,
        shapes=[activities.shapes[int(c)] for c in first_shape],
        threads=np.asarray(threads, dtype=np.int64),
        ranges=ranges,
        meta=meta,
    )


def dim3(value: Any) -> str:
    """A launch dimension (``[x, y, z]``) as ``"x,y,z"``; ``""`` for anything not a list."""
    if isinstance(value, list | tuple):
        return ",".join(str(int(v)) for v in value)
    return ""


def _display_name(name: str, kind: str) -> str:
    if kind == "memcpy":
        found = _MEMCPY_KIND.search(name)
        return f"[memcpy {found.group(1)}]" if found else "[memcpy]"
    return "[memset]" if kind == "memset" else name


def _joined(chunks: list[np.ndarray], field: str) -> np.ndarray:
    dtype = np.int32 if field in ("pair", "shape") else np.int64
    return np.concatenate(chunks).astype(dtype, copy=False) if chunks else np.zeros(0, dtype)
