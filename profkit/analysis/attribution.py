"""Which ranges and which phase each GPU activity belongs to (docs/ATTRIBUTION.md).

The rule: an activity belongs to the ranges open on its *launching* thread when its launch
call started. PyTorch launches every backward kernel from autograd worker threads, which
hold no ranges; an activity launched from any thread other than its process's *phase
owner* (the thread whose phase ranges cover the most time: the main thread) also belongs
to the ranges open on the owner at that moment, and takes its phase from there. When
worker threads hold no ranges that is the whole rule; when they do
(``emit_nvtx``, a library's NVTX domain) their own ranges are kept as well.
docs/ATTRIBUTION.md explains why Nsight Systems' own reports differ.

Phases are the owner's outermost ranges, in the phase domain (the default NVTX domain),
that do not merely wrap the known phases: ``forward``/``backward``/``optimizer`` are
phases wherever they nest, a ``step`` range around them is not, and without known names
the top-level ranges are the phases.

Everything is sorts and binary searches over (thread, time) keys packed into int64, so the
cost is O((kernels + ranges) log) whatever the nesting: no loop over ranges per kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit.workload.names import PHASES

KNOWN_PHASES = PHASES
UNATTRIBUTED = "unattributed"
PROCESS_SHIFT = 24  # globalTid >> 24 = process (and VM) bits; torch.profiler tids stay unique


class _Lanes:
    """Packs (thread, time) into one sortable int64: thread code * span + time offset."""

    def __init__(self, threads: np.ndarray, times: list[np.ndarray]) -> None:
        self.threads = np.unique(threads)
        present = [t for t in times if len(t)]
        self.base = int(min(t.min() for t in present)) if present else 0
        top = int(max(t.max() for t in present)) if present else 0
        self.span = top - self.base + 2
        if (len(self.threads) + 2) * self.span >= 2**62:
            raise ValueError("trace too long to pack thread and time into one key")

    def codes(self, thread: np.ndarray) -> np.ndarray:
        """Dense code per thread id; threads holding no range share the last code."""
        index = np.searchsorted(self.threads, thread)
        index = np.minimum(index, max(len(self.threads) - 1, 0))
        known = (
            (self.threads[index] == thread) if len(self.threads) else np.zeros(len(thread), bool)
        )
        return np.where(known, index, len(self.threads)).astype(np.int64)

    def key(self, thread: np.ndarray, time: np.ndarray) -> np.ndarray:
        return self.codes(thread) * self.span + (time - self.base)


@dataclass
class Attribution:
    """Per-activity phases and the (thread, time) points that place activities in ranges."""

    phase_names: list[str]
    """Phase names in order of first appearance, then ``unattributed``."""
    kernel_phase: np.ndarray
    """Index into ``phase_names`` for each activity (row of ``trace.kernels``)."""
    same_thread_phase: np.ndarray
    """The phase the launching thread alone gives (what Nsight Systems' reports use)."""
    cross_thread: np.ndarray
    """True where the activity's phase came from its process's owner thread, not its own."""
    is_phase_range: np.ndarray
    """True for the ranges (rows of ``trace.ranges``) that are phases."""
    owners: dict[int, int]
    """Process -> its phase owner thread."""
    phase_domain: str
    _lanes: _Lanes
    _points: np.ndarray  # sorted keys: launch points, then owner-thread points
    _point_rows: np.ndarray  # activity row of each sorted point
    _range_start: np.ndarray
    _range_end: np.ndarray

    def range_totals(
        self, weights: np.ndarray, counted: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per range: sum of ``weights`` and number of ``counted`` activities it encloses.

        Both are per activity (rows of ``trace.kernels``). Nested ranges include their
        children's activities, since a point inside a child lies inside the parent too.
        """
        rows = self._point_rows
        summed = np.concatenate([np.zeros(1, weights.dtype), np.cumsum(weights[rows])])
        number = np.concatenate([[0], np.cumsum(counted[rows], dtype=np.int64)])
        lo = np.searchsorted(self._points, self._range_start, side="left")
        hi = np.searchsorted(self._points, self._range_end, side="left")
        return summed[hi] - summed[lo], number[hi] - number[lo]

    def enclosed_by(self, range_rows: np.ndarray, n_kernels: int) -> np.ndarray:
        """Activities enclosed by any of the given ranges (as attribution places them)."""
        inside = np.zeros(n_kernels, dtype=bool)
        if not len(range_rows):
            return inside
        starts, ends = _union(self._range_start[range_rows], self._range_end[range_rows])
        hit = _stab(starts, ends, self._points) >= 0
        inside[self._point_rows[hit]] = True
        return inside


def attribute(
    kernels: pd.DataFrame, ranges: pd.DataFrame, phase_domain: str | None = None
) -> Attribution:
    """Place every activity of ``kernels`` in its phase and ranges (see the module doc)."""
    n = len(kernels)
    launch = kernels["launch_start"].to_numpy(dtype=np.int64, na_value=-1)
    thread = kernels["launch_thread"].to_numpy(dtype=np.int64, na_value=-1)
    valid = (launch >= 0) & kernels["launch_start"].notna().to_numpy()
    r_start = ranges["start"].to_numpy(dtype=np.int64)
    r_end = ranges["end"].to_numpy(dtype=np.int64)
    r_thread = ranges["thread"].to_numpy(dtype=np.int64)
    domains = ranges["domain"].fillna("").astype(str)
    if phase_domain is None:
        phase_domain = "" if (domains == "").any() or domains.empty else domains.mode().iloc[0]
    lanes = _Lanes(r_thread, [r_start, r_end, launch[valid]])

    candidates = _phase_rows(ranges, domains == phase_domain, lanes)
    owners = _owners(r_thread[candidates], r_end[candidates] - r_start[candidates])
    # Phases belong to the owner threads only: a worker's own top-level ranges (emit_nvtx's
    # aten ops, say) are ranges of that worker, never phases.
    phase_rows = candidates[np.isin(r_thread[candidates], list(owners.values()))]
    is_phase = np.zeros(len(ranges), dtype=bool)
    is_phase[phase_rows] = True
    p_start = lanes.key(r_thread[phase_rows], r_start[phase_rows])
    p_end = lanes.key(r_thread[phase_rows], r_end[phase_rows])
    order = np.argsort(p_start, kind="stable")
    phase_rows, p_start, p_end = phase_rows[order], p_start[order], p_end[order]
    names = ranges["name"].to_numpy(dtype=object)[phase_rows]
    phase_names = list(dict.fromkeys(names.tolist()))
    name_code = {name: i for i, name in enumerate(phase_names)}
    phase_code = np.append(np.array([name_code[x] for x in names], dtype=np.int64), -1)
    phase_names.append(UNATTRIBUTED)
    unattributed = len(phase_names) - 1
    phase_code[-1] = unattributed  # _stab's -1 (no phase open) indexes this last slot

    rows = np.flatnonzero(valid)
    owner = _owner_of(thread[rows], owners)
    self_keys = lanes.key(thread[rows], launch[rows])
    same_thread = np.full(n, unattributed, dtype=np.int64)
    same_thread[rows] = phase_code[_stab(p_start, p_end, self_keys)]
    # Launched from another thread than its process's owner (an autograd worker): the
    # phase, and the ranges too, are those open on the owner thread at launch time.
    cross = (owner >= 0) & (owner != thread[rows])
    cross_rows = rows[cross]
    owner_keys = lanes.key(owner[cross], launch[cross_rows])
    owner_phase = phase_code[_stab(p_start, p_end, owner_keys)]
    kernel_phase = same_thread.copy()
    kernel_phase[cross_rows] = owner_phase
    cross_thread = np.zeros(n, dtype=bool)
    cross_thread[cross_rows[owner_phase != unattributed]] = True

    points = np.concatenate([self_keys, owner_keys])
    point_rows = np.concatenate([rows, cross_rows])
    order = np.argsort(points, kind="stable")
    return Attribution(
        phase_names=phase_names,
        kernel_phase=kernel_phase,
        same_thread_phase=same_thread,
        cross_thread=cross_thread,
        is_phase_range=is_phase,
        owners=owners,
        phase_domain=phase_domain,
        _lanes=lanes,
        _points=points[order],
        _point_rows=point_rows[order],
        _range_start=lanes.key(r_thread, r_start),
        _range_end=lanes.key(r_thread, r_end),
    )


def _phase_rows(ranges: pd.DataFrame, in_domain: pd.Series, lanes: _Lanes) -> np.ndarray:
    """Rows of the phase ranges: outermost in-domain ranges that do not wrap known phases."""
    mask = in_domain.to_numpy()
    if not mask.any():
        return np.empty(0, dtype=np.int64)
    thread = ranges["thread"].to_numpy(dtype=np.int64)
    start = lanes.key(thread, ranges["start"].to_numpy(dtype=np.int64))
    end = lanes.key(thread, ranges["end"].to_numpy(dtype=np.int64))
    known = mask & ranges["name"].str.lower().isin(KNOWN_PHASES).to_numpy()
    known_starts = np.sort(start[known])
    holds_known = np.searchsorted(known_starts, end, "left") > np.searchsorted(
        known_starts, start, "left"
    )
    candidates = np.flatnonzero(mask & (known | ~holds_known))
    order = np.lexsort((-end[candidates], start[candidates]))
    candidates = candidates[order]
    c_start, c_end = start[candidates], end[candidates]
    # Outermost: starts at or after every earlier candidate of its lane has ended. Keys of
    # a later lane are larger than any of an earlier one, so one running max serves all.
    reach = np.maximum.accumulate(c_end)
    outermost = np.ones(len(candidates), dtype=bool)
    outermost[1:] = c_start[1:] >= reach[:-1]
    return candidates[outermost]


def _union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint intervals covering the same (thread, time) keys, sorted by start."""
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    first = np.ones(len(start), dtype=bool)
    first[1:] = start[1:] > reach[:-1]
    last = np.append(np.flatnonzero(first)[1:] - 1, len(start) - 1)
    return start[first], reach[last]


def _stab(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Index of the interval (sorted, non-overlapping) holding each point, or -1."""
    if not len(starts):
        return np.full(len(points), -1, dtype=np.int64)
    index = np.searchsorted(starts, points, side="right") - 1
    inside = (index >= 0) & (points < ends[np.maximum(index, 0)])
    return np.where(inside, index, -1)


def _owners(threads: np.ndarray, durations: np.ndarray) -> dict[int, int]:
    """Per process, the thread whose phase ranges last longest in total."""
    if not len(threads):
        return {}
    per_thread = pd.Series(durations).groupby(threads).sum()
    frame = pd.DataFrame(
        {"thread": per_thread.index, "time": per_thread.to_numpy()},
    )
    frame["process"] = frame["thread"].to_numpy() >> PROCESS_SHIFT
    best = frame.sort_values(["process", "time", "thread"], ascending=[True, False, True])
    best = best.drop_duplicates("process")
    return dict(zip(best["process"].tolist(), best["thread"].tolist(), strict=True))


def _owner_of(thread: np.ndarray, owners: dict[int, int]) -> np.ndarray:
    """The owner thread of each thread's process (-1 where its process has no phases)."""
    if not owners:
        return np.full(len(thread), -1, dtype=np.int64)
    processes = np.array(sorted(owners), dtype=np.int64)
    threads = np.array([owners[p] for p in processes], dtype=np.int64)
    process = thread >> PROCESS_SHIFT
    index = np.minimum(np.searchsorted(processes, process), len(processes) - 1)
    return np.where(processes[index] == process, threads[index], -1)
