"""Allocated memory over time, reconstructed from a snapshot's allocator trace.

The snapshot holds two things: the allocator's state when it was taken (``segments`` and
their ``blocks``; exact) and the trace of what the allocator did before that
(``device_traces``: ``alloc``, ``free_requested``, ``free_completed``, ``segment_alloc``,
``segment_free``, ``segment_map``/``segment_unmap``, ``oom``, ``snapshot``). The trace is a
ring buffer that may have dropped its oldest entries, so the timeline is built from the
end: start from the exact state at the dump and walk the trace *backwards*, undoing each
event (an ``alloc`` removes its block, a ``free_requested`` puts it back). Every state the
trace covers is then exact, however much history was dropped before it.

Two sizes per allocation:

* ``size``: the bytes the caller asked for (what the trace records, and what
  pytorch.org/memory_viz stacks up); its running sum peaks at ``requested_bytes.all.peak``.
* ``block_bytes``: what the caching allocator handed out, which is what
  ``torch.cuda.max_memory_allocated`` counts. Exact for blocks still alive at the dump.
  For the others it is inferred the way the allocator decides it: the request rounded up
  to 512 bytes, except that a large request (over 1 MiB) takes the whole free block it
  lands in when splitting would leave 1 MiB or less; that free block runs from the
  allocation's address to the next live block or the end of its segment, both known at
  every point of the trace (see docs/MEMORY.md).

Allocated memory drops at ``free_requested`` (as ``torch.cuda.memory_allocated`` does);
``free_completed`` only matters for blocks used on other streams (``record_stream``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from profkit.errors import BadInput

# The CUDA caching allocator rounds every request up to a multiple of this (kMinBlockSize).
BLOCK_ROUND_BYTES = 512
# Requests up to this come from the small pool; a large block is split only when more
# than this would be left over (kSmallSize).
SMALL_SIZE_BYTES = 1 << 20
_SEGMENT_UP = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@dataclass
class Allocation:
    """One allocation's life on the trace's clock (event indices)."""

    addr: int
    size: int
    """Requested bytes."""
    block_bytes: int
    """Bytes of the allocator block (exact if alive at the dump, else rounded up to 512)."""
    start: int
    """Index of its ``alloc`` event; -1 when it was allocated before the trace begins."""
    end: int | None
    """Index of its ``free_requested`` event; None when still allocated at the dump."""
    frames: list[dict[str, Any]] = field(default_factory=list)
    """Stack of the allocation (innermost first); empty when none was recorded."""

    def alive_at(self, state: int) -> bool:
        """Whether it is allocated in state ``state`` (the state after ``state`` events)."""
        return self.start < state and (self.end is None or self.end >= state)


@dataclass
class Timeline:
    """The allocated memory of one device over the events of its trace.

    States are numbered 0..n: state 0 is before the first event, state k after k events.
    """

    device: int
    allocations: list[Allocation]
    requested_bytes: np.ndarray
    """Requested bytes allocated in each state (n + 1 values)."""
    allocated_bytes: np.ndarray
    """Block bytes allocated in each state (n + 1 values)."""
    reserved_bytes: np.ndarray
    """Bytes of segments reserved from CUDA in each state (n + 1 values)."""
    time_us: np.ndarray | None
    """Each event's ``time_us`` (n values), when the trace has it."""
    actions: list[str]
    oom_events: list[dict[str, Any]]
    inconsistent_events: int = 0
    """Events that disagree with the state at the dump (should be 0)."""

    @property
    def events(self) -> int:
        return len(self.actions)

    @property
    def peak_state(self) -> int:
        """First state at which allocated (block) bytes reach their maximum."""
        return int(np.argmax(self.allocated_bytes))

    def live_at(self, state: int) -> list[Allocation]:
        """Allocations alive in ``state``, largest first."""
        live = [a for a in self.allocations if a.alive_at(state)]
        return sorted(live, key=lambda a: (-a.size, a.start))

    def state_time_ms(self, state: int) -> float | None:
        """Milliseconds from the first event to the event that led to ``state``."""
        if self.time_us is None or self.events == 0:
            return None
        index = min(max(state - 1, 0), self.events - 1)
        return float(self.time_us[index] - self.time_us[0]) / 1e3


