"""The kernel report of :class:`~profkit.traces.columns.ActivityColumns`, in bounded memory.

:func:`analyze_columns` gives the same :class:`~profkit.analysis.report.KernelReport` as
:func:`~profkit.analysis.report.analyze` (tests compare them table by table), without a
per-activity frame: attribution runs over chunks of ~1 M activities against the ranges,
which are few (same rule, same sorts and binary searches as :mod:`.attribution`, per chunk);
range totals are sums, so each chunk adds its own; phase and category tables are
bincounts. Only the per-kernel statistics need every duration: they come from one sorted
int64 array of ``group << 40 | duration`` per table, read by binary searches and chunked
passes (medians are two lookups per group; :mod:`.stream_tables`). Memory: the columns,
2 bytes of phase per activity, the sorted keys (8 bytes), and chunk-sized temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from profkit.analysis import stream_tables as tables
from profkit.analysis.attribution import UNATTRIBUTED, Attribution, _outermost, _owners
from profkit.analysis.categories import CATEGORIES
from profkit.analysis.intervals import PROCESS_SHIFT, Lanes, stab, union
from profkit.analysis.report import (
    KernelReport,
    _category,
    _phase_index,
    _range_labels,
    _source,
    run_config,
)
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns
from profkit.traces.schema import KINDS, Trace

CHUNK = tables.CHUNK


@dataclass
class _Plan:
    """What attribution needs from the ranges alone (see :func:`.attribution.attribute`)."""

    lanes: Lanes
    owners: dict[int, int]
    phase_names: list[str]
    phase_code: np.ndarray  # per phase interval, then the catch-all slot
    p_start: np.ndarray
    p_end: np.ndarray
    is_phase: np.ndarray
    range_start: np.ndarray
    range_end: np.ndarray

    @property
    def bounds(self) -> np.ndarray:
        """Every range start and end key, sorted: they cut the keys into slots."""
        return np.unique(np.concatenate([self.range_start, self.range_end]))


def _plan(cols: ActivityColumns, phase_domain: str | None) -> _Plan:
    r = cols.ranges
    r_start, r_end = r["start"].to_numpy(np.int64), r["end"].to_numpy(np.int64)
    r_thread = r["thread"].to_numpy(np.int64)
    domains = r["domain"].fillna("").astype(str)
    if phase_domain is None:
        phase_domain = "" if (domains == "").any() or domains.empty else domains.mode().iloc[0]
    known = cols.launch_bounds()
    bounds = np.array(known if known else [], dtype=np.int64)
    lanes = Lanes(r_thread, [r_start, r_end, bounds])
    # Only traces whose steps carry phase ranges come here (analysis.kernels checks), so the
    # outermost ranges of the owner thread are the phases, as attribute() finds them there.
    candidates = _outermost(r, (domains == phase_domain).to_numpy(), lanes)
    owners = _owners(r_thread[candidates], r_end[candidates] - r_start[candidates])
    phase_rows = candidates[np.isin(r_thread[candidates], list(owners.values()))]
    is_phase = np.zeros(len(r), dtype=bool)
    is_phase[phase_rows] = True
    p_start = lanes.key(r_thread[phase_rows], r_start[phase_rows])
    p_end = lanes.key(r_thread[phase_rows], r_end[phase_rows])
    order = np.argsort(p_start, kind="stable")
    phase_rows, p_start, p_end = phase_rows[order], p_start[order], p_end[order]
    names = r["name"].to_numpy(dtype=object)[phase_rows]
    phase_names = list(dict.fromkeys(names.tolist()))
    name_code = {name: i for i, name in enumerate(phase_names)}
    phase_code = np.append(np.array([name_code[x] for x in names], dtype=np.int64), -1)
    phase_names.append(UNATTRIBUTED)
    phase_code[-1] = len(phase_names) - 1
    return _Plan(
        lanes,
        owners,
        phase_names,
        phase_code,
        p_start,
        p_end,
        is_phase,
        lanes.key(r_thread, r_start),
        lanes.key(r_thread, r_end),
    )


QUANTITIES = (*KINDS, "kernel_ns", "gpu_ns")
"""What every sum carries: a count per activity kind, then kernel and all-activity ns."""
KERNEL_NS, GPU_NS = len(KINDS), len(KINDS) + 1


@dataclass
class Totals:
    """What one pass over the chunks adds up (the tables need nothing else but durations)."""

    phase: np.ndarray
    """Per activity: its phase if selected, else -1."""
    by_phase_category: np.ndarray
    """(phases × categories, QUANTITIES) sums of the selected activities."""
    by_slot: np.ndarray
    """(slots, QUANTITIES) sums of the selected activities' points in each slot between
    consecutive range bounds; :meth:`by_range` adds them up per range."""
    moved: np.ndarray  # per phase: selected activities attributed through the owner thread
    same: np.ndarray  # per phase: selected activities the launching thread alone puts there
    workers: list[set[int]]  # per phase: threads that launched its moved activities
    unlaunched: int = 0
    unattributed_seen: bool = False

    def by_range(self, plan: _Plan, bounds: np.ndarray) -> np.ndarray:
        """(ranges, QUANTITIES): the slots from each range's start to its end, summed.

        A point p lies in [start, end) exactly when its slot (bounds <= p, counted) is in
        [bounds <= start, bounds <= end), so a range's sum is a difference of prefix sums.
        """
        prefix = np.zeros((len(self.by_slot) + 1, len(QUANTITIES)), dtype=np.int64)
        np.cumsum(self.by_slot, axis=0, out=prefix[1:])
        lo = np.searchsorted(bounds, plan.range_start, side="right")
        hi = np.searchsorted(bounds, plan.range_end, side="right")
        return prefix[hi] - prefix[lo]


def _attribute_pass(
    cols: ActivityColumns,
    plan: _Plan,
    bounds: np.ndarray,
    phase_index: int | None,
    inside: tuple[Any, Any] | None,
) -> Totals:
    """Attribute every chunk and add up its sums (the rule of :func:`.attribution.attribute`)."""
    n_phases, last = len(plan.phase_names), len(plan.phase_names) - 1
    totals = Totals(
        phase=np.full(len(cols), -1, dtype=np.int16),
        by_phase_category=np.zeros((n_phases * len(CATEGORIES), len(QUANTITIES)), np.int64),
        by_slot=np.zeros((len(bounds) + 1, len(QUANTITIES)), np.int64),
        moved=np.zeros(n_phases, np.int64),
        same=np.zeros(n_phases, np.int64),
        workers=[set() for _ in range(n_phases)],
    )
    a = cols.arrays
    name_kind, name_category = _name_codes(cols)
    for lo in range(0, len(cols), CHUNK):
        hi = min(lo + CHUNK, len(cols))
        launch = a["launch_start"][lo:hi]
        thread = cols.launch_threads(a["launch_thread"][lo:hi])
        rows = np.flatnonzero(launch >= 0)
        owner = _owner_of(thread[rows], plan.owners)
        self_keys = plan.lanes.key(thread[rows], launch[rows])
        same = np.full(hi - lo, last, dtype=np.int64)
        same[rows] = plan.phase_code[stab(plan.p_start, plan.p_end, self_keys)]
        cross = (owner >= 0) & (owner != thread[rows])
        cross_rows = rows[cross]
        owner_keys = plan.lanes.key(owner[cross], launch[cross_rows])
        owner_phase = plan.phase_code[stab(plan.p_start, plan.p_end, owner_keys)]
        phase = same.copy()
        phase[cross_rows] = owner_phase
        moved = np.zeros(hi - lo, dtype=bool)
        moved[cross_rows[owner_phase != last]] = True
        totals.unattributed_seen |= bool((phase == last).any())
        points = np.concatenate([self_keys, owner_keys])
        point_rows = np.concatenate([rows, cross_rows])
        selected = np.ones(hi - lo, dtype=bool)
        if phase_index is not None:
            selected &= phase == phase_index
        if inside is not None:
            enclosed = np.zeros(hi - lo, dtype=bool)
            enclosed[point_rows[stab(inside[0], inside[1], points) >= 0]] = True
            selected &= enclosed
        kind = name_kind[a["name"][lo:hi]]
        duration = a["duration"][lo:hi].clip(min=0)
        slot = np.searchsorted(bounds, points, side="right")
        _add_sums(
            totals.by_slot, slot, kind[point_rows], duration[point_rows], selected[point_rows]
        )
        key = phase * len(CATEGORIES) + name_category[a["name"][lo:hi]]
        _add_sums(totals.by_phase_category, key, kind, duration, selected)
        totals.phase[lo:hi] = np.where(selected, phase, -1)
        codes = a["launch_thread"][lo:hi]
        _add_notes(totals, phase, same, moved & selected, codes, selected, n_phases, cols.threads)
    return totals


def _name_codes(cols: ActivityColumns) -> tuple[np.ndarray, np.ndarray]:
    """Per name: the index of its kind in ``KINDS`` and of its category in ``CATEGORIES``."""
    kind = np.array([KINDS.index(k) for k in cols.kinds], dtype=np.int64)
    index = {c: i for i, c in enumerate(CATEGORIES)}
    category = [index[_category(n, k)] for n, k in zip(cols.names, cols.kinds, strict=True)]
    return kind, np.array(category, dtype=np.int64)


def _add_sums(
    into: np.ndarray, key: np.ndarray, kind: np.ndarray, duration: np.ndarray, selected: np.ndarray
) -> None:
    """Add each selected activity to row ``key`` of ``into``: its kind's count, its ns."""
    if not selected.all():  # with no --phase/--range filter, skip three copies
        key, kind, duration = key[selected], kind[selected], duration[selected]
    size = len(into)
    n_kinds = len(KINDS)  # one bincount for every kind's count
    counts = np.bincount(key * n_kinds + kind, minlength=size * n_kinds).reshape(size, n_kinds)
    into[:, :n_kinds] += counts
    kernel_ns = np.where(kind == KINDS.index("kernel"), duration, 0)
    # Float sums of integer ns are exact below 2^53 ns (104 days) per row.
    into[:, KERNEL_NS] += np.bincount(key, weights=kernel_ns, minlength=size).astype(np.int64)
    into[:, GPU_NS] += np.bincount(key, weights=duration, minlength=size).astype(np.int64)


