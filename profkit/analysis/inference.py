"""Phases found without annotations, from what PyTorch always leaves in a trace.

When a step carries no ``forward``/``backward``/``optimizer`` ranges, each GPU activity
still says which thread launched it and when (docs/ATTRIBUTION.md, "Phases without
annotations"), and PyTorch's threads say the rest:

- **backward**: what autograd's worker threads launch (``pt_autograd_N``; in a
  torch.profiler trace also the thread running ``autograd::engine::evaluate_function``
  ops), and what any other thread launches while such a backward pass runs;
- **optimizer**: what the main thread launches after a backward pass up to the last
  optimizer kernel (foreach or fused Adam(W)/SGD: ``multi_tensor_apply*``, fused adam) or
  launch inside an ``Optimizer.step#...`` range;
- **forward**: the rest of the main thread's activity (and other threads' meanwhile), i.e.
  what it launches before a step's backward pass.

A backward pass is a run of autograd launches with no main-thread launch between them
(the main thread waits inside ``loss.backward()``), so gradient accumulation's several
passes per step stay apart. Steps start at each ``ProfilerStep#N`` and just after the
optimizer between two backward passes; what precedes the first pass or follows the last
belongs to the first or last step.

Everything is per process (``thread >> 24``) with sorts and binary searches over
(process, time) keys: no loop per activity. :func:`infer_phases` works on any slice of the
two tables (one rank's rows, say) given the same :class:`TraceHints`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profkit.analysis.categories import categorize
from profkit.analysis.intervals import Lanes, inside_any
from profkit.analysis.names import factorize, matching
from profkit.traces.schema import PROCESS_SHIFT
from profkit.workload.names import PHASES

if TYPE_CHECKING:
    from profkit.traces.columns import ActivityColumns

AUTOGRAD_THREAD = re.compile(r"pt_autograd_\d+")
PROFILER_STEP = re.compile(r"ProfilerStep#\d+")
OPTIMIZER_STEP = "Optimizer.step#"
SEED_FILL = "FillFunctor"  # ones_like(loss): the gradient loss.backward() starts from
MAIN_ONLY = ("ProfilerStep#", "Optimizer.")
"""Ranges only a step's driving (main) thread opens: their thread is never autograd's."""
FORWARD, BACKWARD, OPTIMIZER = (PHASES.index(p) for p in ("forward", "backward", "optimizer"))
NO_PHASE = -1
NO_SPLIT = -1  # keys are >= 0, so "launched at or before key -1" holds for none


@dataclass(frozen=True)
class TraceHints:
    """What a reader knows beyond the two tables that inference uses (all optional)."""

    thread_names: Mapping[int, str] = field(default_factory=dict)
    """Thread id -> name (nsys ``ThreadNames``; torch.profiler ``thread_name`` metadata)."""
    autograd_threads: frozenset[int] = frozenset()
    """Threads seen running autograd's ``evaluate_function`` ops (torch.profiler)."""
    profiler_steps: tuple[tuple[int, int], ...] = ()
    """(thread, start ns) of each ``ProfilerStep#N`` a reader kept out of the ranges."""

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> TraceHints:
        """The hints in a :class:`~profkit.traces.Trace`'s ``meta`` (any reader's)."""
        names = meta.get("thread_names") or meta.get("threads") or {}
        steps = [s for s in meta.get("profiler_steps") or () if isinstance(s, Mapping)]
        return cls(
            thread_names={int(t): str(n) for t, n in names.items()},
            autograd_threads=frozenset(int(t) for t in meta.get("autograd_threads") or ()),
            profiler_steps=tuple((int(s["thread"]), int(s["start"])) for s in steps),
        )


