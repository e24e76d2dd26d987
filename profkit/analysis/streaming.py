"""The kernel report of :class:`~profkit.traces.columns.ActivityColumns`, in bounded memory.

:func:`analyze_columns` gives the same :class:`~profkit.analysis.report.KernelReport` as
:func:`~profkit.analysis.report.analyze` (tests compare them table by table), without a
per-activity frame: attribution runs over chunks of ~1 M activities against the ranges,
which are few (same rule, same sorts and binary searches as :mod:`.attribution`, per chunk);
range totals are sums, so each chunk adds its own; phase and category tables are
bincounts. Only the per-kernel statistics need every duration: they come from one sorted
int64 array of ``group << 40 | duration`` per table, read by binary searches and chunked
passes (medians are two lookups per group). Memory: the columns, 2 bytes of phase per
activity, the sorted keys (8 bytes), and chunk-sized temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.attribution import (
    UNATTRIBUTED,
    _Lanes,
    _owner_of,
    _owners,
    _phase_rows,
    _stab,
    _union,
)
from profkit.analysis.categories import CATEGORIES
from profkit.analysis.names import short_kernel_name
from profkit.analysis.report import KernelReport, _category, _phase_index, _range_labels, _source
from profkit.analysis.tables import ALL_PHASES, FLOP_RANGES, KERNEL_COLUMNS, NS_PER_MS, NS_PER_US
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns
from profkit.traces.schema import Trace
from profkit.workload.flops import attention_flops

CHUNK = 1 << 20
DURATION_BITS = 40  # durations below 2^40 ns (18 minutes) pack beside a group code
DURATION_MASK = (1 << DURATION_BITS) - 1


@dataclass
class _Plan:
    """What attribution needs from the ranges alone (see :func:`.attribution.attribute`)."""

    lanes: _Lanes
    owners: dict[int, int]
    phase_names: list[str]
    phase_code: np.ndarray  # per phase interval, then the catch-all slot
    p_start: np.ndarray
    p_end: np.ndarray
    is_phase: np.ndarray
    range_start: np.ndarray
    range_end: np.ndarray


def _plan(cols: ActivityColumns, phase_domain: str | None) -> _Plan:
    r = cols.ranges
    r_start, r_end = r["start"].to_numpy(np.int64), r["end"].to_numpy(np.int64)
    r_thread = r["thread"].to_numpy(np.int64)
    domains = r["domain"].fillna("").astype(str)
    if phase_domain is None:
        phase_domain = "" if (domains == "").any() or domains.empty else domains.mode().iloc[0]
    launch = cols.arrays["launch_start"]
    known = launch[launch >= 0]
    bounds = np.array([known.min(), known.max()]) if len(known) else np.empty(0, np.int64)
    lanes = _Lanes(r_thread, [r_start, r_end, bounds])
    candidates = _phase_rows(r, domains == phase_domain, lanes)
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


@dataclass
class _Totals:
    """What one pass over the chunks adds up."""

    phase: np.ndarray  # per activity: its phase if selected, else -1
    range_ns: np.ndarray
    range_kernels: np.ndarray
    moved: np.ndarray  # per phase: selected activities attributed through the owner
    same: np.ndarray  # per phase: selected activities the launching thread alone places there
    workers: list[set[int]]
    unlaunched: int = 0
    unattributed_seen: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _attribute_pass(
    cols: ActivityColumns, plan: _Plan, phase_index: int | None, inside: tuple[Any, Any] | None
) -> _Totals:
    n_phases, n_ranges = len(plan.phase_names), len(plan.range_start)
    last = n_phases - 1
    totals = _Totals(
        phase=np.full(len(cols), -1, dtype=np.int16),
        range_ns=np.zeros(n_ranges, np.int64),
        range_kernels=np.zeros(n_ranges, np.int64),
        moved=np.zeros(n_phases, np.int64),
        same=np.zeros(n_phases, np.int64),
        workers=[set() for _ in range(n_phases)],
    )
    a = cols.arrays
    for lo in range(0, len(cols), CHUNK):
        hi = min(lo + CHUNK, len(cols))
        launch = a["launch_start"][lo:hi]
        thread = cols.launch_threads(a["launch_thread"][lo:hi])
        rows = np.flatnonzero(launch >= 0)
        owner = _owner_of(thread[rows], plan.owners)
        self_keys = plan.lanes.key(thread[rows], launch[rows])
        same = np.full(hi - lo, last, dtype=np.int64)
        same[rows] = plan.phase_code[_stab(plan.p_start, plan.p_end, self_keys)]
        cross = (owner >= 0) & (owner != thread[rows])
        cross_rows = rows[cross]
        owner_keys = plan.lanes.key(owner[cross], launch[cross_rows])
        owner_phase = plan.phase_code[_stab(plan.p_start, plan.p_end, owner_keys)]
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
            enclosed[point_rows[_stab(inside[0], inside[1], points) >= 0]] = True
            selected &= enclosed
        duration = np.where(selected, a["duration"][lo:hi].clip(min=0), 0)
        _add_range_totals(totals, plan, points, duration[point_rows], selected[point_rows])
        totals.phase[lo:hi] = np.where(selected, phase, -1)
        _add_notes(totals, phase, same, moved & selected, thread, selected, n_phases)
    return totals


def _add_range_totals(
    totals: _Totals, plan: _Plan, points: np.ndarray, weights: np.ndarray, counted: np.ndarray
) -> None:
    order = np.argsort(points, kind="stable")
    points = points[order]
    summed = np.concatenate([[0], np.cumsum(weights[order])])
    number = np.concatenate([[0], np.cumsum(counted[order], dtype=np.int64)])
    lo = np.searchsorted(points, plan.range_start, side="left")
    hi = np.searchsorted(points, plan.range_end, side="left")
    totals.range_ns += summed[hi] - summed[lo]
    totals.range_kernels += number[hi] - number[lo]


def _add_notes(
    totals: _Totals,
    phase: np.ndarray,
    same: np.ndarray,
    moved: np.ndarray,
    thread: np.ndarray,
    selected: np.ndarray,
    n_phases: int,
) -> None:
    totals.moved += np.bincount(phase[moved], minlength=n_phases)
    totals.same += np.bincount(same[selected], minlength=n_phases)
    totals.unlaunched += int((selected & (thread < 0)).sum())
    if moved.any():
        pairs = np.unique(np.stack([phase[moved], thread[moved]]), axis=1)
        for p, t in pairs.T.tolist():
            totals.workers[p].add(t)


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
        inside = _union(plan.range_start[rows], plan.range_end[rows])
    totals = _attribute_pass(cols, plan, phase_index, inside)
    if phase is not None:  # the same check and message as analyze()
        seen = np.array([len(plan.phase_names) - 1] if totals.unattributed_seen else [])
        _phase_index(_PhaseView(plan.phase_names, seen), phase)
    return _report(cols, plan, totals, labels, top, phase, range)


@dataclass
class _PhaseView:
    phase_names: list[str]
    kernel_phase: np.ndarray


def _report(
    cols: ActivityColumns,
    plan: _Plan,
    totals: _Totals,
    labels: np.ndarray,
    top: int,
    phase: str | None,
    range_: str | None,
) -> KernelReport:
    n_phases = len(plan.phase_names)
    phase_names = np.array(plan.phase_names, dtype=object)
    category_index = {c: i for i, c in enumerate(CATEGORIES)}
    categories = np.array(
        [category_index[_category(n, k)] for n, k in zip(cols.names, cols.kinds, strict=True)],
        dtype=np.int64,
    )
    counts, gpu_ns = _phase_category_sums(cols, totals.phase, categories, n_phases)
    sidecar = cols.meta.get("sidecar") or {}
    config = sidecar.get("config") if isinstance(sidecar.get("config"), dict) else None
    per_phase, overall = _kernel_tables(cols, totals.phase, categories, phase_names)
    trace = Trace(kernels=pd.DataFrame(), ranges=cols.ranges, meta=cols.meta)
    report = KernelReport(
        source=_source(trace, phase, range_, top, config),
        totals={"kernels": int(counts.sum()), "gpu_time_ms": int(gpu_ns.sum()) / NS_PER_MS},
        phases=_phase_table(
            counts.sum(axis=1), gpu_ns.sum(axis=1), plan, cols.ranges, sidecar, phase is not None
        ),
        ranges=_range_table(totals, cols.ranges, labels, config, range_ or phase),
        kernels=per_phase,
        overall=overall,
        categories=_category_table(counts, gpu_ns, phase_names),
        top=top,
    )
    report.notes = _notes(totals, plan, counts.sum(axis=1), cols.meta)
    return report


def _phase_category_sums(
    cols: ActivityColumns, phase: np.ndarray, categories: np.ndarray, n_phases: int
) -> tuple[np.ndarray, np.ndarray]:
    """Activities and GPU ns per (phase, category) of the selected activities."""
    size = n_phases * len(CATEGORIES)
    counts, gpu_ns = np.zeros(size, np.int64), np.zeros(size, np.int64)
    for lo in range(0, len(cols), CHUNK):
        p = phase[lo : lo + CHUNK].astype(np.int64)
        keep = p >= 0
        key = p[keep] * len(CATEGORIES) + categories[cols.arrays["name"][lo : lo + CHUNK][keep]]
        duration = cols.arrays["duration"][lo : lo + CHUNK][keep].clip(min=0)
        counts += np.bincount(key, minlength=size)
        gpu_ns += np.bincount(key, weights=duration, minlength=size).astype(np.int64)
    shape = (n_phases, len(CATEGORIES))
    return counts.reshape(shape), gpu_ns.reshape(shape)


def _phase_table(
    kernels: np.ndarray,
    gpu_ns: np.ndarray,
    plan: _Plan,
    ranges: pd.DataFrame,
    sidecar: dict[str, Any],
    filtered: bool,
) -> pd.DataFrame:
    from profkit.analysis.tables import _python_ms

    phase_names = plan.phase_names
    phase_ranges = ranges[plan.is_phase]
    cpu_ns = (phase_ranges["end"] - phase_ranges["start"]).groupby(phase_ranges["name"]).sum()
    instances = phase_ranges.groupby("name").size()
    total = gpu_ns.sum()
    table = pd.DataFrame(
        {
            "phase": phase_names,
            "instances": [int(instances.get(p, 0)) for p in phase_names],
            "kernels": kernels.astype(np.int64),
            "gpu_time_ms": gpu_ns.astype(np.float64) / NS_PER_MS,
            "share": gpu_ns / total if total else np.zeros(len(phase_names)),
            "cpu_time_ms": [cpu_ns.get(p, np.nan) / NS_PER_MS for p in phase_names],
        }
    )
    python = _python_ms(sidecar)
    if python:
        table["python_ms"] = [python.get(p, np.nan) for p in phase_names]
    keep = (table["kernels"] > 0) | ((table["instances"] > 0) & (not filtered))
    keep &= (table["phase"] != UNATTRIBUTED) | (table["kernels"] > 0)
    return table[keep].reset_index(drop=True)


def _range_table(
    totals: _Totals,
    ranges: pd.DataFrame,
    labels: np.ndarray,
    config: dict[str, Any] | None,
    filtered: str | None,
) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "range": labels,
            "domain": ranges["domain"].fillna("").to_numpy(dtype=object),
            "kernels": totals.range_kernels,
            "gpu_ns": totals.range_ns,
            "cpu_ns": (ranges["end"] - ranges["start"]).to_numpy(),
        }
    )
    table = (
        frame.groupby(["range", "domain"], sort=False)
        .agg(
            instances=("kernels", "size"),
            kernels=("kernels", "sum"),
            gpu_ns=("gpu_ns", "sum"),
            cpu_ns=("cpu_ns", "sum"),
        )
        .reset_index()
    )
    table["gpu_time_ms"] = table["gpu_ns"] / NS_PER_MS
    table["cpu_time_ms"] = table["cpu_ns"] / NS_PER_MS
    table = table.drop(columns=["gpu_ns", "cpu_ns"])
    if filtered:
        table = table[table["kernels"] > 0]
    flops = attention_flops(config) if config and table["range"].isin(FLOP_RANGES).any() else None
    if flops:
        mflop = table["range"].map(flops) / 1e6
        table["mflop"] = mflop
        gpu_ms = table["gpu_time_ms"].where(table["gpu_time_ms"] > 0)
        table["tflop_s"] = mflop * table["instances"] / gpu_ms / 1e3
    table = table.sort_values(["gpu_time_ms", "instances"], ascending=[False, False], kind="stable")
    return table.reset_index(drop=True)


def _category_table(
    counts: np.ndarray, gpu_ns: np.ndarray, phase_names: np.ndarray
) -> pd.DataFrame:
    category_names = np.array(CATEGORIES, dtype=object)
    flat_counts, flat_ns = counts.ravel(), gpu_ns.ravel().astype(np.float64)
    present = np.flatnonzero(flat_counts)
    phase, category = present // len(CATEGORIES), present % len(CATEGORIES)
    phase_total = np.bincount(phase, weights=flat_ns[present], minlength=len(phase_names))
    table = pd.DataFrame(
        {
            "phase": phase_names[phase],
            "category": category_names[category],
            "kernels": flat_counts[present].astype(np.int64),
            "gpu_time_ms": flat_ns[present] / NS_PER_MS,
            "share": flat_ns[present]
            / np.where(phase_total[phase] > 0, phase_total[phase], np.nan),
            "order": phase,
        }
    )
    table = table.sort_values(["order", "gpu_time_ms"], ascending=[True, False], kind="stable")
    return table.drop(columns=["order"]).reset_index(drop=True)


def _kernel_tables(
    cols: ActivityColumns, phase: np.ndarray, categories: np.ndarray, phase_names: np.ndarray
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per (name, phase) and per name statistics, as :func:`.tables.kernel_tables` has them."""
    n_phases = len(phase_names)
    names = np.array(cols.names, dtype=object)
    per_phase = _duration_stats(cols, phase, n_phases, by_phase=True)
    overall = _duration_stats(cols, phase, n_phases, by_phase=False)
    per_phase["phase_total"] = per_phase.groupby("phase")["total_ms"].transform("sum")
    overall["phase_total"] = overall["total_ms"].sum()
    phase_order = {p: i for i, p in enumerate(phase_names)}
    out = []
    for table in (per_phase, overall):
        table["share"] = table["total_ms"] / table["phase_total"].where(table["phase_total"] > 0)
        table["short_name"] = [short_kernel_name(n) for n in names[table["name"]]]
        table["category"] = np.array(CATEGORIES, dtype=object)[categories[table["name"]]]
        shapes = [cols.shapes[s] for s in table["shape"]]
        table["grid"] = [g for g, _ in shapes]
        table["block"] = [b for _, b in shapes]
        table["phase"] = np.where(
            table["phase"] >= 0, phase_names[table["phase"].clip(lower=0)], ALL_PHASES
        )
        table["name"] = names[table["name"]]
        table["phase_order"] = table["phase"].map(phase_order).fillna(-1)
        table = table.sort_values(["phase_order", "total_ms"], ascending=[True, False])
        out.append(table[KERNEL_COLUMNS].reset_index(drop=True))
    return out[0], out[1]


