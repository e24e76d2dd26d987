"""Which ranges and which phase each GPU activity belongs to (docs/ATTRIBUTION.md).

The rule: an activity belongs to the ranges open on its *launching* thread when its launch
call started. PyTorch launches every backward kernel from autograd worker threads, which
hold no ranges; an activity launched from any thread other than its process's *phase
owner* (the thread whose phase ranges cover the most time: the main thread) also belongs
to the ranges open on the owner at that moment, and takes its phase from there. When
worker threads hold no ranges that is the whole rule; when they do
(``emit_nvtx``, a library's NVTX domain) their own ranges are kept as well.

Phase ranges are the owner's ranges, in the phase domain (the default NVTX domain), named
``forward``/``backward``/``optimizer`` wherever they nest, plus the user's own outermost
ranges beside them in a step that has one of those (``eager``, ``data``); a range that only
wraps them (a ``step`` range) is not a phase. No other range is ever promoted to a phase:
without those names, ``computing softmax`` or an ``aten::`` op range stays a range.

Steps without phase ranges get their phases inferred (:mod:`profkit.analysis.inference`):
annotated phases win per step, and :attr:`Attribution.phase_source` says which it was.

Everything is sorts and binary searches over (thread, time) keys packed into int64, so the
cost is O((kernels + ranges) log) whatever the nesting: no loop over ranges per kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from profkit.analysis.inference import (
    NO_PHASE,
    InferredPhases,
    Launches,
    TraceHints,
    infer_phases,
    lookup,
)
from profkit.analysis.intervals import Lanes, stab, union
from profkit.analysis.names import matching
from profkit.traces.schema import PROCESS_SHIFT
from profkit.workload.names import PHASES

KNOWN_PHASES = PHASES
UNATTRIBUTED = "unattributed"
PhaseMode = Literal["auto", "annotated", "inferred"]
PHASE_MODES: tuple[PhaseMode, ...] = ("auto", "annotated", "inferred")
"""``auto``: annotated phases where a step has them, inferred elsewhere."""

__all__ = [
    "KNOWN_PHASES",
    "PHASE_MODES",
    "UNATTRIBUTED",
    "Attribution",
    "PhaseMode",
    "TraceHints",
    "attribute",
    "inference_note",
]


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
    """Process -> its phase owner thread (the main thread where no range says it)."""
    phase_domain: str
    inferred: np.ndarray
    """True for the activities whose phase was inferred, not read from a range."""
    phase_source: str
    """``annotated``, ``inferred`` or ``mixed``: where the phases came from."""
    inference: InferredPhases
    _inferred_spans: dict[str, tuple[int, int]]  # phase -> (instances, summed span ns)
    _points: np.ndarray  # sorted keys: launch points, then owner-thread points
    _point_rows: np.ndarray  # activity row of each sorted point
    _range_start: np.ndarray
    _range_end: np.ndarray
    _phase_rows: np.ndarray  # rows of the phase ranges, in (thread, start) order
    _annotated: int  # phase_names[:_annotated] are the phase ranges' names
    _mode: PhaseMode

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
        starts, ends = union(self._range_start[range_rows], self._range_end[range_rows])
        hit = stab(starts, ends, self._points) >= 0
        inside[self._point_rows[hit]] = True
        return inside

    def phase_spans(self, ranges: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
        """Per phase name: instances and wall ns (its ranges', or inferred launch spans).

        An inferred instance is one forward, backward pass or optimizer run; its wall time
        is from its first launch to its last.
        """
        phase_ranges = ranges[self.is_phase_range]
        wall = (phase_ranges["end"] - phase_ranges["start"]).groupby(phase_ranges["name"]).sum()
        instances = phase_ranges.groupby("name").size()
        extra = pd.DataFrame.from_dict(
            self._inferred_spans, orient="index", columns=["instances", "wall"]
        )
        instances = instances.add(extra["instances"], fill_value=0).astype(np.int64)
        wall = wall.add(extra["wall"], fill_value=0)
        return instances, wall


def attribute(
    kernels: pd.DataFrame,
    ranges: pd.DataFrame,
    phase_domain: str | None = None,
    hints: TraceHints | None = None,
    phases: PhaseMode = "auto",
) -> Attribution:
    """Place every activity of ``kernels`` in its phase and ranges (see the module doc).

    ``hints`` (``TraceHints.of(trace.meta)``) name the threads for phase inference;
    ``phases`` forces annotated or inferred phases everywhere. Any slice of the two
    tables works (one rank's rows): processes are handled apart.
    """
    if phases not in PHASE_MODES:
        raise ValueError(f"phases must be one of {', '.join(PHASE_MODES)}, got {phases!r}")
    launches = Launches.of(kernels)
    inferred = infer_phases(launches, ranges, hints)
    assert inferred.instance is not None  # made here, not read back
    if phase_domain is None:
        phase_domain = default_phase_domain(ranges)
    annotated = _Annotated.of(ranges, phase_domain, launches, inferred, phases != "inferred")
    use_inferred = _inferred_steps(annotated, inferred, launches, phases)
    names, remap = ordered_phase_names(annotated.names, inferred.phase[launches.rows][use_inferred])
    unattributed = len(names) - 1
    n = launches.count
    inferred_code = remap[inferred.phase[launches.rows]]
    launched = np.where(use_inferred, inferred_code, annotated.code)
    kernel_phase = np.full(n, unattributed, dtype=np.int64)
    kernel_phase[launches.rows] = np.where(launched >= 0, launched, unattributed)
    same_thread = np.where(annotated.same_thread >= 0, annotated.same_thread, unattributed)
    is_inferred = np.zeros(n, dtype=bool)
    is_inferred[launches.rows[use_inferred]] = True
    cross_thread = np.zeros(n, dtype=bool)
    cross_thread[annotated.cross_rows] = True
    cross_thread &= ~is_inferred & (kernel_phase != unattributed)
    inferred_names = [names[r] if r >= 0 else p for r, p in zip(remap, PHASES, strict=False)]
    return Attribution(
        phase_names=names,
        kernel_phase=kernel_phase,
        same_thread_phase=same_thread,
        cross_thread=cross_thread,
        is_phase_range=annotated.is_phase_range,
        owners=annotated.owners,
        phase_domain=phase_domain,
        inferred=is_inferred,
        phase_source=phase_source(use_inferred, bool(annotated.names), phases),
        inference=inferred,
        _inferred_spans=inferred_spans(
            inferred.instance[launches.rows][use_inferred],  # type: ignore[index]
            inferred.phase[launches.rows][use_inferred],
            launches.time[use_inferred],
            inferred_names,
        ),
        _points=annotated.points,
        _point_rows=annotated.point_rows,
        _range_start=annotated.range_start,
        _range_end=annotated.range_end,
        _phase_rows=annotated.phase_rows,
        _annotated=len(annotated.names),
        _mode=phases,
    )


def default_phase_domain(ranges: pd.DataFrame) -> str:
    """The NVTX domain phase ranges are looked for in: the default one ("") where any range
    uses it, else the most used."""
    domains = ranges["domain"].fillna("").astype(str)
    return "" if (domains == "").any() or domains.empty else domains.mode().iloc[0]


@dataclass
class _Annotated:
    """What the phase ranges say: per launch, the phase range open on the owner thread."""

    names: list[str]
    """Phase range names in order of first appearance."""
    code: np.ndarray
    """Per launch (``Launches`` order): index into ``names``, or -1 outside every phase."""
    same_thread: np.ndarray
    """Per activity: the phase on the launching thread alone, or -1."""
    cross_rows: np.ndarray
    """Activity rows launched from another thread than their process's owner."""
    phase_rows: np.ndarray
    """Rows of the phase ranges, sorted by (thread, start)."""
    phase_thread: np.ndarray
    phase_start: np.ndarray
    is_phase_range: np.ndarray
    owners: dict[int, int]
    points: np.ndarray
    point_rows: np.ndarray
    range_start: np.ndarray
    range_end: np.ndarray

    @classmethod
    def of(
        cls,
        ranges: pd.DataFrame,
        phase_domain: str,
        launches: Launches,
        inferred: InferredPhases,
        use_phases: bool,
    ) -> _Annotated:
        r_start = ranges["start"].to_numpy(dtype=np.int64)
        r_end = ranges["end"].to_numpy(dtype=np.int64)
        r_thread = ranges["thread"].to_numpy(dtype=np.int64)
        lanes = Lanes(r_thread, [r_start, r_end, launches.time])
        in_domain = (ranges["domain"].fillna("").astype(str) == phase_domain).to_numpy()
        found = phase_range_rows(ranges, in_domain & use_phases, lanes, inferred)
        assert found is not None  # with the steps at hand, every phase range is placed
        phase_rows, owners = found
        owners = {**inferred.main_threads, **owners}  # ranges' owner first, else main thread
        phases = phase_intervals(ranges, phase_rows, lanes)
        is_phase, phase_rows, p_start, p_end = (
            phases.is_phase,
            phases.rows,
            phases.start,
            phases.end,
        )
        names, phase_code = phases.names, phases.code

        owner = lookup(owners, launches.thread >> PROCESS_SHIFT)
        self_keys = lanes.key(launches.thread, launches.time)
        own = phase_code[stab(p_start, p_end, self_keys)]
        same_thread = np.full(launches.count, -1, dtype=np.int64)
        same_thread[launches.rows] = own
        # Launched from another thread than its process's owner (an autograd worker): the
        # phase, and the ranges too, are those open on the owner thread at launch time.
        cross = (owner >= 0) & (owner != launches.thread)
        owner_keys = lanes.key(owner[cross], launches.time[cross])
        code = own.copy()
        code[cross] = phase_code[stab(p_start, p_end, owner_keys)]
        points = np.concatenate([self_keys, owner_keys])
        point_rows = np.concatenate([launches.rows, launches.rows[cross]])
        order = np.argsort(points, kind="stable")
        return cls(
            names=names,
            code=code,
            same_thread=same_thread,
            cross_rows=launches.rows[cross & (code >= 0)],
            phase_rows=phase_rows,
            phase_thread=r_thread[phase_rows],
            phase_start=r_start[phase_rows],
            is_phase_range=is_phase,
            owners=owners,
            points=points[order],
            point_rows=point_rows[order],
            range_start=lanes.key(r_thread, r_start),
            range_end=lanes.key(r_thread, r_end),
        )


def phase_range_rows(
    ranges: pd.DataFrame, in_domain: np.ndarray, lanes: Lanes, inferred: InferredPhases | None
) -> tuple[np.ndarray, dict[int, int]] | None:
    """Rows of the phase ranges, and each process's owner thread (most known-phase time).

    Known phases (``forward``, ``backward``, ``optimizer``) count wherever they nest; the
    owner's other outermost ranges count only in a step that holds a known one, so that a
    trace without phase ranges never turns ``computing softmax`` into a "phase". Steps come
    from ``inferred``: without it, None where such a range must be placed in its step.
    """
    candidates = _outermost(ranges, in_domain, lanes)
    thread = ranges["thread"].to_numpy(dtype=np.int64)[candidates]
    start = ranges["start"].to_numpy(dtype=np.int64)[candidates]
    end = ranges["end"].to_numpy(dtype=np.int64)[candidates]
    known = _known(ranges)[candidates]
    owners = _owners(thread[known], end[known] - start[known])
    on_owner = np.isin(thread, list(owners.values()))
    if inferred is None:
        if (on_owner & ~known).any():
            return None
        return candidates[on_owner & known], owners
    step = inferred.step_of(thread, start)
    anchored = np.isin(step, step[known & on_owner])
    return candidates[on_owner & (known | anchored)], owners


def _outermost(ranges: pd.DataFrame, mask: np.ndarray, lanes: Lanes) -> np.ndarray:
    """Rows of the outermost in-domain ranges that do not wrap known phases."""
    if not mask.any():
        return np.empty(0, dtype=np.int64)
    thread = ranges["thread"].to_numpy(dtype=np.int64)
    start = lanes.key(thread, ranges["start"].to_numpy(dtype=np.int64))
    end = lanes.key(thread, ranges["end"].to_numpy(dtype=np.int64))
    known = mask & _known(ranges)
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


def _known(ranges: pd.DataFrame) -> np.ndarray:
    """Per range: is it named forward, backward or optimizer (any case)?"""
    return matching(ranges["name"], lambda name: name.lower() in KNOWN_PHASES)


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


def _inferred_steps(
    annotated: _Annotated, inferred: InferredPhases, launches: Launches, phases: PhaseMode
) -> np.ndarray:
    """Per launch: does its phase come from inference? (``auto``: its step has no phase range.)"""
    if phases != "auto":
        return np.full(len(launches.rows), phases == "inferred", dtype=bool)
    steps = inferred.step_of(launches.thread, launches.time)
    annotated_steps = inferred.step_of(annotated.phase_thread, annotated.phase_start)
    return ~np.isin(steps, annotated_steps)


def ordered_phase_names(annotated: list[str], inferred: np.ndarray) -> tuple[list[str], np.ndarray]:
    """All phase names (annotated, then inferred ones not among them, then unattributed),
    and the index of each inferred phase (``PHASES`` order) in that list."""
    names = list(annotated)
    lowered = {name.lower(): i for i, name in enumerate(names)}
    remap = np.full(len(PHASES) + 1, -1, dtype=np.int64)  # the last slot maps NO_PHASE
    present = set(np.unique(inferred).tolist())
    for code, phase in enumerate(PHASES):
        if code in present:
            if phase not in lowered:
                lowered[phase] = len(names)
                names.append(phase)
            remap[code] = lowered[phase]
    names.append(UNATTRIBUTED)
    return names, remap


def phase_source(use_inferred: np.ndarray, has_annotated: bool, phases: PhaseMode) -> str:
    """``annotated``, ``inferred`` or ``mixed``, from which launches' phases were inferred."""
    if phases != "auto":
        return phases
    if not len(use_inferred):
        return "annotated" if has_annotated else "inferred"
    if use_inferred.all():
        return "inferred"
    return "mixed" if use_inferred.any() else "annotated"


def inferred_spans(
    instance: np.ndarray, phase: np.ndarray, time: np.ndarray, names: list[str]
) -> dict[str, tuple[int, int]]:
    """Per phase: how many inferred instances hold activities, and their summed spans.

    One entry per activity whose phase was inferred: its instance, its phase (``PHASES``
    index), its launch time; ``names``: the phase name of each ``PHASES`` index."""
    frame = pd.DataFrame({"instance": instance, "phase": phase, "time": time})
    frame = frame[frame["instance"] != NO_PHASE]
    if frame.empty:
        return {}
    spans = frame.groupby("instance").agg(
        lo=("time", "min"), hi=("time", "max"), phase=("phase", "first")
    )
    per_phase = (spans["hi"] - spans["lo"]).groupby(spans["phase"]).agg(["size", "sum"])
    return {names[int(p)]: (int(row["size"]), int(row["sum"])) for p, row in per_phase.iterrows()}


def inference_note(att: Attribution, rows: np.ndarray, meta: Mapping[str, Any]) -> list[str]:
    """A sentence on the inferred phases among ``rows`` (none when all were annotated)."""
    inferred = int(att.inferred[rows].sum())
    return inference_sentence(inferred, att.phase_source, att.inference.autograd_threads, meta)


def inference_sentence(
    inferred: int, source: str, autograd_threads: np.ndarray, meta: Mapping[str, Any]
) -> list[str]:
    """The note on ``inferred`` activities whose phases were inferred (none for 0)."""
    if not inferred:
        return []
    names = TraceHints.of(meta).thread_names
    threads = autograd_threads.tolist()
    workers = ", ".join(dict.fromkeys(names.get(t, f"thread {t}") for t in threads))
    which = (
        "every step has no forward/backward/optimizer range"
        if source == "inferred"
        else f"{inferred:,} GPU activities lie in steps without phase ranges"
    )
    backward = (
        f"backward = what autograd's threads ({workers}) launched"
        if workers
        else "no autograd thread (pt_autograd_N) is named in this trace, so none is backward"
    )
    return [
        f"Phases inferred ({which}): {backward}; optimizer = the main thread's launches "
        "after a backward pass up to its last optimizer kernel or Optimizer.step range; "
        "forward = the rest (docs/ATTRIBUTION.md, 'Phases without annotations')."
    ]


@dataclass
class PhaseIntervals:
    """The phase ranges chosen, as intervals on their lanes in start order, and their codes."""

    is_phase: np.ndarray
    """Per range row: is it one of the phases."""
    rows: np.ndarray
    start: np.ndarray
    end: np.ndarray
    names: list[str]
    """Distinct phase names in order of first start."""
    code: np.ndarray
    """Per phase (in start order) its name's index, then one last -1: what ``stab``'s -1
    (no phase open) indexes."""


def phase_intervals(ranges: pd.DataFrame, rows: np.ndarray, lanes: Lanes) -> PhaseIntervals:
    """Order the phase ``rows`` of ``ranges`` by their start key on ``lanes`` and code them."""
    r_thread = ranges["thread"].to_numpy(dtype=np.int64)
    is_phase = np.zeros(len(ranges), dtype=bool)
    is_phase[rows] = True
    start = lanes.key(r_thread[rows], ranges["start"].to_numpy(dtype=np.int64)[rows])
    end = lanes.key(r_thread[rows], ranges["end"].to_numpy(dtype=np.int64)[rows])
    order = np.argsort(start, kind="stable")
    rows, start, end = rows[order], start[order], end[order]
    row_names = ranges["name"].to_numpy(dtype=object)[rows]
    names = list(dict.fromkeys(row_names.tolist()))
    name_code = {name: i for i, name in enumerate(names)}
    code = np.append(np.array([name_code[x] for x in row_names], dtype=np.int64), -1)
    return PhaseIntervals(is_phase, rows, start, end, names, code)