@dataclass
class Launches:
    """The activities whose launch call is in the trace: rows, launch times, threads, names."""

    count: int
    """All activities (rows of the kernels table, or of the columns), launched or not."""
    rows: np.ndarray
    time: np.ndarray
    thread: np.ndarray
    name: np.ndarray
    """Per launch: index into ``names``."""
    names: Sequence[str]

    @classmethod
    def of(cls, kernels: pd.DataFrame) -> Launches:
        """The launches of a reader's kernels table."""
        launch = kernels["launch_start"].to_numpy(dtype=np.int64, na_value=-1)
        thread = kernels["launch_thread"].to_numpy(dtype=np.int64, na_value=-1)
        rows = np.flatnonzero((launch >= 0) & kernels["launch_start"].notna().to_numpy())
        codes, uniques = factorize(kernels["name"].iloc[rows])
        names = [str(n) for n in uniques]
        return cls(len(kernels), rows, launch[rows], thread[rows], codes, names)

    @classmethod
    def of_columns(cls, cols: ActivityColumns) -> Launches:
        """The launches of compact columns (their name codes index ``cols.names``)."""
        launch = cols.arrays["launch_start"]
        rows = np.flatnonzero(launch >= 0)
        thread = cols.launch_threads(cols.arrays["launch_thread"][rows])
        name = cols.arrays["name"][rows]
        return cls(len(cols), rows, launch[rows], thread, name, cols.names)


@dataclass
class InferredPhases:
    """Each activity's inferred phase, and the step structure it came from."""

    phase: np.ndarray
    """Per activity: index into ``PHASES`` (forward, backward, optimizer), -1 if unlaunched."""
    instance: np.ndarray | None
    """Per activity: which phase instance (one forward, one backward pass...) holds it;
    -1 for none (unlaunched, or the forward-like tail after the last backward pass). None
    where only :attr:`spans` were kept."""
    main_threads: dict[int, int]
    """Process -> the thread that drives its steps (most launches, autograd's aside)."""
    autograd_threads: np.ndarray
    _lanes: Lanes
    _step_starts: np.ndarray
    spans: InstanceSpans
    """The launch span of every phase instance in each step it reaches."""
    step_phases: np.ndarray
    """(step, phase, launches) for each step and ``PHASES`` index that has launches."""

    @property
    def step_lanes(self) -> Lanes:
        """The (process, time) lanes that step keys are packed on."""
        return self._lanes

    @property
    def step_starts(self) -> np.ndarray:
        """The key at which each step starts, sorted."""
        return self._step_starts

    def step_of(self, thread: np.ndarray, time: np.ndarray) -> np.ndarray:
        """Step number of each (thread, time); steps of two processes never share one."""
        keys = self._lanes.key(np.asarray(thread) >> PROCESS_SHIFT, np.asarray(time))
        return np.searchsorted(self._step_starts, keys, side="right")


@dataclass
class InstanceSpans:
    """Per (phase instance, step) that holds launches: the instance's phase (``PHASES``
    index), its first and last launch time there. A few rows per step, whatever the
    activities: what an instance's wall time needs once steps are chosen."""

    instance: np.ndarray
    step: np.ndarray
    phase: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @classmethod
    def of(
        cls, instance: np.ndarray, step: np.ndarray, phase: np.ndarray, time: np.ndarray
    ) -> InstanceSpans:
        """From one entry per launch (instance ``NO_PHASE``: in no instance)."""
        keep = np.flatnonzero(instance != NO_PHASE)
        group = instance[keep] * (int(step.max(initial=0)) + 1) + step[keep]
        order = np.argsort(group, kind="stable")
        group = group[order]
        starts = np.flatnonzero(np.append(True, group[1:] != group[:-1])) if len(group) else keep
        rows = keep[order]
        times = time[rows]
        return cls(
            instance=instance[rows[starts]],
            step=step[rows[starts]],
            phase=phase[rows[starts]],
            first=np.minimum.reduceat(times, starts) if len(starts) else times,
            last=np.maximum.reduceat(times, starts) if len(starts) else times,
        )

    def per_phase(
        self, steps: np.ndarray | None, names: Sequence[str]
    ) -> dict[str, tuple[int, int]]:
        """Per phase name (``names[PHASES index]``): instances and summed spans (ns) over the
        launches in ``steps`` (None: every step)."""
        rows = (
            np.arange(len(self.instance))
            if steps is None
            else np.flatnonzero(np.isin(self.step, steps))
        )
        if not len(rows):
            return {}
        instance = self.instance[rows]
        order = np.argsort(instance, kind="stable")
        instance = instance[order]
        starts = np.flatnonzero(np.append(True, instance[1:] != instance[:-1]))
        first = np.minimum.reduceat(self.first[rows][order], starts)
        last = np.maximum.reduceat(self.last[rows][order], starts)
        phase = self.phase[rows][order][starts]
        found: dict[str, tuple[int, int]] = {}
        for code in np.unique(phase).tolist():
            mine = phase == code
            found[names[code]] = (int(mine.sum()), int((last[mine] - first[mine]).sum()))
        return found