def _group_keys(
    cols: ActivityColumns, phase: np.ndarray, n_phases: int, by_phase: bool
) -> np.ndarray:
    """Sorted ``group << 40 | duration`` of the selected activities."""
    selected = int((phase >= 0).sum())
    keys = np.empty(selected, dtype=np.int64)
    at = 0
    for lo in range(0, len(cols), CHUNK):
        p = phase[lo : lo + CHUNK]
        keep = p >= 0
        group = cols.arrays["name"][lo : lo + CHUNK][keep].astype(np.int64)
        if by_phase:
            group = group * n_phases + p[keep]
        duration = cols.arrays["duration"][lo : lo + CHUNK][keep].clip(min=0)
        if len(duration) and duration.max() > DURATION_MASK:
            raise BadInput("an activity lasts over 18 minutes: not a trace profkit can read")
        keys[at : at + len(group)] = (group << DURATION_BITS) | duration
        at += len(group)
    keys.sort()
    return keys


def _duration_stats(
    cols: ActivityColumns, phase: np.ndarray, n_phases: int, by_phase: bool
) -> pd.DataFrame:
    """count, sum, mean, median, min, max, std and the longest instance's shape per group."""
    keys = _group_keys(cols, phase, n_phases, by_phase)
    groups = np.unique(keys >> DURATION_BITS) if len(keys) else np.empty(0, np.int64)
    first = np.searchsorted(keys, groups << DURATION_BITS)
    count = np.diff(np.append(first, len(keys)))
    low = keys[first] & DURATION_MASK
    high = keys[first + count - 1] & DURATION_MASK
    median = (
        (keys[first + (count - 1) // 2] & DURATION_MASK)
        + (keys[first + count // 2] & DURATION_MASK)
    ) / 2
    total, squares = _sums(keys, first, count)
    mean = total / count
    std = np.where(count > 1, np.sqrt(np.maximum(squares, 0) / np.maximum(count - 1, 1)), 0.0)
    del keys
    return pd.DataFrame(
        {
            "name": groups // n_phases if by_phase else groups,
            "phase": groups % n_phases if by_phase else -1,
            "instances": count.astype(np.int64),
            "total_ms": total / NS_PER_MS,
            "avg_us": mean / NS_PER_US,
            "med_us": median / NS_PER_US,
            "min_us": low / NS_PER_US,
            "max_us": high / NS_PER_US,
            "std_us": std / NS_PER_US,
            "shape": _longest_shapes(cols, phase, groups, high, n_phases, by_phase),
        }
    )


def _sums(keys: np.ndarray, first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group: the sum of durations and the sum of squared deviations from the mean."""
    groups = len(first)
    total = np.zeros(groups)
    shift = (keys[first] & DURATION_MASK).astype(np.float64) if groups else np.zeros(0)
    shifted, shifted_sq = np.zeros(groups), np.zeros(groups)
    for lo in range(0, len(keys), CHUNK):
        part = keys[lo : lo + CHUNK]
        group = np.searchsorted(first, np.arange(lo, lo + len(part)), side="right") - 1
        duration = (part & DURATION_MASK).astype(np.float64)
        total += np.bincount(group, weights=duration, minlength=groups)
        deviation = duration - shift[group]
        shifted += np.bincount(group, weights=deviation, minlength=groups)
        shifted_sq += np.bincount(group, weights=deviation * deviation, minlength=groups)
    # sum((d - mean)^2) = sum((d - s)^2) - (sum(d - s))^2 / n, with s a member: stable.
    return total, shifted_sq - shifted * shifted / np.maximum(count, 1)


def _longest_shapes(
    cols: ActivityColumns,
    phase: np.ndarray,
    groups: np.ndarray,
    high: np.ndarray,
    n_phases: int,
    by_phase: bool,
) -> np.ndarray:
    """Shape code of each group's first activity (in trace order) with its longest duration."""
    shape = np.full(len(groups), -1, dtype=np.int64)
    for lo in range(0, len(cols), CHUNK):
        p = phase[lo : lo + CHUNK]
        rows = np.flatnonzero(p >= 0)
        group = cols.arrays["name"][lo : lo + CHUNK][rows].astype(np.int64)
        if by_phase:
            group = group * n_phases + p[rows]
        index = np.searchsorted(groups, group)
        duration = cols.arrays["duration"][lo : lo + CHUNK][rows].clip(min=0)
        hit = duration == high[index]
        found, at = np.unique(index[hit], return_index=True)
        new = shape[found] < 0
        shape[found[new]] = cols.arrays["shape"][lo + rows[hit][at[new]]]
    return shape


def _notes(totals: _Totals, plan: _Plan, in_phase: np.ndarray, meta: dict[str, Any]) -> list[str]:
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
