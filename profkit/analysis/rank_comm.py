"""NCCL time and overlap per rank, and each rank's steps, from compact columns: the
second pass over the activities of a trace of several ranks.

The rules of :mod:`.comm` and :mod:`.steps`, without a per-activity frame:

- NCCL kernels are few: the first pass over the chunks (:func:`.sums.add_up`) keeps them
  whole. Compute kernels are most of a trace, but only those
  that intersect the union of their rank's NCCL intervals on their GPU change the overlap,
  so :func:`second_pass` keeps only those (one binary search per kernel);
  :func:`.comm.comm_stats_apart` then measures the few it got.
- A rank's steps: per (rank, step) the first start and last end of its activities, added
  up chunk by chunk into a dense table (steps are few); the NCCL waits
  (:func:`.steps.nccl_waits`) need only the NCCL kernels. :class:`ColumnSteps` is a
  :class:`~.steps.RankSteps` holding those kernels, its step table already made, and the
  kernels of one step read from the columns when a picture asks for them.

Both passes run on up to four threads (:func:`.chunked.map_chunks`): each chunk returns
its counts, spans and meeting kernels, which the main thread adds up, or appends, in chunk
order (what one thread gives).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit.analysis import chunked
from profkit.analysis.chunked import map_chunks
from profkit.analysis.comm import CommStats, Intervals, comm_stats_apart
from profkit.analysis.intervals import union
from profkit.analysis.selection import Selection
from profkit.analysis.steps import NS_PER_MS, RankSteps
from profkit.traces.columns import ActivityColumns

Unions = dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]
KernelIntervals = tuple[np.ndarray, np.ndarray, np.ndarray]  # start, end, device


@dataclass
class ColumnSteps(RankSteps):
    """A rank's steps: ``step`` ... ``is_kernel`` hold its NCCL kernels only (what
    :func:`.steps.nccl_waits` reads); the step table is made already."""

    made: dict[str, np.ndarray] = field(default_factory=dict)
    """Its step table's columns (``step``, ``start``, ``end``, ``nccl_ms``), as arrays: a
    frame a rank costs ms each, which 1,024 ranks feel."""
    read_kernels: Callable[[int], pd.DataFrame] | None = None
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Its steps' starts (:func:`.steps.step_starts`): what reads a step's kernels again."""

    def moved(self, rank: int, shift: int) -> ColumnSteps:
        """These steps as rank ``rank``'s, ``shift`` ns later (a node analysed alone, put
        on its job's clock), without their reader (``read_kernels``: the job's columns')."""
        m = self.made
        made = {**m, "start": m["start"] + shift, "end": m["end"] + shift}
        return ColumnSteps(
            rank, self.step, self.start + shift, self.end + shift, self.nccl, self.is_kernel,
            made, None, self.starts + shift,
        )  # fmt: skip

    def table_columns(self) -> dict[str, np.ndarray]:
        return {**self.made, "rank": np.full(len(self.made["step"]), self.rank, np.int64)}

    def kernels_of(self, step: int) -> pd.DataFrame:
        if self.read_kernels is None:
            return super().kernels_of(step)
        return self.read_kernels(step)


def nccl_unions(nccl: dict[str, np.ndarray]) -> Unions:
    """Per (rank, device): the union of the selected NCCL kernels' intervals."""
    out: Unions = {}
    chosen = nccl["selected"]
    rank, device = nccl["rank"][chosen], nccl["device"][chosen]
    start = nccl["start"][chosen]
    end = start + nccl["duration"][chosen]
    for r, d in sorted(set(zip(rank.tolist(), device.tolist(), strict=True))):
        mine = (rank == r) & (device == d)
        out[(r, d)] = union(start[mine], end[mine])
    return out


@dataclass
class SecondPass:
    """What the second pass found: compute kernels meeting the NCCL unions, per rank, as
    (start, end, device) parts; per (rank, step) cell the span and activity count."""

    compute: dict[int, list[KernelIntervals]]
    span_start: np.ndarray
    span_end: np.ndarray
    count: np.ndarray


def second_pass(
    cols: ActivityColumns,
    rank: np.ndarray,
    att: Mapping[str, np.ndarray],
    selection: Selection,
    compute_name: np.ndarray,
    unions: Unions,
    starts: list[np.ndarray],
) -> SecondPass:
    """One pass over the chunks: the selected compute kernels that can overlap NCCL
    (``compute_name`` per name code; ``att``: the attribution the selection reads), and the
    steps' spans (every activity)."""
    offset = np.concatenate([[0], np.cumsum([len(s) for s in starts])]).astype(np.int64)
    found = _no_spans(int(offset[-1]))
    cols.load(["start", "duration", "launch_start", "name", "device"])

    def chunk(lo: int, hi: int) -> tuple[SecondPass, list[tuple[int, KernelIntervals]]]:
        r = rank[lo:hi].astype(np.int64)
        a = {k: cols.arrays[k][lo:hi] for k in ("start", "duration", "launch_start", "device")}
        a["end"] = a["start"] + a["duration"]
        spans = _step_spans(r, a, starts, offset)
        compute = compute_name[cols.arrays["name"][lo:hi]]
        keep = selection.of(r, att, lo, hi)
        if keep is not None:
            compute &= keep
        return spans, _meeting(r, a, compute, unions)

    for spans, meeting in map_chunks(chunk, len(cols), chunked.CHUNK):
        found.count += spans.count
        np.minimum(found.span_start, spans.span_start, out=found.span_start)
        np.maximum(found.span_end, spans.span_end, out=found.span_end)
        for rr, part in meeting:  # in chunk order, then union order, as one thread adds
            found.compute.setdefault(rr, []).append(part)
    return found


