"""Which ranges and which phase each GPU activity belongs to (docs/ATTRIBUTION.md), chunk
by chunk, kept.

The rule: an activity belongs to the ranges open on its *launching* thread when its launch
call started. PyTorch launches every backward kernel from autograd worker threads, which
hold no ranges; an activity launched from any thread other than its process's *phase
owner* (:mod:`.phase_ranges`) also belongs to the ranges open on the owner at that moment,
and takes its phase from there. Steps without phase ranges get their phases inferred
(:mod:`.inference`). Everything is sorts and binary searches over (thread, time) keys
packed into int64 (:mod:`.intervals`), so the cost is O((activities + ranges) log)
whatever the nesting.

It is applied per chunk of activities against the ranges, which are few: each activity gets its phase, the phase its
launching thread alone would give it (for the notes), and the *slots* of its attribution
points. Every range start and end key, sorted, cuts the (thread, time) keys into slots; a
point lies in a range exactly when its slot lies between the range's start and end slots,
so any range question (``--range``, the range table) is a look-up by slot. An activity
has a point on its launching thread (slot -1 when its launch is unknown) and, when it was
launched from a worker thread, one on the owner thread of its process (-1 otherwise).

These four small arrays (12 bytes an activity) depend on the trace alone, not on the
query, so they are kept with the columns (:meth:`ActivityColumns.remember`), and through
them in the cache: a later query of the same trace starts from them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis import chunked
from profkit.analysis.chunked import map_chunks
from profkit.analysis.inference import (
    InferredPhases,
    InstanceSpans,
    LaunchColumns,
    TraceHints,
    autograd_threads,
    infer_columns,
    profiler_step_rows,
)
from profkit.analysis.intervals import Lanes, stab
from profkit.analysis.phase_marks import (
    PhaseRanges,
    library_ranges,
    mapped_marks,
    phase_domains,
    spelled_in_domain,
    unclosed_ranges,
)
from profkit.analysis.phase_ranges import (
    PHASE_MODES,
    PhaseMode,
    default_phase_domain,
    ordered_phase_names,
    phase_intervals,
    phase_range_rows,
    phase_source,
)
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns, Derived
from profkit.traces.schema import PROCESS_SHIFT
from profkit.workload.names import PHASES

KEPT_AS = "attribution"
INFERENCE_AS = "inference"
VERSION = 3  # bumped whenever what the arrays mean changes (3: library ranges never phases)
MAX_PROJECTED = 1 << 23  # projected phase bounds at most (each lane × each phase bound)
ARRAYS = {
    "phase": np.int16,
    "same": np.int16,
    "self_slot": np.int32,
    "owner_slot": np.int32,
    "inferred": np.uint8,  # 1 where the phase was inferred, not read from a range
}


@dataclass
class Plan:
    """What attribution needs from the ranges and the inferred phases (see the module
    doc)."""

    lanes: Lanes
    domain: str
    owners: dict[int, int]
    phase_names: list[str]
    phase_code: np.ndarray  # per phase interval, then the catch-all slot
    p_start: np.ndarray
    p_end: np.ndarray
    is_phase: np.ndarray
    range_start: np.ndarray
    range_end: np.ndarray
    bounds: np.ndarray
    """Every range start and end key, sorted: they cut the keys into slots; with the
    phases' bounds projected onto every lane, when that makes each slot one phase's."""
    inference: InferredPhases | None
    """None where inferring changes nothing (:func:`_inference_unneeded`)."""
    mode: PhaseMode
    inferred_steps: np.ndarray
    """The steps whose launches take inferred phases (sorted)."""
    remap: np.ndarray
    """Per ``PHASES`` index, its index in ``phase_names``."""
    phase_source: str
    inferred_spans: dict[str, tuple[int, int]]
    """Per inferred phase name: instances and summed launch spans (ns)."""
    slot_phase: np.ndarray | None = None
    """The phase of every point in each slot (then -1 for slot -1), where one phase holds
    them all (:func:`_projected_phases`); the sums check it as they go."""
    range_names: np.ndarray | None = None
    """Per range, the name it has as a phase where that differs from its own (ranges
    mapped by ``--phase-ranges``, ``DOMAIN:forward`` names); None where none does."""

    @property
    def autograd_threads(self) -> np.ndarray:
        """Autograd's threads, where phases were inferred (for the notes)."""
        return self.inference.autograd_threads if self.inference else np.zeros(0, np.int64)

    @property
    def closures(self) -> int:
        """Forward/backward passes found inside ``Optimizer.step`` ranges (Lightning)."""
        return self.inference.closures if self.inference else 0

    @property
    def step_phases(self) -> np.ndarray:
        """(step, phase, launches) rows of the inferred phases (none without inference)."""
        return self.inference.step_phases if self.inference else np.zeros((0, 3), np.int64)

    def slot(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each key: how many bounds lie at or before it."""
        return np.searchsorted(self.bounds, keys, side="right")

    def slots_inside(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Per slot (then a last entry for slot -1, "no point"): inside some [start, end)?

        ``start`` and ``end`` are range bounds (so in ``bounds``), which makes it exact.
        """
        marks = np.zeros(len(self.bounds) + 2, dtype=np.int64)
        np.add.at(marks, self.slot(start), 1)
        np.add.at(marks, self.slot(end), -1)
        inside = np.cumsum(marks) > 0
        inside[-1] = False
        return inside


def plan_of(
    cols: ActivityColumns,
    phase_domain: str | None = None,
    phases: PhaseMode = "auto",
    phase_ranges: PhaseRanges | None = None,
) -> Plan:
    """The phases (annotated where a step has phase ranges, inferred elsewhere) and the slot
    bounds.

    Inference costs a pass over every launch and memory per launch, and it changes nothing
    where each launching process has phase ranges, every step holds some and autograd's
    launches all fall in them: :func:`_inference_unneeded` checks that first (its verdict
    kept with the columns), and the plan of such a trace is the annotated one alone.
    ``phase_ranges``: the user's marks that are the phases (``--phase-ranges``)."""
    if phases not in PHASE_MODES:
        raise BadInput(f"--phases must be one of {', '.join(PHASE_MODES)}, got {phases!r}")
    if phase_ranges is not None:
        phase_ranges.check_found(cols.ranges)
    per_process = phase_domain is None
    if phase_domain is None:
        phase_domain = default_phase_domain(cols.ranges)
    domain = phase_domain if phase_ranges is None else f"--phase-ranges {phase_ranges}"
    if phases != "inferred":
        plan = _plan(cols, domain, per_process, phases, None, phase_ranges)
        if plan is not None and _inference_unneeded(cols, plan):
            return plan
    found = _plan(cols, domain, per_process, phases, inferred_phases(cols), phase_ranges)
    assert found is not None  # with the inference at hand, every plan can be made
    return found


def _plan(
    cols: ActivityColumns,
    phase_domain: str,
    per_process: bool,
    phases: PhaseMode,
    inference: InferredPhases | None,
    phase_ranges: PhaseRanges | None = None,
) -> Plan | None:
    """The plan, with ``inference`` or without (None where that cannot be told without).

    ``per_process``: each process looks for its phases in its own default domain
    (:func:`.attribution.default_phase_domain` of its ranges), else all in ``phase_domain``.
    """
    r = cols.ranges
    r_start, r_end = r["start"].to_numpy(np.int64), r["end"].to_numpy(np.int64)
    r_thread = r["thread"].to_numpy(np.int64)
    known = cols.launch_bounds()
    lanes = Lanes(r_thread, [r_start, r_end, np.array(known if known else [], dtype=np.int64)])
    marks, in_domain = phase_candidates(cols, phase_domain, per_process, phase_ranges)
    found = phase_range_rows(marks, in_domain & (phases != "inferred"), lanes, inference)
    if found is None:
        return None
    phase_rows, owners = found
    if inference is not None:
        owners = {**inference.main_threads, **owners}  # ranges' owner first, else main thread
    intervals = phase_intervals(marks, phase_rows, lanes)
    step_phases = np.zeros((0, 3), np.int64) if inference is None else inference.step_phases
    if inference is not None and phases == "auto":
        annotated_steps = inference.step_of(r_thread[intervals.rows], r_start[intervals.rows])
        uses = ~np.isin(step_phases[:, 0], annotated_steps)
    else:
        uses = np.full(len(step_phases), phases == "inferred")
    phase_names, remap = ordered_phase_names(intervals.names, step_phases[uses, 1])
    phase_code = intervals.code
    phase_code[-1] = len(phase_names) - 1
    if len(phase_names) > np.iinfo(np.int16).max:
        raise BadInput(f"{len(phase_names):,} distinct phase names: profkit reads at most 32,767")
    inferred_names = [phase_names[i] if i >= 0 else p for i, p in zip(remap, PHASES, strict=False)]
    inferred_steps = np.unique(step_phases[uses, 0])
    range_start, range_end = lanes.key(r_thread, r_start), lanes.key(r_thread, r_end)
    projected = None
    if not uses.any():
        projected = _projected_phases(cols, lanes, owners, intervals.start, intervals.end)
    keys = [range_start, range_end] + ([] if projected is None else [projected])
    plan = Plan(
        lanes=lanes,
        domain=phase_domain,
        owners=owners,
        phase_names=phase_names,
        phase_code=phase_code,
        p_start=intervals.start,
        p_end=intervals.end,
        is_phase=intervals.is_phase,
        range_start=range_start,
        range_end=range_end,
        bounds=_sorted_unique(np.concatenate(keys)),
        inference=inference,
        mode=phases,
        inferred_steps=inferred_steps,
        remap=remap,
        phase_source=phase_source(uses, bool(intervals.names), phases),
        inferred_spans=inference.spans.per_phase(inferred_steps, inferred_names)
        if inference is not None and uses.any()
        else {},
    )
    if projected is not None:
        plan.slot_phase = _slot_phases(plan)
    if marks is not r:  # renamed: a phase range's instances count under its phase's name
        plan.range_names = marks["name"].to_numpy(dtype=object)
    return plan


def phase_candidates(
    cols: ActivityColumns,
    domain: str,
    per_process: bool,
    phase_ranges: PhaseRanges | None,
) -> tuple[pd.DataFrame, np.ndarray]:
    """The ranges as phases are looked for in them (with ``phase_ranges``, each mapped
    range renamed to its phase), and per range whether it may be one: in its process's
    phase domain (:func:`.phase_marks.phase_domains`; all in ``domain`` unless
    ``per_process``) or mapped, never a library's range, never one left open at the
    capture's end (it would swallow the rest of the capture)."""
    ranges = cols.ranges
    closed = ~unclosed_ranges(ranges, cols.meta)
    found = mapped_marks(ranges, phase_ranges)
    if found is not None:
        marks, mapped = found
        return marks, mapped & closed
    if per_process:
        marks = spelled_in_domain(ranges)
        return marks, phase_domains(marks) & closed
    domains = ranges["domain"].fillna("").astype(str).to_numpy(dtype=object)
    return ranges, (domains == domain) & ~library_ranges(ranges) & closed


CHECK_AS = "inference_check"


def _inference_unneeded(cols: ActivityColumns, plan: Plan) -> bool:
    """Whether inferring phases would change nothing in ``plan`` (made without): every
    process that launches has phase ranges, no ``ProfilerStep`` starts a step of its own,
    and (``auto``) every launch of autograd's threads lies in a phase range of its owner,
    so every backward pass, and with it every step, holds phase ranges. Kept with the
    columns."""
    identity = {"version": VERSION, "rows": len(cols), "domain": plan.domain, "mode": plan.mode,
                "phases": plan.phase_names}  # fmt: skip
    kept = cols.derived.get(CHECK_AS)
    if kept is not None and kept.meta.get("identity") == identity:
        return bool(kept.meta.get("unneeded"))
    unneeded = _check_inference(cols, plan)
    cols.remember(CHECK_AS, Derived({}, {"identity": identity, "unneeded": unneeded}))
    return unneeded


def _check_inference(cols: ActivityColumns, plan: Plan) -> bool:
    threads = np.asarray(cols.threads, dtype=np.int64)
    if not set((threads >> PROCESS_SHIFT).tolist()) <= set(plan.owners):
        return False  # a process without phase ranges: its main thread owns its phases
    if plan.mode == "annotated":
        return True
    hints = TraceHints.of(cols.meta)
    if hints.profiler_steps or profiler_step_rows(cols.ranges).any():
        return False
    autograd = np.isin(np.append(threads, -1), autograd_threads(hints, cols.ranges))
    if not autograd.any():
        return bool(len(plan.phase_names) > 1)  # no pass: one step per process, annotated
    _, owner_lane, _ = _thread_tables(cols, plan)
    span, base, unattributed = plan.lanes.span, plan.lanes.base, len(plan.phase_names) - 1

    def chunk(lo: int, hi: int) -> bool:
        launch = cols.arrays["launch_start"][lo:hi]
        code = cols.arrays["launch_thread"][lo:hi]
        mine = (launch >= 0) & autograd[code]
        keys = owner_lane[code[mine]] * span + (launch[mine] - base)
        return bool((plan.phase_code[stab(plan.p_start, plan.p_end, keys)] == unattributed).any())

    return not any(list(map_chunks(chunk, len(cols), chunked.CHUNK)))


def inferred_phases(cols: ActivityColumns) -> InferredPhases:
    """The columns' inferred phases (:func:`.inference.infer_columns`, chunk by chunk: one
    byte per activity and the step structure), kept with them: a later query reads them
    back."""
    identity = {"version": INFERENCE_VERSION, "rows": len(cols)}
    kept = cols.derived.get(INFERENCE_AS)
    if kept is not None and kept.meta.get("identity") == identity:
        restored = _restored_inference(kept)
        if restored is not None:
            return restored
    # No per-activity instance: the spans say what the tables need of instances.
    found = infer_columns(
        LaunchColumns.of_columns(cols), cols.ranges, TraceHints.of(cols.meta), chunk=chunked.CHUNK
    )
    cols.remember(INFERENCE_AS, _kept_inference(found, identity))
    return found


INFERENCE_VERSION = 2  # 2: Optimizer.step ranges that enclose a backward pass (Lightning)
_SPANS = ("instance", "step", "phase", "first", "last")


def _kept_inference(found: InferredPhases, identity: dict[str, Any]) -> Derived:
    lanes = found.step_lanes
    processes = np.array(sorted(found.main_threads), dtype=np.int64)
    arrays = {
        "phase": found.phase,
        "lanes": lanes.lanes,
        "step_starts": found.step_starts,
        "autograd_threads": found.autograd_threads.astype(np.int64),
        "main_processes": processes,
        "main_threads": np.array([found.main_threads[p] for p in processes.tolist()], np.int64),
        "step_phases": found.step_phases,
        "closures": np.array([found.closures], dtype=np.int64),
        **{f"spans.{name}": getattr(found.spans, name) for name in _SPANS},
    }
    return Derived(arrays, {"identity": identity, "base": lanes.base, "span": lanes.span})


def _restored_inference(kept: Derived) -> InferredPhases | None:
    a = kept.arrays
    try:
        return InferredPhases(
            phase=a["phase"],
            main_threads=dict(
                zip(a["main_processes"].tolist(), a["main_threads"].tolist(), strict=True)
            ),
            autograd_threads=np.asarray(a["autograd_threads"]),
            _lanes=Lanes.restored(a["lanes"], kept.meta["base"], kept.meta["span"]),
            _step_starts=np.asarray(a["step_starts"]),
            spans=InstanceSpans(*(np.asarray(a[f"spans.{name}"]) for name in _SPANS)),
            step_phases=np.asarray(a["step_phases"]).reshape(-1, 3),
            closures=int(np.asarray(a["closures"])[0]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _projected_phases(
    cols: ActivityColumns,
    lanes: Lanes,
    owners: dict[int, int],
    p_start: np.ndarray,
    p_end: np.ndarray,
) -> np.ndarray | None:
    """The phases' start and end times as keys on every lane that holds attribution points
    (the launching threads' and their owner's), so that every slot with points lies on
    one lane and in one phase.

    Only for one process (one owner thread): its phase at time t is the same on all its
    threads. None where that does not hold or the keys would be too many.
    """
    if len(owners) != 1 or not len(p_start):
        return None
    thread = np.append(np.asarray(cols.threads, dtype=np.int64), -1)
    owner = _owner_of(thread, owners)
    point_lanes = np.unique(np.concatenate([lanes.codes(thread), lanes.codes(owner[owner >= 0])]))
    if 2 * len(p_start) * len(point_lanes) > MAX_PROJECTED:
        return None
    # Offsets on the owner's lane, and each lane's first and past-last key: a slot then
    # never reaches from another lane into a lane with points.
    times = np.concatenate([p_start % lanes.span, p_end % lanes.span, [0, lanes.span]])
    return (point_lanes[:, None] * lanes.span + times[None, :]).reshape(-1)


def _slot_phases(plan: Plan) -> np.ndarray:
    """The phase of every point in each slot (see :func:`_projected_phases`), then one
    entry for slot -1 (no point): a slot with points lies on one lane, so its first key
    tells."""
    bounds = plan.bounds
    first = np.concatenate([bounds[:1] - 1, bounds]) if len(bounds) else np.zeros(1, np.int64)
    owner_lane = int(plan.p_start[0] // plan.lanes.span)
    on_owner = owner_lane * plan.lanes.span + first % plan.lanes.span
    phase = plan.phase_code[stab(plan.p_start, plan.p_end, on_owner)]
    return np.append(phase, -1).astype(np.int16)


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` by a sort: numpy 2's hashing unique is ~40x slower on these keys."""
    values = np.sort(values)
    return values[np.append(True, values[1:] != values[:-1])] if len(values) else values


def attributed(cols: ActivityColumns, plan: Plan) -> Mapping[str, np.ndarray]:
    """Per activity: ``phase``, ``same`` (the launching thread's phase alone), ``self_slot``
    and ``owner_slot``; kept with the columns, and taken from them when already there."""
    expected = attribution_identity(cols, plan)
    kept = cols.derived.get(KEPT_AS)
    if kept is not None and kept.meta == expected and _fits(kept.arrays, len(cols)):
        return kept.arrays
    arrays = _attribute(cols, plan)
    cols.remember(KEPT_AS, Derived(arrays, expected))
    return arrays


def attribution_identity(cols: ActivityColumns, plan: Plan) -> dict[str, Any]:
    """What the arrays were computed from: a kept set that differs is recomputed (JSON
    types only: it is compared with what the cache read back)."""
    digest = hashlib.sha256(plan.bounds.tobytes())
    digest.update(plan.p_start.tobytes() + plan.p_end.tobytes())
    digest.update(plan.inferred_steps.astype(np.int64).tobytes() + plan.remap.tobytes())
    return {
        "version": VERSION,
        "rows": len(cols),
        "domain": plan.domain,
        "mode": plan.mode,
        "phases": plan.phase_names,
        "owners": [[process, thread] for process, thread in sorted(plan.owners.items())],
        "keys": digest.hexdigest()[:32],
    }


def _fits(arrays: Mapping[str, np.ndarray], rows: int) -> bool:
    return set(arrays) == set(ARRAYS) and all(
        len(arrays[n]) == rows and arrays[n].dtype == t for n, t in ARRAYS.items()
    )


def _attribute(cols: ActivityColumns, plan: Plan) -> dict[str, np.ndarray]:
    out = {name: np.empty(len(cols), dtype=t) for name, t in ARRAYS.items()}
    out["self_slot"][:] = -1
    out["owner_slot"][:] = -1
    out["inferred"][:] = 0
    last = len(plan.phase_names) - 1
    lane, owner_lane, cross_of = _thread_tables(cols, plan)
    thread_ids = np.append(np.asarray(cols.threads, dtype=np.int64), -1)
    span, base = plan.lanes.span, plan.lanes.base
    inference = plan.inference if len(plan.inferred_steps) else None
    every_step = plan.mode == "inferred"

    def chunk(lo: int, hi: int) -> None:  # writes rows lo..hi of ``out`` only
        launch = cols.arrays["launch_start"][lo:hi]
        rows = np.flatnonzero(launch >= 0)
        code = cols.arrays["launch_thread"][lo:hi][rows]  # -1 (unknown) indexes the last entry
        time = launch[rows] - base
        self_keys = lane[code] * span + time
        same = np.full(hi - lo, last, dtype=np.int64)
        same[rows] = plan.phase_code[stab(plan.p_start, plan.p_end, self_keys)]
        cross = cross_of[code]
        cross_rows = rows[cross]
        owner_keys = owner_lane[code[cross]] * span + time[cross]
        phase = same.copy()
        phase[cross_rows] = plan.phase_code[stab(plan.p_start, plan.p_end, owner_keys)]
        if inference is not None:  # launches of steps without phase ranges: inferred
            use = rows
            if not every_step:
                step = inference.step_of(thread_ids[code], launch[rows])
                use = rows[np.isin(step, plan.inferred_steps)]
            phase[use] = plan.remap[inference.phase[lo:hi][use]]
            out["inferred"][lo + use] = 1
        out["phase"][lo:hi] = phase
        out["same"][lo:hi] = same
        out["self_slot"][lo + rows] = plan.slot(self_keys)
        out["owner_slot"][lo + cross_rows] = plan.slot(owner_keys)

    for _ in map_chunks(chunk, len(cols), chunked.CHUNK):
        pass
    return out


def _thread_tables(cols: ActivityColumns, plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per launching-thread code (then one entry for -1, unknown): its lane code, its
    process's owner thread's lane code, and whether it is a worker (owner elsewhere)."""
    thread = np.append(np.asarray(cols.threads, dtype=np.int64), -1)
    owner = _owner_of(thread, plan.owners)
    worker = (owner >= 0) & (owner != thread)
    return plan.lanes.codes(thread), plan.lanes.codes(owner), worker


def _owner_of(thread: np.ndarray, owners: dict[int, int]) -> np.ndarray:
    """The owner thread of each thread's process (-1 where its process has no phases)."""
    if not owners:
        return np.full(len(thread), -1, dtype=np.int64)
    processes = np.array(sorted(owners), dtype=np.int64)
    threads = np.array([owners[p] for p in processes], dtype=np.int64)
    process = thread >> PROCESS_SHIFT
    index = np.minimum(np.searchsorted(processes, process), len(processes) - 1)
    return np.where(processes[index] == process, threads[index], -1)
