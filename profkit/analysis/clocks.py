"""Putting the clocks of several hosts' traces on one: the nodes of a job, per-rank traces
of several hosts.

Across hosts each node profiles its own ``torchrun`` tree on its own clock. An nsys export
counts time from its session start, whose UTC time it records
(``TARGET_INFO_SESSION_START_TIME``): nodes are first put on the first node's clock by
those start times. Chrome traces count from the epoch, so only the hosts' offset is left
there. What is left is the hosts' clock offset (NTP leaves tens of µs to ms). The ends of
one collective meet on every rank to a few µs, so the offset is estimated from the NCCL
kernels' ends (:func:`estimate_offset`) and, where it is larger than what those ends can
resolve, taken out. Each node's (host's) :class:`NodeClock` says what was found and
whether it was applied; :func:`clock_notes` says it in words. :mod:`.joins` applies them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

MIN_PAIRS = 8
"""Collectives an offset estimate pairs at the least: with 3 or 4, a pairing off by some
collectives fit as well as the true one in a few windows of the real 2-rank export."""
AGREE_NS = 50_000
"""Pairs whose end difference lies this close to the median agree; one collective's ends
on two ranks of one host differ by up to ~20 µs, so offsets below this are left alone."""
MAX_OFFSET_NS = 1_000_000_000
"""How far from the session starts' alignment an offset is looked for: clocks that NTP
keeps are ms apart; ones a second apart are not synchronised at all."""
ANCHORS = 32  # collectives of the other node whose possible partners give the shifts
TIE = 0.02  # scores this close are a tie
SPREAD_FACTOR = 5


@dataclass(frozen=True)
class NodeClock:
    """How a node's times were put on the first node's clock (ms): the session starts'
    difference (``base_ms``), then the offset its collectives show (:class:`Offset`:
    ``offset_ms``, the median of its NCCL kernel ends minus the first node's over the
    ``agreeing`` of ``pairs`` collectives, ``spread_ms`` their median absolute deviation,
    ``ambiguous``), ``applied`` where it was taken out."""

    path: str
    host: str | None
    ranks: list[int]
    base_ms: float
    offset_ms: float | None
    spread_ms: float | None
    pairs: int
    agreeing: int
    ambiguous: bool
    applied: bool


@dataclass(frozen=True)
class HostClocks:
    """How per-rank traces of several hosts were put on one clock: ``nodes`` one
    :class:`NodeClock` (as a dict) per host, in order of their lowest rank, and ``shifts``
    the ns to add to each trace's times (in the order the traces were given)."""

    nodes: list[dict[str, Any]]
    shifts: list[int]


def host_clocks(
    infos: list[dict[str, Any]],
    labels: list[str],
    nccl_ends_of: Callable[[int], tuple[np.ndarray, np.ndarray]],
) -> HostClocks | None:
    """The clocks of per-rank traces (their :func:`~profkit.traces.ranks.rank_info_of` and
    :func:`~profkit.traces.job.path_labels`) where they name several hosts; None for one host, or where a trace
    names none. ``nccl_ends_of(i)``: trace *i*'s NCCL kernels in launch order, names and
    end times (:func:`estimate_offset` pairs each further host's lowest rank's with the
    lowest rank's of all)."""
    hosts = [i.get("host") for i in infos]
    if None in hosts or len(set(hosts)) < 2:
        return None
    order = sorted(range(len(infos)), key=lambda i: int(infos[i]["rank"]))
    by_host: dict[str, list[int]] = {}
    for i in order:
        by_host.setdefault(str(hosts[i]), []).append(i)
    reference = nccl_ends_of(order[0])
    clocks, shifts = [], [0] * len(infos)
    for index, (host, members) in enumerate(by_host.items()):
        ranks = sorted(int(infos[i]["rank"]) for i in members)
        label = ", ".join(labels[i] for i in members)
        found = None if index == 0 else estimate_offset(reference, nccl_ends_of(members[0]))
        clock = _found_clock(label, host, ranks, 0, found)
        clocks.append(clock)
        if clock.applied and found is not None:
            for i in members:
                shifts[i] = -found.ns
    return HostClocks([asdict(c) for c in clocks], shifts)


def lifted(shifts: list[int]) -> list[int]:
    """Each node's shift onto the first node's clock, all raised by one amount where some
    are negative (a node whose session began before the first's), so that no time goes
    below 0: an unknown launch reads as a negative time, and a known one must not."""
    lift = max(0, -min(shifts, default=0))
    return [shift + lift for shift in shifts]


