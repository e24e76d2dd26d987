"""GPU activity as compact columns: what a kernel report needs, at a few bytes per activity.

A table of twelve columns per activity, text included, is over 8 GiB at 30 million
kernels. The kernel report needs only each activity's name, duration and launching call,
so :class:`ActivityColumns` keeps those as integer codes (22 bytes per activity) beside
small lookup tables, and the analysis (:mod:`profkit.analysis.engine`) walks them in
chunks. Every reader builds them directly (:mod:`.nsys_columns`, :mod:`.chrome`), and the
cache (:mod:`profkit.traces.cache`) stores them on disk, with what
the analysis derived from them (:attr:`ActivityColumns.derived`).

Launch shapes (grid, block) show only in the per-kernel tables, one per table row: a
reader may keep a shape code per activity (``arrays["shape"]``), or read the few shapes
asked for from the trace itself afterwards (``read_shapes``, by row ids:
:class:`RowMap`), which spares the scan three columns of the kernel table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import pandas as pd

from profkit.errors import BadInput
from profkit.traces.schema import MAX_SPAN_NS

ProgressUnit = Literal["rows", "bytes", "files"]


class Progress(Protocol):
    """``progress(done, total, unit)``: called by long reads as they go.

    ``unit`` says what is counted: ``"rows"`` of the tables read (nsys exports; the default,
    so ``progress(rows_done, rows_total)`` means rows), or ``"bytes"`` of the file on disk
    (Chrome traces: the compressed bytes consumed, for a ``.json.gz``).
    """

    def __call__(self, done: int, total: int, unit: ProgressUnit = "rows", /) -> None: ...


ARRAYS = {
    "name": np.int32,  # index into ``names``
    "duration": np.int64,  # ns, end - start
    "launch_start": np.int64,  # ns; -1 when the launch call is unknown
    "launch_thread": np.int16,  # index into ``threads``; -1 when unknown
}
SHAPE = "shape"
"""The optional array of shape codes (int32, index into ``shapes``)."""
START, DEVICE = "start", "device"
"""The optional arrays of GPU start times (int64 ns) and device ordinals (int16) that a
multi-process export's columns keep, and a per-rank trace's (one rank of a run, joined to
the others': :mod:`profkit.analysis.joins`): a rank's activities, NCCL overlap
and steps need them (:mod:`profkit.analysis.rank_layout`); one process's report does not."""
TIMED = {START: np.int64, DEVICE: np.int16}
NO_SHAPE = ("", "")
ShapeReader = Callable[[np.ndarray], list[tuple[str, str]]]
"""``read(rows)``: (grid, block) of the activities at ``rows``, read from the trace."""


@dataclass(frozen=True)
class RowMap:
    """Activity index -> row id in the table it was read from, as runs of consecutive ids.

    Covers activities ``0 .. count - 1``; a run starts at activity ``starts[i]`` with row id
    ``rowids[i]`` and goes on one id per activity (real exports have one run per table).
    """

    starts: np.ndarray
    rowids: np.ndarray
    count: int

    def rowid(self, index: np.ndarray) -> np.ndarray:
        """Row ids of activities ``index`` (each below ``count``)."""
        run = np.searchsorted(self.starts, index, side="right") - 1
        return self.rowids[run] + (index - self.starts[run])

    @classmethod
    def of_runs(cls, starts: list[np.ndarray], rowids: list[np.ndarray], count: int) -> RowMap:
        """The map of runs given in order (chunk by chunk), merging runs that continue."""
        start = np.concatenate([np.zeros(0, np.int64), *starts]).astype(np.int64)
        rowid = np.concatenate([np.zeros(0, np.int64), *rowids]).astype(np.int64)
        keep = np.ones(len(start), dtype=bool)
        keep[1:] = np.diff(rowid) != np.diff(start)  # a run that goes on needs no new entry
        return cls(start[keep], rowid[keep], count)


@dataclass
class Derived:
    """Arrays an analysis computed from the columns (kept by the cache): per activity, or
    sums of them."""

    arrays: Mapping[str, np.ndarray]
    meta: dict[str, Any]


@dataclass
class ActivityColumns:
    """One entry per GPU activity in each array of :data:`ARRAYS`, plus lookup tables."""

    arrays: Mapping[str, np.ndarray]
    names: list[str]
    """Full activity names (``[CUDA memcpy Host-to-Device]`` for copies)."""
    kinds: list[str]
    """``kernel`` | ``memcpy`` | ``memset`` | ``graph``, one per entry of ``names``."""
    shapes: list[tuple[str, str]]
    """(grid, block) as ``"x,y,z"`` strings, indexed by ``arrays["shape"]``; ``("", "")``
    for copies. Empty when shapes are read afterwards (``read_shapes``)."""
    threads: np.ndarray
    """Global thread ids the ``launch_thread`` codes index."""
    ranges: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    kernel_rows: RowMap | None = None
    """Where the kernels (activities ``0 .. kernel_rows.count - 1``) sit in the trace, for
    ``read_shapes``; the other activities have no shape."""
    read_shapes: ShapeReader | None = None
    derived: dict[str, Derived] = field(default_factory=dict)
    """What an analysis derived and wants kept (``keep``), by name."""
    keep: Callable[[str, Derived], None] | None = None
    """Called by :meth:`remember` (the cache sets it to store derived arrays)."""
    known_launch_bounds: tuple[int, int] | tuple[()] | None = None
    """:meth:`launch_bounds` once computed (``()``: no launch is known)."""

    def __len__(self) -> int:
        known = getattr(self.arrays, "length", None)  # the cache's lazily read columns
        if known is not None:
            return int(known)
        return len(self.arrays["name"]) if "name" in self.arrays else 0  # none: a job's tables

    def shapes_at(self, rows: np.ndarray) -> list[tuple[str, str]]:
        """(grid, block) of the activities at ``rows``."""
        if SHAPE in self.arrays:
            return [self.shapes[int(c)] for c in self.arrays[SHAPE][rows]]
        if self.read_shapes is None:
            raise ValueError("these columns keep no shapes and cannot read them")
        return self.read_shapes(np.asarray(rows, dtype=np.int64))

    def load(self, names: list[str]) -> None:
        """Have the arrays ``names`` read now, together, where they are read on first use
        (a cache entry's: :class:`~profkit.traces.cache_files.LazyColumns`)."""
        load = getattr(self.arrays, "load", None)
        if load is not None:
            load(names)

    def remember(self, name: str, derived: Derived) -> None:
        """Keep ``derived`` with the columns (and in the cache, where they came through it)."""
        self.derived[name] = derived
        if self.keep is not None:
            self.keep(name, derived)

    def launch_bounds(self) -> tuple[int, int] | None:
        """Earliest and latest known launch start (None if none is known), chunk by chunk;
        computed once (the cache stores it, so a cached load need not scan for it)."""
        if self.known_launch_bounds is None:
            found = self._scan_launch_bounds()
            self.known_launch_bounds = found if found is not None else ()
        return self.known_launch_bounds or None

    def _scan_launch_bounds(self) -> tuple[int, int] | None:
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


KEPT = {**ARRAYS, SHAPE: np.int32, **TIMED}  # every array columns may keep
MAX_THREADS = np.iinfo(np.int16).max
DEVICE_LIMIT = np.iinfo(np.int16).max  # TIMED[DEVICE]


def check_threads(count: int) -> None:
    """Launching threads are coded in 16 bits: more than 32,767 of them is refused."""
    if count > MAX_THREADS:
        raise BadInput(f"{count:,} threads launch GPU work: profkit reads at most {MAX_THREADS:,}")


def check_column_span(cols: ActivityColumns) -> ActivityColumns:
    """Launch times, range times and durations within ``MAX_SPAN_NS`` (what this check
    sees of a reader's columns, where they keep no GPU start times)."""
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
