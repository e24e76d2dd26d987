"""Host-side rules: ``host_idle``, ``host_sync``, ``launch_bound``.

One process at a time: the union of its GPU intervals over its captured span (from the
capture's start, ``cudaProfilerStart``, where the trace has it, else the first GPU work, to
the last GPU work) leaves gaps. A gap is the host's doing when the work that ends it was
launched after the GPU went idle (a launch call starts inside the gap; otherwise the work
was queued and waited on something else: ``device``). Each host gap gets one cause, first
match wins:

- a blocking sync (:data:`~profkit.traces.host_calls.CALL_KINDS` ``sync``) was in progress
  when the GPU ran dry, and the host launched again within :data:`HOST_IDLE_MIN_MS` of its
  return: the host waited for the queue to drain, then had to refill it (``host_sync``);
- the host launched nothing for at least :data:`HOST_IDLE_MIN_MS` after the GPU went idle
  (``host_idle``: an input pipeline, a sleep, Python work between phases);
- else it is launch overhead: the GPU ran out of work between launches (``launch_bound``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.findings.model import Finding, lacking, ms
from profkit.traces.host_calls import HostTrace

HOST_IDLE_MIN_MS = 1.0
"""A gap in which the host launched nothing for this long is host idle, not launch
overhead (a launch and its kernel's start are ~5-50 µs apart; autograd's own bookkeeping
between backward ops leaves gaps up to ~0.7 ms on the plant captures, which count as
launch overhead)."""
HOST_IDLE_MIN_STEP_FRACTION = 0.5
"""host_idle is reported only where it recurs: in at least this fraction of the steps (a
one-off stall, such as a first step's warm-up, is not what to fix first)."""
SYNC_TOLERANCE_MS = 0.02
"""Slack for "in progress when the GPU ran dry": a sync begun or returned this close to
the gap's opening counts (the API and GPU timestamps are taken apart)."""
LAUNCH_BOUND_MAX_BUSY = 0.5
"""launch_bound needs the GPU busy less than this share of the captured span ..."""
LAUNCH_BOUND_MIN_GAP_SHARE = 0.25
"""... and the gaps of launch overhead at least this share of it."""
STEADY_MIN_STEPS = 3
"""With this many captured steps or more, launch_bound is decided on the steps after the
first: a first step's warm-up (lazy initialization, autotuning, a graph's capture) and
what came before it are not the run's rhythm."""
OUTSIDE_PHASES = "between phases"
"""``by_phase``'s key for calls made outside every outermost range."""
MIN_RECOVERABLE_SHARE = 0.01
"""No host finding below this share of the captured span."""


def host_findings(
    host: HostTrace, ranges: pd.DataFrame, rank: int | None, notes: list[str], phases: set[str]
) -> list[Finding]:
    """The host-side findings of one process; ``phases``: the report's phase names (a
    finding's ``phase`` is one of them or None)."""
    why = (
        "findings host_idle, host_sync and launch_bound need the CUDA API calls "
        "(nsys -t cuda; torch.profiler's cuda_runtime events); this trace has none"
    )
    if len(host.gpu_start) < 2 or lacking(host.has_calls, notes, why):
        return []
    gaps = _gaps(host)
    span = float(span_of(host))
    top = outermost(ranges, phases)
    steps = step_starts(top)
    places = Places(top)
    found = [
        _host_sync(host, gaps, span, rank, places),
        _host_idle(gaps, span, rank, places, steps),
        _launch_bound(host, gaps, span, rank, steps),
    ]
    kept = [f for f in found if f is not None and f.share >= MIN_RECOVERABLE_SHARE]
    for f in kept:
        f.phase = f.phase if f.phase in phases else None
    return kept


def span_of(host: HostTrace) -> int:
    """The process's captured span, ns (0 without GPU work)."""
    return int(host.gpu_end.max() - span_start(host)) if len(host.gpu_start) else 0


def span_start(host: HostTrace) -> int:
    """Where the captured span begins: the capture's start (``cudaProfilerStart``) where
    the trace has it and it precedes the first GPU work, else that work's start."""
    first = int(host.gpu_start.min())
    starts = host.call_end[(host.call_kind == 2) & (host.call_end < first)]
    return int(starts.min()) if len(starts) else first


def _gaps(host: HostTrace) -> pd.DataFrame:
    """The GPU's idle gaps with their cause: ``start``, ``end``, ``launch`` (the first
    launch call inside, -1 if none), ``sync`` (the index of the sync that caused it, -1)
    and ``cause`` (``sync``, ``idle``, ``launch``, or ``device``: work already queued)."""
    order = np.argsort(host.gpu_start, kind="stable")
    start, end = host.gpu_start[order], host.gpu_end[order]
    begin = span_start(host)  # the GPU idles from the capture's start to its first work
    reach = np.maximum.accumulate(end)
    lo, hi = np.append(begin, reach[:-1]), start
    open_ = hi > lo
    lo, hi = lo[open_], hi[open_]
    launches = np.sort(host.call_start[host.call_kind == 0])
    # The launch of the work that ends the gap: the last launch call begun in the gap (a
    # launch call that put nothing on the GPU, such as one recorded into a CUDA graph
    # being captured, does not end it).
    last = np.searchsorted(launches, hi, side="left") - 1
    launch = (
        np.where(last >= 0, launches[np.maximum(last, 0)], -1) if len(launches) else -1 + 0 * lo
    )
    launch = np.where((launch > lo) & (launch < hi), launch, -1)
    sync_at = np.flatnonzero(host.call_kind == 1)
    by_end = sync_at[np.argsort(host.call_end[sync_at], kind="stable")]
    ends = host.call_end[by_end]
    k = np.searchsorted(ends, lo - int(SYNC_TOLERANCE_MS * 1e6), side="left")
    k_in = np.minimum(k, max(len(ends) - 1, 0))
    limit = np.where(launch >= 0, launch, hi)
    # the host was inside the call when the GPU ran dry (a call made once the GPU was
    # already idle drained nothing)
    tol = int(SYNC_TOLERANCE_MS * 1e6)
    starts = host.call_start[by_end]
    found = (
        (k < len(ends)) & (ends[k_in] <= limit) & (starts[k_in] <= lo + tol)
        if len(ends) else np.zeros(len(lo), bool)
    )  # fmt: skip
    sync = np.where(found, by_end[k_in] if len(ends) else -1, -1)
    idle = np.where(launch >= 0, launch - lo, 0)
    # After a sync returns the host may go on idling (a sleep, data loading): that part is
    # host idle, not the sync's.
    after_sync = np.where(found, launch - np.maximum(lo, ends[k_in] if len(ends) else 0), 0)
    long_ = HOST_IDLE_MIN_MS * 1e6
    cause = np.where(
        launch < 0, "device",
        np.where((sync >= 0) & (after_sync < long_), "sync",
                 np.where(idle >= long_, "idle", "launch")),
    )  # fmt: skip
    return pd.DataFrame(
        {"start": lo, "end": hi, "launch": launch, "sync": sync, "idle": idle, "cause": cause}
    )


def outermost(ranges: pd.DataFrame, phases: set[str]) -> pd.DataFrame:
    """The ranges that say where the host was: the report's phase ranges where the trace
    has them (not a library's or a user's other marks, such as a ``mylib`` domain's range
    or torch.profiler's ``enumerate(DataLoader)``), else the outermost ranges."""
    named = ranges[ranges["name"].astype(str).isin(phases)] if len(ranges) else ranges
    top = named if len(named) else ranges[ranges["depth"] == 0]
    return top.sort_values("start", kind="stable")


def step_starts(top: pd.DataFrame) -> np.ndarray:
    """Each step's start: the instances of the first of the :func:`outermost` ranges
    (``forward`` in an annotated trace); none where the trace has no ranges."""
    if not len(top):
        return np.zeros(0, np.int64)
    first = str(top["name"].iloc[0])
    return top.loc[top["name"] == first, "start"].to_numpy(np.int64)


class Places:
    """Where the host was at given times: the :func:`outermost` range open then, or the
    next one to open (look-ups by binary search)."""

    def __init__(self, top: pd.DataFrame) -> None:
        """``top``: the :func:`outermost` ranges."""
        self.start = top["start"].to_numpy(np.int64)
        self.end = np.maximum.accumulate(top["end"].to_numpy(np.int64)) if len(top) else self.start
        self.name = top["name"].astype(str).to_numpy(dtype=object)

    def inside(self, at: np.ndarray) -> list[str | None]:
        """The outermost range open at each time (the latest begun), else None."""
        k = np.searchsorted(self.start, at, side="right") - 1
        ok = (k >= 0) & (self.end[np.maximum(k, 0)] >= at) if len(self.start) else k < -1
        return [str(self.name[j]) if o else None for j, o in zip(k, ok, strict=True)]

    def place(self, at: np.ndarray) -> list[str]:
        """``in NAME`` where a range is open, else ``before NAME`` (the next to open)."""
        after = np.searchsorted(self.start, at, side="left")
        out = []
        for name, j in zip(self.inside(at), after, strict=True):
            nxt = str(self.name[j]) if j < len(self.name) else None
            out.append(f"in {name}" if name else f"before {nxt}")
        return out


def _host_idle(
    gaps: pd.DataFrame, span: float, rank: int | None, places: Places, steps: np.ndarray
) -> Finding | None:
    idle = gaps[gaps["cause"] == "idle"]
    if not len(idle):
        return None
    step_of = np.searchsorted(steps, idle["launch"].to_numpy(), side="right") - 1
    n_steps = max(len(steps), 1)
    if len(set(step_of.tolist())) < HOST_IDLE_MIN_STEP_FRACTION * n_steps:
        return None
    idle_ns = idle["idle"].to_numpy(np.int64)
    # where the host was while it launched nothing: the middle of the idle
    where_of = places.place(idle["start"].to_numpy(np.int64) + idle_ns // 2)
    weight = Counter[str]()
    for place, ns in zip(where_of, idle_ns, strict=True):
        weight[place] += int(ns)  # the place with the most idle time
    step_key = [str(int(k)) if len(steps) else "None" for k in step_of]
    by_step: dict[str, float] = {}
    for key, ns in zip(step_key, idle_ns, strict=True):
        by_step[key] = round(by_step.get(key, 0.0) + ms(ns), 6)
    gap_ns = (idle["end"] - idle["start"]).to_numpy(np.int64)
    rows = [
        {"step": int(step_of[i]) if len(steps) else None, "where": where_of[i],
         "idle_ms": ms(idle_ns[i]), "gap_ms": ms(gap_ns[i])}
        for i in np.argsort(-idle_ns, kind="stable")[:10]
    ]  # fmt: skip
    total = _recurring(step_of, idle_ns, len(steps))
    where = weight.most_common(1)[0][0]
    phase = where.split(" ", 1)[1]
    return Finding(
        "host_idle", ms(total), total / span,
        {"count": len(idle), "where": where, "per_step_ms": ms(total / n_steps),
         "by_step_ms": by_step, "one_off_ms": ms(idle_ns.sum() - total),
         "steps": n_steps, "span_ms": ms(span), "rows": rows},
        "The GPU waits while the host launches nothing "
        f"({ms(total / n_steps):.2f} ms a step, {where}): move the host work off the step "
        "(DataLoader workers, pin_memory and non_blocking copies, prefetch the next batch).",
        rank, None if phase == "None" else phase, _marks(idle),
    )  # fmt: skip


def _recurring(step_of: np.ndarray, idle_ns: np.ndarray, steps: int) -> float:
    """The idle that recurs: each step's idle (and the idle before the first step) up to
    the median step's; the excess of one step over it (a first step's warm-up, a CUDA
    graph's capture) is a one-off, not what fixing the host work gives back every step."""
    if not steps:
        return float(idle_ns.sum())
    per_key = np.bincount(step_of + 1, weights=idle_ns, minlength=steps + 1)
    typical = float(np.median(per_key[1:]))
    return float(np.minimum(per_key, typical).sum())


def _host_sync(
    host: HostTrace, gaps: pd.DataFrame, span: float, rank: int | None, places: Places
) -> Finding | None:
    """Blocking syncs made while GPU work was in flight that drained the queue: the GPU
    went idle while the host was in the call and was still idle when it returned, or the
    call returned after the last GPU work of the capture."""
    first, last = int(host.gpu_start.min()), int(host.gpu_end.max())
    tol = int(SYNC_TOLERANCE_MS * 1e6)
    lo, hi = gaps["start"].to_numpy(np.int64), gaps["end"].to_numpy(np.int64)
    own = gaps["cause"].to_numpy() == "sync"
    at = np.flatnonzero(host.call_kind == 1)
    start, end = host.call_start[at], host.call_end[at]
    during = (start < last + tol) & (end > first)  # else before or after the GPU work
    # the gap the GPU was in when the call returned (the last to open by then), if it
    # opened while the host was in the call (gaps come in time order)
    j = np.searchsorted(lo, end + tol, side="right") - 1
    jj = np.maximum(j, 0)
    hit = (j >= 0) & (lo[jj] >= start - tol) & (hi[jj] > end) if len(lo) else j < -1
    keep = during & (hit | (end >= last))  # else the GPU kept working: it blocked the host only
    # the idle that follows: the whole gap where the sync caused it, else the part of the
    # gap the host spent inside the call
    # several syncs in one gap (DDP's event syncs come in pairs) drained it once: the
    # first of them carries its idle
    counted = hit & ~_repeats(np.where(hit, j, -1))
    idle = np.where(
        counted, np.where(own[jj] if len(lo) else False, hi[jj] - lo[jj],
                      np.maximum(0, end - lo[jj]) if len(lo) else 0), 0,
    )[keep]  # fmt: skip
    if not keep.any():
        return None
    at, start, end = at[keep], start[keep], end[keep]
    phase_of = places.inside(start)
    names = [str(n) for n in host.call_name[at]]
    rows = [
        {"call": names[i], "phase": phase_of[i], "call_ms": ms(end[i] - start[i]),
         "idle_after_ms": ms(idle[i])}
        for i in range(min(len(at), 20))
    ]  # fmt: skip
    phases = Counter(phase_of)
    total = float(idle.sum())
    return Finding(
        "host_sync", ms(total), total / span,
        {"count": len(at), "calls": dict(Counter(names)),
         "by_phase": {k or OUTSIDE_PHASES: v for k, v in phases.items()}, "span_ms": ms(span),
         "rows": rows},
        f"{len(at)} blocking synchronizations drained the GPU queue (.item(), .cpu(), "
        "print(tensor), torch.cuda.synchronize()): keep values on the GPU, log them every N "
        "steps, or copy with non_blocking=True into pinned memory.",
        rank, phases.most_common(1)[0][0], _marks(gaps[own]),
    )  # fmt: skip


def _repeats(keys: np.ndarray) -> np.ndarray:
    """Where a key (not -1) was already seen earlier in the array."""
    seen = np.zeros(len(keys), bool)
    _, first = np.unique(keys, return_index=True)
    seen[first] = True
    return ~seen & (keys >= 0)


def _launch_bound(
    host: HostTrace, gaps: pd.DataFrame, span: float, rank: int | None, steps: np.ndarray
) -> Finding | None:
    """Decided and measured on the steady steps (from the second, where the capture has
    at least :data:`STEADY_MIN_STEPS`): recoverable_ms, the launch gaps there."""
    end = int(host.gpu_end.max())
    begin = int(steps[1]) if len(steps) >= STEADY_MIN_STEPS else end - int(span)
    window = float(end - begin)
    if window <= 0:
        return None
    part = np.maximum(gaps["end"].to_numpy() - np.maximum(gaps["start"].to_numpy(), begin), 0)
    busy = window - float(part.sum())
    launch_part = float(part[(gaps["cause"] == "launch").to_numpy()].sum())
    if busy / window >= LAUNCH_BOUND_MAX_BUSY or launch_part / window < LAUNCH_BOUND_MIN_GAP_SHARE:
        return None
    small = gaps[(gaps["cause"] == "launch").to_numpy() & (part > 0)]
    overhead = launch_part
    durations = (host.gpu_end - host.gpu_start) / 1e3
    launches = np.sort(host.call_start[host.call_kind == 0])
    cadence = float(np.median(np.diff(launches))) / 1e3 if len(launches) > 1 else 0.0
    median_us = float(np.median(durations))
    if median_us >= cadence:  # kernels outlast the launch cadence: not the host's pace
        return None
    evidence: dict[str, Any] = {
        "count": len(small),
        "busy_share": round(busy / window, 4),
        "from_step": 1 if len(steps) >= STEADY_MIN_STEPS else None,
        "window_ms": ms(window),
        "span_ms": ms(span),
        "activities": len(durations),
        "median_launch_interval_us": round(cadence, 3),
        "kernel_us": {
            f"p{q}": round(float(np.percentile(durations, q)), 3) for q in (10, 50, 90, 99)
        },
        "rows": [
            {"gap_us": round(float(g["end"] - g["start"]) / 1e3, 3)}
            for _, g in small.nlargest(5, "end").iterrows()
        ],
    }
    return Finding(
        "launch_bound", ms(overhead), overhead / window, evidence,
        f"The GPU is busy {busy / window:.0%} of the steps: kernels (median {median_us:.1f} µs) "
        f"are shorter than the launch cadence ({cadence:.1f} µs). Capture the step in CUDA "
        'graphs (torch.compile(mode="reduce-overhead")), fuse ops (torch.compile), or give '
        "each launch more work (a larger batch).",
        rank, None, _marks(small),
    )  # fmt: skip


def _marks(gaps: pd.DataFrame) -> pd.DataFrame:
    """The gaps a finding attributes, as the lanes picture marks them."""
    return gaps[["start", "end", "launch", "cause"]].reset_index(drop=True)