def node_clock(
    label: str,
    first: dict[str, Any],
    meta: dict[str, Any],
    reference: tuple[np.ndarray, np.ndarray],
    ends: tuple[np.ndarray, np.ndarray],
    ranks: list[int],
    is_first: bool,
) -> tuple[NodeClock, int]:
    """A node's :class:`NodeClock`, and the ns to add to its times to put them on the first
    node's clock (``reference``: the first node's NCCL ends, ``ends``: this node's)."""
    base = int(meta["session_start_utc_ns"]) - int(first["session_start_utc_ns"])
    if is_first:
        return NodeClock(label, meta.get("host"), ranks, 0.0, None, None, 0, 0, False, False), 0
    found = estimate_offset(reference, (ends[0], ends[1] + base))
    clock = _found_clock(label, meta.get("host"), ranks, base, found)
    return clock, base - (found.ns if clock.applied and found is not None else 0)


def _found_clock(
    label: str, host: str | None, ranks: list[int], base: int, found: Offset | None
) -> NodeClock:
    """The :class:`NodeClock` of what :func:`estimate_offset` found (None: nothing paired);
    an ambiguous offset is neither shown nor applied."""
    if found is None:
        return NodeClock(label, host, ranks, base / 1e6, None, None, 0, 0, False, False)
    trusted = not found.ambiguous
    return NodeClock(
        label, host, ranks, base / 1e6,
        found.ns / 1e6 if trusted else None, found.spread / 1e6 if trusted else None,
        found.pairs, found.agreeing, found.ambiguous, _resolved(found),
    )  # fmt: skip


@dataclass(frozen=True)
class Offset:
    """What the collectives say of one clock against another (ns): ``ns`` the median end
    difference of the pairs that agree (``agreeing`` of ``pairs``), ``spread`` their median
    absolute deviation; ``ambiguous`` where another pairing, at another offset, agrees as
    well (collectives too evenly spaced to tell), and ``ns`` is then not to be trusted."""

    ns: int
    spread: int
    pairs: int
    agreeing: int
    ambiguous: bool


def estimate_offset(
    reference: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray]
) -> Offset | None:
    """How far ``other``'s clock runs ahead of ``reference``'s, from one rank's NCCL kernels
    on each: ``(names, end times)`` in launch order; None where no pairing has enough
    collectives.

    Every rank runs a communicator's collectives in the same order and they end together,
    but the two captures may start at different collectives, so the sequences are paired
    at each shift that puts some collective's ends within :data:`MAX_OFFSET_NS` of each
    other (the session starts have already aligned the clocks to about that), where at
    least half of the shorter sequence, and :data:`MIN_PAIRS`, pair kernels of the same
    name. A shift is scored by how many of its pairs end within :data:`AGREE_NS` of its
    median difference: the true pairing agrees nearly everywhere, a pairing off by some
    collectives breaks wherever their spacing changes (a step boundary, a bucket of
    another size). Where two pairings at offsets more than ``AGREE_NS`` apart score within
    :data:`TIE` of each other, the answer is ambiguous."""
    codes = pd.factorize(np.concatenate([reference[0], other[0]]))[0]
    ref_name, name = codes[: len(reference[0])], codes[len(reference[0]) :]
    ref_end, end = reference[1], other[1]
    need = max(MIN_PAIRS, (min(len(ref_end), len(end)) + 1) // 2)
    scored = []
    for shift in _shifts(ref_end, end):
        lo, hi = max(0, shift), min(len(ref_end), len(end) + shift)
        if hi - lo < need:
            continue
        same = ref_name[lo:hi] == name[lo - shift : hi - shift]
        if same.sum() < need:
            continue
        diff = end[lo - shift : hi - shift][same] - ref_end[lo:hi][same]
        agree = np.abs(diff - int(np.median(diff))) <= AGREE_NS
        scored.append((agree.mean(), diff[agree], int(same.sum())))
    if not scored:
        return None
    share, diff, pairs = max(scored, key=lambda s: s[0])
    ns = int(np.median(diff))
    rivals = [
        s for s in scored if s[0] >= share - TIE and abs(int(np.median(s[1])) - ns) > AGREE_NS
    ]
    spread = int(np.median(np.abs(diff - ns)))
    return Offset(ns, spread, pairs, len(diff), ambiguous=bool(rivals))


def _shifts(ref_end: np.ndarray, end: np.ndarray) -> list[int]:
    """The shifts (reference index minus other index) that put a collective's ends within
    :data:`MAX_OFFSET_NS`, from up to :data:`ANCHORS` collectives of ``other``: the search
    costs those, not every shift of two long sequences."""
    if not len(ref_end) or not len(end):
        return []
    order = np.argsort(ref_end, kind="stable")
    sorted_end = ref_end[order]
    shifts: set[int] = set()
    for j in np.unique(np.linspace(0, len(end) - 1, min(ANCHORS, len(end))).astype(np.int64)):
        lo = np.searchsorted(sorted_end, end[j] - MAX_OFFSET_NS, side="left")
        hi = np.searchsorted(sorted_end, end[j] + MAX_OFFSET_NS, side="right")
        shifts.update((order[lo:hi] - j).tolist())
    return sorted(shifts)


def _resolved(found: Offset) -> bool:
    """Whether an offset is one pairing's alone, and larger than the collectives' ends can
    be told apart by."""
    return not found.ambiguous and abs(found.ns) > max(AGREE_NS, SPREAD_FACTOR * found.spread)


def no_ends() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=object), np.zeros(0, np.int64)