def infer_phases(
    launches: Launches, ranges: pd.DataFrame, hints: TraceHints | None = None
) -> InferredPhases:
    """Forward, backward or optimizer for every launched activity (see the module doc)."""
    hints = hints or TraceHints()
    process = launches.thread >> PROCESS_SHIFT
    step_thread, step_time = _profiler_steps(ranges, hints)
    # Every time a step is asked for (launches, ranges, step starts) must fit the lanes.
    r_thread = ranges["thread"].to_numpy(np.int64)
    r_times = [ranges["start"].to_numpy(np.int64), ranges["end"].to_numpy(np.int64)]
    lanes = Lanes(
        np.concatenate([process, r_thread >> PROCESS_SHIFT]), [launches.time, step_time, *r_times]
    )
    key = lanes.key(process, launches.time)
    autograd = autograd_threads(hints, ranges)
    is_autograd = np.isin(launches.thread, autograd)
    main_threads = _main_threads(launches.thread[~is_autograd])
    is_main = (launches.thread == lookup(main_threads, process)) & ~is_autograd
    optimizer, seed = kernel_roles(launches, is_main)
    marks = optimizer | (is_main & _in_optimizer_step(ranges, launches))
    passes = _Passes.of(key[is_autograd], key[is_main], lanes)
    phase, gap, split = passes.phases(key, is_autograd, is_main, marks, seed)
    step_starts = np.unique(
        np.concatenate(
            [
                lanes.starts(),
                lanes.key(step_thread >> PROCESS_SHIFT, step_time),
                passes.step_starts(split),
            ]
        )
    )
    per_activity = np.full(launches.count, NO_PHASE, dtype=np.int64)
    per_activity[launches.rows] = phase
    of_launch = passes.instances(phase, gap)
    instance = np.full(launches.count, NO_PHASE, dtype=np.int64)
    instance[launches.rows] = of_launch
    step = np.searchsorted(step_starts, key, side="right")
    return InferredPhases(
        phase=per_activity,
        instance=instance,
        main_threads=main_threads,
        autograd_threads=autograd,
        _lanes=lanes,
        _step_starts=step_starts,
        spans=InstanceSpans.of(of_launch, step, phase, launches.time),
        step_phases=step_phase_counts(step, phase),
    )