def _round_block(size: int) -> int:
    return max(BLOCK_ROUND_BYTES, -(-size // BLOCK_ROUND_BYTES) * BLOCK_ROUND_BYTES)


def pick_device(snapshot: dict[str, Any]) -> int:
    """The device with the most trace events (else the first with segments, else 0)."""
    traces = snapshot.get("device_traces") or []
    if traces and max(len(t) for t in traces) > 0:
        return max(range(len(traces)), key=lambda d: len(traces[d]))
    devices = [s.get("device", 0) for s in snapshot["segments"]]
    return int(devices[0]) if devices else 0


def snapshot_devices(snapshot: dict[str, Any]) -> list[int]:
    """The devices a snapshot has anything for: trace events or segments."""
    traces = snapshot.get("device_traces") or []
    found = {d for d, t in enumerate(traces) if t}
    found |= {int(s.get("device", 0)) for s in snapshot["segments"]}
    return sorted(found)


def reconstruct(snapshot: dict[str, Any], device: int | None = None) -> Timeline:
    """Rebuild the allocations and the allocated/reserved memory of every traced state.

    ``snapshot`` is checked by :func:`profkit.memory.snapshot.normalize`. Raises
    :class:`BadInput` for a ``device`` the snapshot has nothing for.
    """
    if device is None:
        device = pick_device(snapshot)
    else:
        devices = snapshot_devices(snapshot)
        if device not in devices:
            listed = ", ".join(map(str, devices)) or "none"
            raise BadInput(f"snapshot has no device {device}; devices: {listed}")
    traces = snapshot.get("device_traces") or []
    events: list[dict[str, Any]] = traces[device] if device < len(traces) else []
    segments = [s for s in snapshot["segments"] if s.get("device", device) == device]
    at_dump = _live_at_dump(segments)
    before, inconsistent = _live_before_trace(at_dump, events)
    replay = _Replay(events, before)
    if not (snapshot.get("allocator_settings") or {}).get("expandable_segments"):
        _infer_large_blocks(events, replay.allocations, segments)
    for addr, alloc in replay.open_by_addr.items():
        block = at_dump.get(addr)
        if block is not None:  # alive at the dump: the block's own size and stack are exact
            alloc.block_bytes = int(block["size"])
            if block.get("frames"):
                alloc.frames = block["frames"]
    reserved = np.cumsum(replay.reserved_delta)
    reserved += sum(int(s["total_size"]) for s in segments) - reserved[-1]
    return Timeline(
        device=device,
        allocations=replay.allocations,
        requested_bytes=_running_total(replay.allocations, len(events), lambda a: a.size),
        allocated_bytes=_running_total(replay.allocations, len(events), lambda a: a.block_bytes),
        reserved_bytes=reserved,
        time_us=_event_times(events),
        actions=replay.actions,
        oom_events=replay.ooms,
        inconsistent_events=inconsistent,
    )


def _live_at_dump(segments: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The exact state at the dump: live blocks by address."""
    return {
        int(block["address"]): block
        for segment in segments
        for block in segment["blocks"]
        if block["state"] == "active_allocated"
    }


def _live_before_trace(
    at_dump: dict[int, dict[str, Any]], events: list[dict[str, Any]]
) -> tuple[dict[int, int], int]:
    """Walk back from the dump: address -> size of what was alive before the first event.

    Also counts the events that disagree with the dump (an ``alloc`` of a block that is not
    there, a ``free_requested`` of one that is).
    """
    live: dict[int, int] = {addr: int(b["requested_size"]) for addr, b in at_dump.items()}
    inconsistent = 0
    for event in reversed(events):
        action = event["action"]
        if action == "alloc":
            if live.pop(int(event["addr"]), None) is None:
                inconsistent += 1
        elif action == "free_requested":
            addr = int(event["addr"])
            if addr in live:
                inconsistent += 1
            live[addr] = int(event["size"])
    return live, inconsistent


class _Replay:
    """Forward through the trace from the state before it, giving each allocation its interval."""

    def __init__(self, events: list[dict[str, Any]], before: dict[int, int]) -> None:
        self.open_by_addr: dict[int, Allocation] = {
            addr: Allocation(addr, size, _round_block(size), -1, None)
            for addr, size in before.items()
        }
        self.allocations = list(self.open_by_addr.values())
        self.reserved_delta = np.zeros(len(events) + 1, dtype=np.int64)
        self.actions: list[str] = []
        self.ooms: list[dict[str, Any]] = []
        for index, event in enumerate(events):
            self._event(index, event)

    def _event(self, index: int, event: dict[str, Any]) -> None:
        action = event["action"]
        self.actions.append(action)
        if action == "alloc":
            addr, size = int(event["addr"]), int(event["size"])
            alloc = Allocation(addr, size, _round_block(size), index, None, event.get("frames", []))
            self.open_by_addr[addr] = alloc
            self.allocations.append(alloc)
        elif action == "free_requested":
            closing = self.open_by_addr.pop(int(event["addr"]), None)
            if closing is not None:
                closing.end = index
                if closing.start < 0 and not closing.frames:
                    # Allocated before the trace: only the free's stack is known.
                    closing.frames = event.get("frames", [])
        elif action in _SEGMENT_UP:
            self.reserved_delta[index + 1] = _SEGMENT_UP[action] * int(event["size"])
        elif action == "oom":
            self.ooms.append({"event": index, **{k: v for k, v in event.items() if k != "frames"}})


def _event_times(events: list[dict[str, Any]]) -> np.ndarray | None:
    """Each event's ``time_us`` when every event has one (else None)."""
    times = [e.get("time_us") for e in events]
    if not events or any(t is None for t in times):
        return None
    return np.array([int(t) for t in times if t is not None], dtype=np.int64)  # finite: normalize


def _infer_large_blocks(
    events: list[dict[str, Any]], allocations: list[Allocation], segments: list[dict[str, Any]]
) -> None:
    """Give large allocations the whole free block they landed in when it was not split.

    Replays the trace keeping the live block addresses and the segments in address order;
    at each large ``alloc`` the free block runs to the next live block (or the end of the
    segment). Blocks count as live until ``free_completed``: a block waiting on another
    stream cannot merge with its free neighbours yet. Expandable segments map and unmap
    pages instead, so they keep the rounded size.
    """
    # Segments alive before the first event: the dump's, with the trace's changes undone.
    seg_size = {int(s["address"]): int(s["total_size"]) for s in segments}
    for event in reversed(events):
        if event["action"] == "segment_alloc":
            seg_size.pop(int(event["addr"]), None)
        elif event["action"] == "segment_free":
            seg_size[int(event["addr"])] = int(event["size"])
    seg_starts = sorted(seg_size)
    live = sorted(a.addr for a in allocations if a.start < 0)
    by_event = {a.start: a for a in allocations if a.start >= 0}
    for index, event in enumerate(events):
        action = event["action"]
        addr = int(event.get("addr", 0))
        if action == "alloc":
            alloc = by_event[index]
            if alloc.size > SMALL_SIZE_BYTES:
                alloc.block_bytes = _landed_block(alloc, live, seg_starts, seg_size)
            bisect.insort(live, addr)
        elif action == "free_completed":
            _remove(live, addr)
        elif action == "segment_alloc":
            bisect.insort(seg_starts, addr)
            seg_size[addr] = int(event["size"])
        elif action == "segment_free":
            _remove(seg_starts, addr)
            seg_size.pop(addr, None)


def _landed_block(
    alloc: Allocation, live: list[int], seg_starts: list[int], seg_size: dict[int, int]
) -> int:
    rounded = alloc.block_bytes
    i = bisect.bisect_right(seg_starts, alloc.addr) - 1
    if i < 0:
        return rounded
    seg_end = seg_starts[i] + seg_size[seg_starts[i]]
    if alloc.addr >= seg_end:
        return rounded
    j = bisect.bisect_right(live, alloc.addr)
    free_end = min(live[j], seg_end) if j < len(live) else seg_end
    free = free_end - alloc.addr
    return free if rounded <= free <= rounded + SMALL_SIZE_BYTES else rounded


def _remove(values: list[int], value: int) -> None:
    i = bisect.bisect_left(values, value)
    if i < len(values) and values[i] == value:
        del values[i]


def _running_total(allocations: list[Allocation], n_events: int, size_of: Any) -> np.ndarray:
    """Bytes alive in each of the n + 1 states, from the allocations' intervals."""
    delta = np.zeros(n_events + 2, dtype=np.int64)
    for a in allocations:
        size = size_of(a)
        delta[a.start + 1] += size
        delta[(a.end if a.end is not None else n_events) + 1] -= size
    return np.cumsum(delta)[: n_events + 1]