NOTED_NODES = 8
"""Above this many nodes of one kind (taken out, ambiguous, unknown), their notes are one."""


def clock_notes(clocks: list[dict[str, Any]], noted: int = NOTED_NODES) -> list[str]:
    """What the clocks of the nodes (or hosts) after the first showed: a note each, or,
    for more than ``noted`` of a kind, one note for them all."""
    first = clocks[0]["path"]
    later = [(clock, _kind(clock)) for clock in clocks[1:]]
    of_kind: dict[str, list[dict[str, Any]]] = {}
    for clock, kind in later:
        if kind is not None:
            of_kind.setdefault(kind, []).append(clock)
    said: list[str] = []
    for clock, kind in later:  # in node order; a kind said once where it is first met
        if kind is None:
            continue
        if len(of_kind[kind]) <= noted:
            said.append(_node_note(kind, clock, first))
        elif clock is of_kind[kind][0]:
            said.append(_nodes_note(kind, of_kind[kind], first))
    return said


def _kind(clock: dict[str, Any]) -> str | None:
    """What a later node's clock note says: ``ambiguous``, ``unknown``, ``applied`` or none."""
    if clock["ambiguous"]:
        return "ambiguous"
    if clock["offset_ms"] is None:
        return "unknown"
    return "applied" if clock["applied"] else None


def _node_note(kind: str, clock: dict[str, Any], first: str) -> str:
    if kind == "ambiguous":
        return (
            f"{clock['path']}: its collectives pair with {first}'s equally well at more "
            "than one offset (too evenly spaced to tell), so its clock offset is unknown: "
            "times across nodes are as the session starts put them"
        )
    if kind == "unknown":
        return (
            f"{clock['path']}: no run of NCCL kernels pairs with {first}'s, so its clock "
            "offset is unknown: times across nodes are as the session starts put them"
        )
    return (
        f"{clock['path']}: its clock ran {clock['offset_ms']:+.3f} ms from {first}'s "
        f"(the ends of {clock['agreeing']} of {clock['pairs']} paired collectives, "
        f"spread {clock['spread_ms']:.3f} ms): taken out"
    )


def _nodes_note(kind: str, found: list[dict[str, Any]], first: str) -> str:
    """One note for many nodes of one kind; the Nodes table has each."""
    names = ", ".join(c["path"] for c in found[:3])
    who = f"{len(found):,} nodes ({names}, ...)"
    each = "each node's is in the Nodes table (JSON: nodes)"
    if kind == "applied":
        offsets = [c["offset_ms"] for c in found]
        return (
            f"{who}: their clocks ran {min(offsets):+.3f} to {max(offsets):+.3f} ms from "
            f"{first}'s (median {float(np.median(offsets)):+.3f} ms, from their paired "
            f"collectives' ends): taken out; {each}"
        )
    why = (
        "their collectives pair with the first's equally well at more than one offset"
        if kind == "ambiguous"
        else "no run of their NCCL kernels pairs with the first's"
    )
    return (
        f"{who}: {why}, so their clock offsets are unknown: times across nodes are as the "
        f"session starts put them; {each}"
    )