def step_phase_counts(step: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """(step, phase, launches) rows for the (step, phase) pairs of launches given."""
    if not len(step):
        return np.zeros((0, 3), dtype=np.int64)
    counts = np.bincount(step * len(PHASES) + phase)  # steps are few: no sort
    pair = np.flatnonzero(counts)
    count = counts[pair]
    return np.stack([pair // len(PHASES), pair % len(PHASES), count], axis=1).astype(np.int64)


@dataclass
class _Passes:
    """The backward passes of every process, sorted by start key, and the gaps between.

    Gap ``g`` is what lies after pass ``g - 1`` and before pass ``g``; a launch's gap is the
    number of passes begun at or before it. An empty pseudo-pass opens every process's
    lane, so that no gap spans two processes.
    """

    start: np.ndarray
    end: np.ndarray
    real: np.ndarray
    span: int

    @classmethod
    def of(cls, autograd_keys: np.ndarray, main_keys: np.ndarray, lanes: Lanes) -> _Passes:
        """A pass is a run of autograd launches of one process with no main launch between."""
        keys = np.sort(autograd_keys)
        after_main = np.searchsorted(np.sort(main_keys), keys, side="right")
        lane = keys // lanes.span
        first = np.ones(len(keys), dtype=bool)
        first[1:] = (after_main[1:] != after_main[:-1]) | (lane[1:] != lane[:-1])
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:] - 1, len(keys) - 1) if len(keys) else starts
        pseudo = lanes.starts() - 1
        start = np.concatenate([keys[starts], pseudo])
        end = np.concatenate([keys[ends], pseudo - 1])
        real = np.concatenate([np.ones(len(starts), bool), np.zeros(len(pseudo), bool)])
        order = np.argsort(start, kind="stable")
        return cls(start[order], end[order], real[order], lanes.span)

    def phases(
        self,
        key: np.ndarray,
        is_autograd: np.ndarray,
        is_main: np.ndarray,
        marks: np.ndarray,
        seed: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per launch: its phase and gap; per gap: the key of its last optimizer mark."""
        gap = np.searchsorted(self.start, key, side="right")
        in_pass = (gap > 0) & (key <= self.end[np.maximum(gap - 1, 0)])
        split = _optimizer_splits(gap[marks], key[marks], len(self.start) + 1)
        phase = np.where(
            is_autograd | in_pass,
            BACKWARD,
            np.where(key <= split[gap], OPTIMIZER, FORWARD),
        )
        # loss.backward() seeds the gradient with ones_like(loss) on the main thread just
        # before autograd's thread starts: that fill belongs to the pass it starts.
        seeds = _last_before(key, is_main, self.start[self.real], self.span)
        seeds = seeds[seed[seeds]]
        phase[seeds] = BACKWARD
        gap[seeds] += 1
        return phase, gap, split

    def step_starts(self, split: np.ndarray) -> np.ndarray:
        """Keys where a step starts: just after the optimizer between two passes."""
        between = np.zeros(len(split), dtype=bool)
        between[1:-1] = self.real[:-1] & self.real[1:]
        return split[between & (split != NO_SPLIT)] + 1

    def instances(self, phase: np.ndarray, gap: np.ndarray) -> np.ndarray:
        """Per launch: its phase instance, a (gap, phase) number.

        After a process's last pass, what follows the optimizer starts no step the trace
        holds (``loss.item()``'s copy, a forward cut off by the capture's end): its phase
        stays forward, but it is no forward instance.
        """
        after_pass = np.append(False, self.real)[gap]
        before_pass = np.append(self.real, False)[gap]
        trailing = (phase == FORWARD) & after_pass & ~before_pass
        return np.where(trailing, NO_PHASE, gap * len(PHASES) + phase)


def kernel_roles(launches: Launches, is_main: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per launch: an optimizer kernel? a fill (the gradient seed's ``FillFunctor``)?

    Only the main thread's launches are looked at (the others are never either); each
    distinct name is matched once.
    """
    optimizer = np.zeros(len(launches.rows), dtype=bool)
    fill = np.zeros(len(launches.rows), dtype=bool)
    if not is_main.any():
        return optimizer, fill
    present = np.unique(launches.name[is_main])
    is_optimizer = np.zeros(len(launches.names), dtype=bool)
    is_fill = np.zeros(len(launches.names), dtype=bool)
    for code in present.tolist():
        name = str(launches.names[code])
        is_optimizer[code] = categorize(name) == "optimizer"
        is_fill[code] = SEED_FILL in name
    optimizer[is_main] = is_optimizer[launches.name[is_main]]
    fill[is_main] = is_fill[launches.name[is_main]]
    return optimizer, fill


def lookup(mapping: Mapping[int, int], keys: np.ndarray) -> np.ndarray:
    """``mapping[key]`` for each key, -1 where the key is absent (vectorised)."""
    if not mapping:
        return np.full(len(keys), -1, dtype=np.int64)
    known = np.array(sorted(mapping), dtype=np.int64)
    values = np.array([mapping[k] for k in known.tolist()], dtype=np.int64)
    index = np.minimum(np.searchsorted(known, keys), len(known) - 1)
    return np.where(known[index] == keys, values[index], -1)


def autograd_threads(hints: TraceHints, ranges: pd.DataFrame) -> np.ndarray:
    """Autograd's worker threads: named so, or seen running its ops (not the loop's)."""
    named = {t for t, name in hints.thread_names.items() if AUTOGRAD_THREAD.search(name)}
    # The thread that opens ProfilerStep or Optimizer ranges drives the loop: if it ran an
    # autograd op itself (a CPU-side node), that does not make it autograd's worker.
    opens_main_only = matching(ranges["name"], lambda name: name.startswith(MAIN_ONLY))
    driving = set(ranges["thread"][opens_main_only].tolist())
    driving |= {thread for thread, _ in hints.profiler_steps}
    return np.array(sorted(named | (set(hints.autograd_threads) - driving)), dtype=np.int64)


def _main_threads(thread: np.ndarray) -> dict[int, int]:
    """Per process, the thread with the most launches (ties: the lowest id)."""
    if not len(thread):
        return {}
    counts = pd.Series(thread).value_counts()
    frame = pd.DataFrame({"thread": counts.index.to_numpy(np.int64), "n": counts.to_numpy()})
    frame["process"] = frame["thread"].to_numpy() >> PROCESS_SHIFT
    frame = frame.sort_values(["process", "n", "thread"], ascending=[True, False, True])
    best = frame.drop_duplicates("process")
    return dict(zip(best["process"].tolist(), best["thread"].tolist(), strict=True))


def _profiler_steps(ranges: pd.DataFrame, hints: TraceHints) -> tuple[np.ndarray, np.ndarray]:
    """(thread, start) of every ``ProfilerStep#N``, from the ranges and the reader's hints."""
    steps = ranges[profiler_step_rows(ranges)]
    thread = np.concatenate(
        [steps["thread"].to_numpy(np.int64), np.array([t for t, _ in hints.profiler_steps])]
    ).astype(np.int64)
    start = np.concatenate(
        [steps["start"].to_numpy(np.int64), np.array([s for _, s in hints.profiler_steps])]
    ).astype(np.int64)
    return thread, start


def profiler_step_rows(ranges: pd.DataFrame) -> np.ndarray:
    """Per range: is it a ``ProfilerStep#N``?"""
    return matching(ranges["name"], lambda name: bool(PROFILER_STEP.fullmatch(name)))


def _in_optimizer_step(ranges: pd.DataFrame, launches: Launches) -> np.ndarray:
    """Per launch: made inside an ``Optimizer.step#...`` range of its own thread?"""
    steps = ranges[matching(ranges["name"], lambda name: name.startswith(OPTIMIZER_STEP))]
    if steps.empty:
        return np.zeros(len(launches.rows), dtype=bool)
    thread = steps["thread"].to_numpy(np.int64)
    start, end = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
    lanes = Lanes(thread, [start, end, launches.time])
    return inside_any(
        lanes.key(thread, start),
        lanes.key(thread, end),
        lanes.key(launches.thread, launches.time),
    )


def _last_before(key: np.ndarray, is_main: np.ndarray, starts: np.ndarray, span: int) -> np.ndarray:
    """Index (into the launches) of the main thread's last launch before each start key,
    for the starts that have one in the same process lane."""
    main = np.flatnonzero(is_main)
    main = main[np.argsort(key[main], kind="stable")]
    before = np.searchsorted(key[main], starts, side="left") - 1
    found = main[np.maximum(before, 0)]
    keep = (before >= 0) & (key[found] // span == starts // span)
    return found[keep]


def _optimizer_splits(gap: np.ndarray, key: np.ndarray, gaps: int) -> np.ndarray:
    """Per gap between backward passes: the key of its last optimizer mark (or NO_SPLIT)."""
    split = np.full(gaps, NO_SPLIT, dtype=np.int64)
    order = np.argsort(key, kind="stable")
    gap, key = gap[order], key[order]  # sorted keys: gap numbers do not decrease
    last = np.ones(len(gap), dtype=bool)
    last[:-1] = gap[1:] != gap[:-1]
    split[gap[last]] = key[last]
    return split
