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
(process, time) keys: no loop per activity. :func:`infer_columns` reads per-activity launch
columns (:class:`LaunchColumns`: the compact columns' own arrays) chunk by chunk, in four
passes, so that a 30-million-kernel export is inferred in about 10 bytes a launch:

1. launches per launching thread (a bincount per chunk): the main threads. Whatever is
   per thread is a table indexed by the columns' thread codes: no thread id per launch;
2. the keys of autograd's launches and of the main threads' launches, gathered into two
   arrays and each sorted once (the only per-launch memory held across chunks, 8 bytes a
   key), and the keys of the optimizer marks (a few per step): the passes, each gap's
   optimizer split and each pass's gradient-seed candidate, after which both key arrays
   are dropped;
3. only where several main launches share a candidate's key: which of them is the last;
4. each launch's phase (one byte per activity), instance and step, with each chunk's
   instance spans and (step, phase) counts, merged at the end (a few rows per step).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pandas as pd

from profkit.analysis.categories import categorize
from profkit.analysis.chunked import map_chunks
from profkit.analysis.intervals import Lanes, stab, union
from profkit.analysis.names import matching
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
T = TypeVar("T")


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
class LaunchColumns:
    """Per activity, what inference reads of it: its launch call's start (ns; -1 where
    unknown), its launching thread (a code into ``threads``; -1 where unknown) and its name
    (a code into ``names``). Inference reads them a chunk at a time and copies none whole."""

    launch_start: np.ndarray
    launch_thread: np.ndarray
    name: np.ndarray
    threads: np.ndarray
    """Thread id of each ``launch_thread`` code."""
    names: Sequence[str]
    bounds: tuple[int, int] | None
    """The earliest and latest known launch start (None where no launch is known)."""

    def __len__(self) -> int:
        return len(self.launch_start)

    @classmethod
    def of_columns(cls, cols: ActivityColumns) -> LaunchColumns:
        """The compact columns' own arrays (their launch bounds computed once, kept)."""
        cols.load(["launch_start", "launch_thread", "name"])
        a = cols.arrays
        threads = np.asarray(cols.threads, dtype=np.int64)
        bounds = cols.launch_bounds()
        return cls(a["launch_start"], a["launch_thread"], a["name"], threads, cols.names, bounds)


@dataclass
class InferredPhases:
    """Each activity's inferred phase, and the step structure it came from."""

    phase: np.ndarray
    """Per activity: index into ``PHASES`` (forward, backward, optimizer), -1 if unlaunched
    (int8)."""
    main_threads: dict[int, int]
    """Process -> the thread that drives its steps (most launches, autograd's aside)."""
    autograd_threads: np.ndarray
    _lanes: Lanes
    _step_starts: np.ndarray
    spans: InstanceSpans
    """The launch span of every phase instance in each step it reaches."""
    step_phases: np.ndarray
    """(step, phase, launches) for each step and ``PHASES`` index that has launches."""
    closures: int = 0
    """Gaps before a backward pass whose launches lay inside an ``Optimizer.step`` range
    (Lightning's ``optimizer.step(closure)``): forwards run inside the step."""

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
        times = time[keep]
        return cls.merged([cls(instance[keep], step[keep], phase[keep], times, times)])

    @classmethod
    def merged(cls, parts: Sequence[InstanceSpans]) -> InstanceSpans:
        """One row per (instance, step) of ``parts`` (each chunk's), sorted by (instance,
        step): the first of its firsts, the last of its lasts."""
        empty = np.zeros(0, dtype=np.int64)
        instance, step, phase, first, last = (
            np.concatenate([empty, *(getattr(p, name) for p in parts)]).astype(np.int64)
            for name in ("instance", "step", "phase", "first", "last")
        )
        group = instance * (int(step.max(initial=0)) + 1) + step
        order = np.argsort(group, kind="stable")
        group = group[order]
        starts = np.flatnonzero(np.append(True, group[1:] != group[:-1])) if len(group) else empty
        first, last = first[order], last[order]
        return cls(
            instance=instance[order][starts],
            step=step[order][starts],
            phase=phase[order][starts],
            first=np.minimum.reduceat(first, starts) if len(starts) else first,
            last=np.maximum.reduceat(last, starts) if len(starts) else last,
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


def infer_columns(
    columns: LaunchColumns,
    ranges: pd.DataFrame,
    hints: TraceHints | None = None,
    *,
    chunk: int,
) -> InferredPhases:
    """Forward, backward or optimizer for every launched activity of ``columns``, read
    ``chunk`` activities at a time (see the module doc): the phase per activity as int8."""
    hints = hints or TraceHints()
    size = max(int(chunk), 1)
    ids = np.append(np.asarray(columns.threads, dtype=np.int64), -1)  # code -1: the last entry
    launches = _launches_per_thread(columns, size)
    step_thread, step_time = _profiler_steps(ranges, hints)
    # Every time a step is asked for (launches, ranges, step starts) must fit the lanes.
    r_thread = ranges["thread"].to_numpy(np.int64)
    r_times = [ranges["start"].to_numpy(np.int64), ranges["end"].to_numpy(np.int64)]
    bounds = np.array(columns.bounds or (), dtype=np.int64)
    process = ids >> PROCESS_SHIFT
    lanes = Lanes(
        np.concatenate([process[launches > 0], r_thread >> PROCESS_SHIFT]),
        [bounds, step_time, *r_times],
    )
    autograd = autograd_threads(hints, ranges)
    is_autograd = np.isin(ids, autograd)
    main_threads = main_threads_of(ids[~is_autograd], launches[~is_autograd])
    is_main = (ids == lookup(main_threads, process)) & ~is_autograd
    threads = _Threads(lanes.codes(process), is_autograd, is_main)
    reader = _Reader(columns, threads.lane, lanes.base, lanes.span, size)
    marks = _Marks.of(ranges, ids, columns.names, bounds)
    autograd_keys, main_keys, mark_rows = _sorted_keys(reader, threads, launches, marks)
    passes = _Passes.of(autograd_keys, main_keys, lanes, size)
    key, left = mark_rows[:, 0], mark_rows[:, 1]
    in_step = left >= 0
    keep = ~in_step
    keep[in_step] = enclosing_no_pass(passes, key[in_step], left[in_step])
    dropped = key[in_step & ~keep]
    closures = len(np.unique(np.searchsorted(passes.start, dropped, side="right")))
    split = passes.splits(key[keep])
    seeds = _Seeds.of(passes.seed_candidates(main_keys), main_keys, marks.is_fill)
    del autograd_keys, main_keys  # the bulk of inference's memory: not needed any more
    if seeds.shared.any():
        seeds.row[seeds.shared] = _last_rows(reader, threads, seeds.key[seeds.shared])
    step_starts = np.unique(
        np.concatenate(
            [
                lanes.starts(),
                lanes.key(step_thread >> PROCESS_SHIFT, step_time),
                passes.step_starts(split),
            ]
        )
    )
    phase = np.empty(len(columns), dtype=np.int8)

    def assign(lo: int, hi: int) -> tuple[InstanceSpans, np.ndarray]:  # rows lo..hi only
        rows, code, time, key = reader.launches(lo, hi)
        launched, gap = passes.phases(key, threads.autograd[code], split)
        seeded = seeds.among(key, threads.main[code], lo, rows, columns.name[lo:hi])
        launched[seeded] = BACKWARD  # the gradient seed opens the pass it starts
        gap[seeded] += 1
        of_launch = passes.instances(launched, gap)
        step = np.searchsorted(step_starts, key, side="right")
        phase[lo:hi] = NO_PHASE
        phase[lo + rows] = launched
        counts = np.bincount(step * len(PHASES) + launched)
        return InstanceSpans.of(of_launch, step, launched, time), counts

    spans: list[InstanceSpans] = []
    counts = np.zeros(0, dtype=np.int64)
    for part, part_counts in reader.map(assign):
        spans.append(part)
        counts = _added(counts, part_counts)
    return InferredPhases(
        phase=phase,
        main_threads=main_threads,
        autograd_threads=autograd,
        _lanes=lanes,
        _step_starts=step_starts,
        spans=InstanceSpans.merged(spans),
        step_phases=step_phase_rows(counts),
        closures=closures,
    )


def step_phase_rows(counts: np.ndarray) -> np.ndarray:
    """(step, phase, launches) rows from launch counts indexed by ``step * len(PHASES) +
    phase`` (steps are few: a bincount, no sort), for the pairs that have launches."""
    pair = np.flatnonzero(counts)
    count = counts[pair]
    return np.stack([pair // len(PHASES), pair % len(PHASES), count], axis=1).astype(np.int64)


def _added(total: np.ndarray, part: np.ndarray) -> np.ndarray:
    """``total + part`` for counts of different lengths (each as long as what it counted)."""
    if len(part) > len(total):
        total = np.concatenate([total, np.zeros(len(part) - len(total), dtype=np.int64)])
    total[: len(part)] += part
    return total


@dataclass
class _Threads:
    """Per launching-thread code, then one entry for code -1 (unknown), so that the codes
    themselves index it: the lane code of the thread's process, and whether the thread is
    one of autograd's or its process's main thread."""

    lane: np.ndarray
    autograd: np.ndarray
    main: np.ndarray


@dataclass
class _Reader:
    """The launches of a chunk of activities, with their (process, time) keys."""

    columns: LaunchColumns
    lane: np.ndarray
    """Per thread code (:class:`_Threads`): its process's lane code."""
    base: int
    span: int
    size: int

    def launches(self, lo: int, hi: int) -> tuple[np.ndarray, ...]:
        """Of the launched activities among ``lo..hi``: row (from ``lo``), thread code,
        launch time and key."""
        launch = self.columns.launch_start[lo:hi]
        rows = np.flatnonzero(launch >= 0)
        code = self.columns.launch_thread[lo:hi][rows]
        time = launch[rows]
        return rows, code, time, self.lane[code] * self.span + (time - self.base)

    def map(self, fn: Callable[[int, int], T]) -> Iterator[T]:
        """``fn(lo, hi)`` over every chunk of activities, results in chunk order."""
        return map_chunks(fn, len(self.columns), self.size)


def _launches_per_thread(columns: LaunchColumns, size: int) -> np.ndarray:
    """Launches per thread code, then for code -1 (unknown), as :class:`_Threads` orders."""
    bins = len(columns.threads) + 1

    def count(lo: int, hi: int) -> np.ndarray:
        launch = columns.launch_start[lo:hi]
        code = columns.launch_thread[lo:hi][launch >= 0]
        return np.bincount(code.astype(np.int64) + 1, minlength=bins)  # -1 counts in bin 0

    total = np.zeros(bins, dtype=np.int64)
    for part in map_chunks(count, len(columns), size):
        total += part
    return np.roll(total, -1)  # bin 0 (code -1) last


@dataclass
class _Marks:
    """What marks the optimizer among the main thread's launches: an optimizer kernel, or a
    launch inside an ``Optimizer.step#...`` range of its own thread. Also which names are
    the gradient seed's fill (:data:`SEED_FILL`)."""

    is_optimizer: np.ndarray
    """Per name code."""
    is_fill: np.ndarray
    """Per name code."""
    lane: np.ndarray
    """Per thread code (:class:`_Threads`): its lane among the ranges' threads."""
    base: int
    span: int
    start: np.ndarray
    end: np.ndarray
    """The ``Optimizer.step`` ranges' keys, as disjoint intervals."""

    @classmethod
    def of(
        cls, ranges: pd.DataFrame, threads: np.ndarray, names: Sequence[str], bounds: np.ndarray
    ) -> _Marks:
        """For launches by ``threads`` (one per code, code -1's last) named by ``names``;
        ``bounds``: the earliest and latest launch start (none where none is known)."""
        # Every distinct name is matched once (not only the main threads', unknown before
        # the chunks are read): only main-thread launches look them up.
        text = [str(name) for name in names]
        is_optimizer = np.array([categorize(n) == "optimizer" for n in text], dtype=bool)
        is_fill = np.array([SEED_FILL in n for n in text], dtype=bool)
        steps = ranges[matching(ranges["name"], lambda name: name.startswith(OPTIMIZER_STEP))]
        thread = steps["thread"].to_numpy(np.int64)
        start, end = steps["start"].to_numpy(np.int64), steps["end"].to_numpy(np.int64)
        lanes = Lanes(thread, [start, end, bounds])
        empty = np.zeros(0, dtype=np.int64)
        inside = (
            union(lanes.key(thread, start), lanes.key(thread, end))
            if len(steps)
            else (empty, empty)
        )
        return cls(is_optimizer, is_fill, lanes.codes(threads), lanes.base, lanes.span, *inside)

    def of_launches(
        self, code: np.ndarray, time: np.ndarray, name: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per launch (all the main thread's): is it an optimizer kernel, and how long
        before the end of the ``Optimizer.step`` range it lies in (-1: in none)."""
        left = np.full(len(code), -1, dtype=np.int64)
        if len(self.start):
            keys = self.lane[code] * self.span + (time - self.base)
            inside = stab(self.start, self.end, keys)
            left = np.where(inside >= 0, self.end[inside] - keys, -1)
        return self.is_optimizer[name], left


def enclosing_no_pass(passes: _Passes, key: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Per launch inside an ``Optimizer.step`` range (its key, and how long before the
    range's end): does no backward pass start between it and that end? Lightning's
    ``optimizer.step(closure)`` runs forward and backward inside the step: only what
    follows the last pass in it is the optimizer's."""
    starts = passes.start[passes.real]
    return np.searchsorted(starts, key, side="right") == np.searchsorted(
        starts, key + left, side="left"
    )


def _sorted_keys(
    reader: _Reader, threads: _Threads, launches: np.ndarray, marks: _Marks
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys of autograd's launches and of the main threads' launches, each sorted, and
    of the optimizer marks: one pass, into arrays sized from the per-thread counts."""
    autograd = np.empty(int(launches[threads.autograd].sum()), dtype=np.int64)
    main = np.empty(int(launches[threads.main].sum()), dtype=np.int64)
    found: list[np.ndarray] = [np.zeros((0, 2), dtype=np.int64)]
    columns = reader.columns

    def gather(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows, code, time, key = reader.launches(lo, hi)
        mine = np.flatnonzero(threads.main[code])
        kernel, left = marks.of_launches(code[mine], time[mine], columns.name[lo:hi][rows[mine]])
        marked = kernel | (left >= 0)
        # An optimizer kernel marks wherever it is (left -1); a launch in an Optimizer.step
        # range only where no pass follows it there (enclosing_no_pass)
        mark = np.stack([key[mine[marked]], np.where(kernel, -1, left)[marked]], axis=1)
        return key[threads.autograd[code]], key[mine], mark

    at_autograd = at_main = 0
    for autograd_part, main_part, marked in reader.map(gather):
        autograd[at_autograd : at_autograd + len(autograd_part)] = autograd_part
        main[at_main : at_main + len(main_part)] = main_part
        at_autograd += len(autograd_part)
        at_main += len(main_part)
        found.append(marked)
    autograd.sort()  # in place: no second copy
    main.sort()
    return autograd, main, np.concatenate(found)


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
    def of(
        cls, autograd_keys: np.ndarray, main_keys: np.ndarray, lanes: Lanes, size: int
    ) -> _Passes:
        """A pass is a run of autograd launches of one process with no main launch between
        (both key arrays sorted); looked at ``size`` keys at a time."""
        keys, span = autograd_keys, lanes.span

        def firsts(lo: int, hi: int) -> np.ndarray:  # the runs begun among keys lo..hi
            run = keys[max(lo - 1, 0) : hi]  # with the key before, to compare across chunks
            after_main = np.searchsorted(main_keys, run, side="right")
            lane = run // span
            first = (after_main[1:] != after_main[:-1]) | (lane[1:] != lane[:-1])
            if lo == 0:
                first = np.append(True, first)
            return lo + np.flatnonzero(first)

        starts = np.concatenate([np.zeros(0, dtype=np.intp), *map_chunks(firsts, len(keys), size)])
        ends = np.append(starts[1:] - 1, len(keys) - 1) if len(keys) else starts
        pseudo = lanes.starts() - 1
        start = np.concatenate([keys[starts], pseudo])
        end = np.concatenate([keys[ends], pseudo - 1])
        real = np.concatenate([np.ones(len(starts), bool), np.zeros(len(pseudo), bool)])
        order = np.argsort(start, kind="stable")
        return cls(start[order], end[order], real[order], span)

    def phases(
        self, key: np.ndarray, is_autograd: np.ndarray, split: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per launch: its phase (the gradient seed aside: :class:`_Seeds`) and gap."""
        gap = np.searchsorted(self.start, key, side="right")
        in_pass = (gap > 0) & (key <= self.end[np.maximum(gap - 1, 0)])
        phase = np.where(
            is_autograd | in_pass,
            BACKWARD,
            np.where(key <= split[gap], OPTIMIZER, FORWARD),
        )
        return phase, gap

    def splits(self, mark_keys: np.ndarray) -> np.ndarray:
        """Per gap between backward passes: the key of its last optimizer mark (or
        NO_SPLIT, below every key)."""
        split = np.full(len(self.start) + 1, NO_SPLIT, dtype=np.int64)
        np.maximum.at(split, np.searchsorted(self.start, mark_keys, side="right"), mark_keys)
        return split

    def seed_candidates(self, main_keys: np.ndarray) -> np.ndarray:
        """Per pass (sorted, distinct): the key of the main thread's last launch before it
        in its process, where there is one: ``loss.backward()``'s gradient seed, if a fill."""
        starts = self.start[self.real]
        if not len(main_keys):
            return np.zeros(0, dtype=np.int64)
        before = np.searchsorted(main_keys, starts, side="left") - 1
        found = main_keys[np.maximum(before, 0)]
        keep = (before >= 0) & (found // self.span == starts // self.span)
        return np.unique(found[keep])

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


@dataclass
class _Seeds:
    """The gradient seeds: per candidate key (:meth:`_Passes.seed_candidates`), the main
    launch there is the seed if its name is a fill (``is_fill``, per name code).

    Where several main launches share a candidate's key (``shared``), the seed is the last
    of them in activity order (``row``; -1 while unknown, and where the key is one launch's):
    the launch that a stable sort of the main launches by key puts last before the pass.
    """

    key: np.ndarray
    shared: np.ndarray
    row: np.ndarray
    is_fill: np.ndarray

    @classmethod
    def of(cls, keys: np.ndarray, main_keys: np.ndarray, is_fill: np.ndarray) -> _Seeds:
        """For candidate ``keys`` among the sorted ``main_keys``."""
        count = np.searchsorted(main_keys, keys, side="right") - np.searchsorted(main_keys, keys)
        return cls(keys, count > 1, np.full(len(keys), -1, dtype=np.int64), is_fill)

    def among(
        self, key: np.ndarray, is_main: np.ndarray, lo: int, rows: np.ndarray, name: np.ndarray
    ) -> np.ndarray:
        """Which launches of the chunk from activity ``lo`` are seeds, as indices into them
        (per launch: key, main-thread flag, row from ``lo``; ``name``: the chunk's name codes,
        per activity)."""
        if not len(self.key):
            return np.zeros(0, dtype=np.intp)
        mine = np.flatnonzero(is_main)  # only main launches can be seeds: search those
        at = np.minimum(np.searchsorted(self.key, key[mine]), len(self.key) - 1)
        found = self.key[at] == key[mine]
        hit, wanted = mine[found], self.row[at[found]]
        hit = hit[(wanted < 0) | (wanted == lo + rows[hit])]
        return hit[self.is_fill[name[rows[hit]]]]


def _last_rows(reader: _Reader, threads: _Threads, keys: np.ndarray) -> np.ndarray:
    """Per key (sorted): the last activity row among the main launches with that key."""

    def find(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        rows, code, _, key = reader.launches(lo, hi)
        mine = threads.main[code]
        key, rows = key[mine], lo + rows[mine]
        at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
        hit = keys[at] == key
        return at[hit], rows[hit]

    last = np.full(len(keys), -1, dtype=np.int64)
    for at, rows in reader.map(find):
        np.maximum.at(last, at, rows)
    return last


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


def main_threads_of(thread: np.ndarray, launches: np.ndarray) -> dict[int, int]:
    """Per process, the thread with the most launches (ties: the lowest id), from each
    thread's launch count (an id given twice has its counts added up)."""
    keep = launches > 0
    if not keep.any():
        return {}
    counts = pd.Series(launches[keep]).groupby(thread[keep]).sum()
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