def _no_spans(cells: int) -> SecondPass:
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    return SecondPass({}, np.full(cells, big), np.full(cells, small), np.zeros(cells, np.int64))


def _step_spans(
    r: np.ndarray, a: dict[str, np.ndarray], starts: list[np.ndarray], offset: np.ndarray
) -> SecondPass:
    """A chunk's activity count and span per (rank, step) cell."""
    start, end = a["start"], a["end"]
    cell = step_cells(r, np.where(a["launch_start"] >= 0, a["launch_start"], start), starts, offset)
    inside = cell >= 0
    spans = _no_spans(int(offset[-1]))
    spans.count += np.bincount(cell[inside], minlength=len(spans.count))
    np.minimum.at(spans.span_start, cell[inside], start[inside])
    np.maximum.at(spans.span_end, cell[inside], end[inside])
    return spans


def _meeting(
    r: np.ndarray, a: dict[str, np.ndarray], compute: np.ndarray, unions: Unions
) -> list[tuple[int, KernelIntervals]]:
    """A chunk's compute kernels that meet their rank's NCCL union on their GPU, per union."""
    start, end = a["start"], a["end"]
    out = []
    for (rr, d), (u_start, u_end) in unions.items():
        mine = np.flatnonzero(compute & (r == rr) & (a["device"] == d))
        s, e = start[mine], end[mine]
        j = np.searchsorted(u_start, e, side="left") - 1
        meets = (j >= 0) & (u_end[np.maximum(j, 0)] > s)
        out.append((rr, (s[meets], e[meets], np.full(int(meets.sum()), d, dtype=np.int64))))
    return out


def step_cells(
    rank: np.ndarray, point: np.ndarray, starts: list[np.ndarray], offset: np.ndarray
) -> np.ndarray:
    """Per activity: its (rank, step) cell (``offset[rank] + step``), -1 before the first
    step (an activity's step: the last step start at or before ``point``)."""
    cell = np.full(len(rank), -1, dtype=np.int64)
    for r, s in enumerate(starts):
        mine = np.flatnonzero(rank == r)
        step = np.searchsorted(s, point[mine], side="right") - 1
        cell[mine] = np.where(step >= 0, offset[r] + step, -1)
    return cell


def rank_comm(
    nccl: dict[str, np.ndarray], r: int, found: SecondPass, names: np.ndarray
) -> CommStats:
    """:func:`.comm.comm_stats_apart` of rank ``r``'s selected NCCL kernels and the compute
    kernels that met them."""
    mine = nccl["selected"] & (nccl["rank"] == r)
    n_start = nccl["start"][mine]
    n_end = n_start + nccl["duration"][mine]
    parts = found.compute.get(r, [])
    compute = Intervals(
        *(np.concatenate([np.zeros(0, np.int64)] + [p[i] for p in parts]) for i in range(3))
    )
    kernels = Intervals(n_start, n_end, nccl["device"][mine])
    return comm_stats_apart(kernels, compute, names[nccl["name"][mine]])


def rank_steps(
    r: int,
    nccl: dict[str, np.ndarray],
    found: SecondPass,
    starts: list[np.ndarray],
    read_kernels: Callable[[int], pd.DataFrame],
) -> ColumnSteps:
    """Rank ``r``'s :class:`ColumnSteps`: its step table (the rows of ``RankSteps.table``)
    and its NCCL kernels with their steps."""
    offset = int(sum(len(s) for s in starts[:r]))
    cells = slice(offset, offset + len(starts[r]))
    mine = nccl["rank"] == r
    start, duration = nccl["start"][mine], nccl["duration"][mine]
    launch = nccl["launch"][mine]
    step = np.searchsorted(starts[r], np.where(launch >= 0, launch, start), side="right") - 1
    present = np.flatnonzero(found.count[cells] > 0)
    nccl_ns = np.bincount(step[step >= 0], weights=duration[step >= 0], minlength=len(starts[r]))
    made = {
        "step": present.astype(np.int64),
        "start": found.span_start[cells][present],
        "end": found.span_end[cells][present],
        "nccl_ms": nccl_ns[present].astype(np.int64) / NS_PER_MS,
    }
    every = np.ones(len(step), dtype=bool)
    return ColumnSteps(
        r, step, start, start + duration, every, every, made, read_kernels, starts[r]
    )


def kernels_reader(
    cols: ActivityColumns,
    rank: np.ndarray,
    r: int,
    starts: np.ndarray,
    kernel_name: np.ndarray,
    nccl_name: np.ndarray,
) -> Callable[[int], pd.DataFrame]:
    """``read(step)``: ``start``, ``end`` and ``nccl`` of rank ``r``'s kernels in a step."""

    def read(step: int) -> pd.DataFrame:
        a = cols.arrays

        def chunk(lo: int, hi: int) -> list[np.ndarray]:
            start = a["start"][lo:hi]
            launch = a["launch_start"][lo:hi]
            point = np.where(launch >= 0, launch, start)
            in_step = np.searchsorted(starts, point, side="right") - 1 == step
            name = a["name"][lo:hi]
            rows = np.flatnonzero(in_step & (rank[lo:hi] == r) & kernel_name[name])
            return [start[rows], start[rows] + a["duration"][lo:hi][rows], nccl_name[name[rows]]]

        parts = list(map_chunks(chunk, len(cols), chunked.CHUNK))
        names = ("start", "end", "nccl")
        return pd.DataFrame({n: np.concatenate([p[i] for p in parts]) for i, n in enumerate(names)})

    return read