def _add_notes(
    totals: Totals,
    phase: np.ndarray,
    same: np.ndarray,
    moved: np.ndarray,
    thread_codes: np.ndarray,
    selected: np.ndarray,
    n_phases: int,
    threads: np.ndarray,
) -> None:
    """Counts for the notes; ``thread_codes`` index ``threads`` (-1: no launch call)."""
    totals.moved += np.bincount(phase[moved], minlength=n_phases)
    totals.same += np.bincount(same[selected], minlength=n_phases)
    totals.unlaunched += int((selected & (thread_codes < 0)).sum())
    if moved.any():
        pairs = phase[moved] * len(threads) + thread_codes[moved]  # moved ones have a launch
        for pair in np.flatnonzero(np.bincount(pairs)).tolist():
            totals.workers[pair // len(threads)].add(int(threads[pair % len(threads)]))


def analyze_columns(
    cols: ActivityColumns,
    top: int = 20,
    phase: str | None = None,
    range: str | None = None,
    phase_domain: str | None = None,
) -> KernelReport:
    """:func:`~profkit.analysis.report.analyze` for compact columns (the same report)."""
    if top < 0:
        raise BadInput(f"--top must be 0 (all) or more, got {top}")
    r = cols.ranges
    plan = _plan(cols, phase_domain)
    labels = _range_labels(r)
    phase_index = None
    if phase is not None:
        lowered = [p.lower() for p in plan.phase_names]
        phase_index = lowered.index(phase.lower()) if phase.lower() in lowered else -2
    inside = None
    if range is not None:
        rows = np.flatnonzero((labels == range) | (r["name"].to_numpy(dtype=object) == range))
        if not len(rows):
            known = ", ".join(list(dict.fromkeys(labels.tolist()))[:12]) or "none"
            raise BadInput(f"no range named {range!r} in this trace; ranges: {known}")
        inside = union(plan.range_start[rows], plan.range_end[rows])
    bounds = plan.bounds
    totals = _attribute_pass(cols, plan, bounds, phase_index, inside)
    if phase is not None:  # the same check and message as analyze()
        seen = np.array([len(plan.phase_names) - 1] if totals.unattributed_seen else [])
        _phase_index(cast(Attribution, _PhaseView(plan.phase_names, seen)), phase)
    report = _report(cols, plan, totals, totals.by_range(plan, bounds), labels, top, phase, range)
    report.source["phase_source"] = "annotated"  # the phases are the trace's own ranges
    return report


@dataclass
class _PhaseView:
    """What ``report._phase_index`` reads of an Attribution: names, and whether
    ``unattributed`` occurs (one entry of its index when it does)."""

    phase_names: list[str]
    kernel_phase: np.ndarray


def _report(
    cols: ActivityColumns,
    plan: _Plan,
    totals: Totals,
    by_range: np.ndarray,
    labels: np.ndarray,
    top: int,
    phase: str | None,
    range_: str | None,
) -> KernelReport:
    n_phases = len(plan.phase_names)
    by_phase = totals.by_phase_category.reshape(n_phases, len(CATEGORIES), -1).sum(axis=1)
    sidecar = cols.meta.get("sidecar") or {}
    config = run_config(sidecar, cols.meta)
    _, categories = _name_codes(cols)
    per_phase, overall = tables.kernel_tables(cols, totals.phase, categories, plan.phase_names)
    trace = Trace(kernels=pd.DataFrame(), ranges=cols.ranges, meta=cols.meta)
    report = KernelReport(
        source=_source(trace, phase, range_, top, config),
        totals=tables.totals_of(totals.by_phase_category),
        phases=tables.phase_table(
            by_phase, plan.phase_names, cols.ranges[plan.is_phase], sidecar, phase is not None
        ),
        ranges=tables.range_table(by_range, cols.ranges, labels, config, range_ or phase),
        kernels=per_phase,
        overall=overall,
        categories=tables.category_table(totals.by_phase_category, plan.phase_names),
        top=top,
    )
    in_phase = by_phase[:, : len(KINDS)].sum(axis=1)
    report.notes = _notes(totals, plan, in_phase, cols.meta)
    return report


def _notes(totals: Totals, plan: _Plan, in_phase: np.ndarray, meta: dict[str, Any]) -> list[str]:
    """The sentences :func:`.report._notes` writes, from the pass's counts."""
    notes = list(meta.get("warnings") or [])
    threads = meta.get("thread_names") or {}
    owners = ", ".join(sorted({threads.get(t, f"thread {t}") for t in plan.owners.values()}))
    nsys = meta.get("format") == "nsys-sqlite"
    rule = "the rule of Nsight Systems' nvtx_gpu_proj_sum" if nsys else "a same-thread rule"
    for index, name in enumerate(plan.phase_names):
        moved = int(totals.moved[index])
        if name == UNATTRIBUTED or not moved:
            continue
        workers = sorted({threads.get(t, f"thread {t}") for t in totals.workers[index]})
        notes.append(
            f"{name}: {moved:,} of its {int(in_phase[index]):,} GPU activities were "
            f"launched from {', '.join(workers)} and attributed through the ranges open on "
            f"{owners} at launch; the launching thread alone ({rule}) would give it "
            f"{int(totals.same[index]):,}."
        )
    outside = int(in_phase[-1])
    if outside > totals.unlaunched:
        notes.append(
            f"{outside - totals.unlaunched:,} GPU activities were launched outside every phase "
            "range (unattributed)."
        )
    if totals.unlaunched:
        notes.append(
            f"{totals.unlaunched:,} GPU activities have no launch call in the trace (their API "
            "call was not traced): they are unattributed and in no range."
        )
    return notes


def _owner_of(thread: np.ndarray, owners: dict[int, int]) -> np.ndarray:
    """The owner thread of each thread's process (-1 where its process has no phases)."""
    if not owners:
        return np.full(len(thread), -1, dtype=np.int64)
    processes = np.array(sorted(owners), dtype=np.int64)
    threads = np.array([owners[p] for p in processes], dtype=np.int64)
    process = thread >> PROCESS_SHIFT
    index = np.minimum(np.searchsorted(processes, process), len(processes) - 1)
    return np.where(processes[index] == process, threads[index], -1)
