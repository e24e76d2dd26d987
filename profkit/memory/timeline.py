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

Everything is kept as columns (:class:`AllocationTable`, numpy arrays of the states), so
a trace of millions of events costs tens of bytes an event; :class:`Allocation` objects
are made only for the few allocations a summary or a picture shows.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from profkit.errors import BadInput
from profkit.memory.snapshot import snapshot_columns
from profkit.memory.trace_columns import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    NO_SITE,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    SnapshotColumns,
    TraceColumns,
)

# The CUDA caching allocator rounds every request up to a multiple of this (kMinBlockSize).
BLOCK_ROUND_BYTES = 512
# Requests up to this come from the small pool; a large block is split only when more
# than this would be left over (kSmallSize).
SMALL_SIZE_BYTES = 1 << 20
_SEGMENT_UP = {SEGMENT_ALLOC: 1, SEGMENT_MAP: 1, SEGMENT_FREE: -1, SEGMENT_UNMAP: -1}
_ROWS_PER_CHUNK = 1 << 16  # rows turned into Python ints at a time by the replay loops
OPEN = -1
"""``AllocationTable.end`` of an allocation still allocated at the dump."""


@dataclass(slots=True)
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
class AllocationTable:
    """Every allocation of a timeline as columns: first those alive before the trace, then
    one per ``alloc`` event, in trace order."""

    addr: np.ndarray
    size: np.ndarray
    """Requested bytes (int64)."""
    block_bytes: np.ndarray
    start: np.ndarray
    """Index of the ``alloc`` event; -1 before the trace."""
    end: np.ndarray
    """Index of the ``free_requested`` event; :data:`OPEN` when alive at the dump."""
    site: np.ndarray
    """Index into :attr:`sites`; ``NO_SITE`` without a stack."""
    sites: list[list[dict[str, Any]]]

    def __len__(self) -> int:
        return len(self.size)

    def end_states(self, n_events: int) -> np.ndarray:
        """The state each allocation leaves in: its free's index, else ``n_events``."""
        return np.where(self.end == OPEN, n_events, self.end)

    def take(self, rows: Any) -> list[Allocation]:
        """The allocations of ``rows``, as objects."""
        return [
            Allocation(
                int(self.addr[r]),
                int(self.size[r]),
                int(self.block_bytes[r]),
                int(self.start[r]),
                None if self.end[r] == OPEN else int(self.end[r]),
                self.sites[self.site[r]] if self.site[r] != NO_SITE else [],
            )
            for r in rows
        ]


@dataclass
class Timeline:
    """The allocated memory of one device over the events of its trace.

    States are numbered 0..n: state 0 is before the first event, state k after k events.
    """

    device: int
    allocations: AllocationTable
    requested_bytes: np.ndarray
    """Requested bytes allocated in each state (n + 1 values)."""
    allocated_bytes: np.ndarray
    """Block bytes allocated in each state (n + 1 values)."""
    reserved_bytes: np.ndarray
    """Bytes of segments reserved from CUDA in each state (n + 1 values)."""
    time_us: np.ndarray | None
    """Each event's ``time_us`` (n values), when the trace has it."""
    actions: np.ndarray
    """Each event's action code (n values): an index into :attr:`action_names`."""
    action_names: list[str]
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

    def action_count(self, name: str) -> int:
        """How many events have the action ``name``."""
        if name not in self.action_names:
            return 0
        return int(np.count_nonzero(self.actions == self.action_names.index(name)))

    def live_at(self, state: int) -> list[Allocation]:
        """Allocations alive in ``state``, largest first (then oldest first)."""
        table = self.allocations
        alive = (table.start < state) & ((table.end == OPEN) | (table.end >= state))
        rows = np.flatnonzero(alive)
        rows = rows[np.argsort(table.start[rows], kind="stable")]
        rows = rows[np.argsort(-table.size[rows], kind="stable")]
        return table.take(rows)

    def largest(self, count: int) -> list[Allocation]:
        """The ``count`` largest allocations (requested bytes), in table order on ties."""
        return self.allocations.take(np.argsort(-self.allocations.size, kind="stable")[:count])

    def state_time_ms(self, state: int) -> float | None:
        """Milliseconds from the first event to the event that led to ``state``."""
        if self.time_us is None or self.events == 0:
            return None
        index = min(max(state - 1, 0), self.events - 1)
        return float(self.time_us[index] - self.time_us[0]) / 1e3


def _round_block(size: np.ndarray) -> np.ndarray:
    rounded = -(-size // BLOCK_ROUND_BYTES) * BLOCK_ROUND_BYTES
    return np.maximum(BLOCK_ROUND_BYTES, rounded)


def _as_columns(snapshot: SnapshotColumns | dict[str, Any]) -> SnapshotColumns:
    return snapshot if isinstance(snapshot, SnapshotColumns) else snapshot_columns(snapshot)


def pick_device(snapshot: SnapshotColumns | dict[str, Any]) -> int:
    """The device with the most trace events (else the first with segments, else 0)."""
    snapshot = _as_columns(snapshot)
    traces = snapshot.traces
    if traces and max(len(t) for t in traces) > 0:
        return max(range(len(traces)), key=lambda d: len(traces[d]))
    devices = [s.get("device", 0) for s in snapshot.segments]
    return int(devices[0]) if devices else 0


def snapshot_devices(snapshot: SnapshotColumns | dict[str, Any]) -> list[int]:
    """The devices a snapshot has anything for: trace events or segments."""
    snapshot = _as_columns(snapshot)
    found = {d for d, t in enumerate(snapshot.traces) if len(t)}
    found |= {int(s.get("device", 0)) for s in snapshot.segments}
    return sorted(found)


def _empty_trace() -> TraceColumns:
    return TraceColumns(
        action=np.zeros(0, np.uint16),
        addr=np.zeros(0, np.uint64),
        size=np.zeros(0, np.int64),
        time_us=None,
        site=np.zeros(0, np.int32),
    )


def reconstruct(snapshot: SnapshotColumns | dict[str, Any], device: int | None = None) -> Timeline:
    """Rebuild the allocations and the allocated/reserved memory of every traced state.

    ``snapshot`` comes from :func:`~profkit.memory.snapshot.read_snapshot` (or is a dict
    from ``load_snapshot``). Raises :class:`BadInput` for a ``device`` the snapshot has
    nothing for.
    """
    snapshot = _as_columns(snapshot)
    if device is None:
        device = pick_device(snapshot)
    else:
        devices = snapshot_devices(snapshot)
        if device not in devices:
            listed = ", ".join(map(str, devices)) or "none"
            raise BadInput(f"snapshot has no device {device}; devices: {listed}")
    events = snapshot.traces[device] if device < len(snapshot.traces) else _empty_trace()
    segments = [s for s in snapshot.segments if s.get("device", device) == device]
    at_dump = _live_at_dump(segments)
    before, inconsistent = _live_before_trace(at_dump, events)
    table, still_open = _replay(events, before, list(snapshot.sites))
    if not snapshot.allocator_settings.get("expandable_segments"):
        _infer_large_blocks(events, table, segments)
    for addr, row in still_open.items():
        block = at_dump.get(addr)
        if block is not None:  # alive at the dump: the block's own size and stack are exact
            table.block_bytes[row] = int(block["size"])
            if block.get("frames"):
                table.site[row] = len(table.sites)
                table.sites.append(block["frames"])
    n = len(events)
    reserved = np.cumsum(_reserved_delta(events))
    reserved += sum(int(s["total_size"]) for s in segments) - reserved[-1]
    return Timeline(
        device=device,
        allocations=table,
        requested_bytes=_running_total(table, n, table.size),
        allocated_bytes=_running_total(table, n, table.block_bytes),
        reserved_bytes=reserved,
        time_us=events.time_us if n else None,
        actions=events.action,
        action_names=list(snapshot.actions),
        oom_events=[{"event": row, **events.ooms[row]} for row in sorted(events.ooms)],
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


def _rows(*columns: np.ndarray) -> Iterator[tuple[Any, ...]]:
    """The rows of ``columns`` as tuples of Python numbers, a chunk at a time."""
    for at in range(0, len(columns[0]), _ROWS_PER_CHUNK):
        yield from zip(*(c[at : at + _ROWS_PER_CHUNK].tolist() for c in columns), strict=True)


def _live_before_trace(
    at_dump: dict[int, dict[str, Any]], events: TraceColumns
) -> tuple[dict[int, int], int]:
    """Walk back from the dump: address -> size of what was alive before the first event.

    Also counts the events that disagree with the dump (an ``alloc`` of a block that is not
    there, a ``free_requested`` of one that is).
    """
    live: dict[int, int] = {addr: int(b["requested_size"]) for addr, b in at_dump.items()}
    inconsistent = 0
    picked = np.flatnonzero((events.action == ALLOC) | (events.action == FREE_REQUESTED))[::-1]
    for action, addr, size in _rows(
        events.action[picked], events.addr[picked], events.size[picked]
    ):
        if action == ALLOC:
            if live.pop(addr, None) is None:
                inconsistent += 1
        else:
            if addr in live:
                inconsistent += 1
            live[addr] = size
    return live, inconsistent


def _replay(
    events: TraceColumns, before: dict[int, int], sites: list[list[dict[str, Any]]]
) -> tuple[AllocationTable, dict[int, int]]:
    """Forward through the trace from the state before it, giving each allocation its
    interval; returns the table and the rows still open at the dump, by address."""
    allocs = np.flatnonzero(events.action == ALLOC)
    first = len(before)
    size = np.concatenate([np.fromiter(before.values(), np.int64, first), events.size[allocs]])
    table = AllocationTable(
        addr=np.concatenate([np.fromiter(before, np.uint64, first), events.addr[allocs]]),
        size=size,
        block_bytes=_round_block(size),
        start=np.concatenate([np.full(first, -1, np.int64), allocs.astype(np.int64)]),
        end=np.full(len(size), OPEN, np.int64),
        site=np.concatenate([np.full(first, NO_SITE, np.int32), events.site[allocs]]),
        sites=sites,
    )
    open_rows = {addr: row for row, addr in enumerate(before)}
    closed_rows: list[int] = []
    closed_at: list[int] = []
    picked = np.flatnonzero((events.action == ALLOC) | (events.action == FREE_REQUESTED))
    next_row = first
    for index, action, addr in _rows(picked, events.action[picked], events.addr[picked]):
        if action == ALLOC:
            open_rows[addr] = next_row
            next_row += 1
        else:
            row = open_rows.pop(addr, None)
            if row is not None:
                closed_rows.append(row)
                closed_at.append(index)
    if closed_rows:
        rows, at = np.array(closed_rows), np.array(closed_at)
        table.end[rows] = at
        # Allocated before the trace: only the free's stack is known.
        older = rows < first
        table.site[rows[older]] = events.site[at[older]]
    return table, open_rows


def _reserved_delta(events: TraceColumns) -> np.ndarray:
    """Change of reserved bytes leading to each state (n + 1 values)."""
    delta = np.zeros(len(events) + 1, dtype=np.int64)
    for code, sign in _SEGMENT_UP.items():
        rows = np.flatnonzero(events.action == code)
        delta[rows + 1] = sign * events.size[rows]
    return delta


def _infer_large_blocks(
    events: TraceColumns, table: AllocationTable, segments: list[dict[str, Any]]
) -> None:
    """Give large allocations the whole free block they landed in when it was not split.

    Replays the trace keeping the live block addresses and the segments in address order;
    at each large ``alloc`` the free block runs to the next live block (or the end of the
    segment). Blocks count as live until ``free_completed``: a block waiting on another
    stream cannot merge with its free neighbours yet. Expandable segments map and unmap
    pages instead, so they keep the rounded size.
    """
    action = events.action
    # Segments alive before the first event: the dump's, with the trace's changes undone.
    seg_size = {int(s["address"]): int(s["total_size"]) for s in segments}
    picked = np.flatnonzero((action == SEGMENT_ALLOC) | (action == SEGMENT_FREE))
    for code, addr, size in _rows(
        action[picked][::-1], events.addr[picked][::-1], events.size[picked][::-1]
    ):
        if code == SEGMENT_ALLOC:
            seg_size.pop(addr, None)
        else:
            seg_size[addr] = size
    seg_starts = sorted(seg_size)
    first = int(np.count_nonzero(table.start < 0))
    live = sorted(table.addr[:first].tolist())
    wanted = (action == ALLOC) | (action == FREE_COMPLETED) | (action == SEGMENT_ALLOC)
    picked = np.flatnonzero(wanted | (action == SEGMENT_FREE))
    row = first
    landed_rows, landed_bytes = [], []
    for code, addr, size in _rows(action[picked], events.addr[picked], events.size[picked]):
        if code == ALLOC:
            if size > SMALL_SIZE_BYTES:
                rounded = int(table.block_bytes[row])
                landed = _landed_block(addr, rounded, live, seg_starts, seg_size)
                if landed != rounded:
                    landed_rows.append(row)
                    landed_bytes.append(landed)
            bisect.insort(live, addr)
            row += 1
        elif code == FREE_COMPLETED:
            _remove(live, addr)
        elif code == SEGMENT_ALLOC:
            bisect.insort(seg_starts, addr)
            seg_size[addr] = size
        else:
            _remove(seg_starts, addr)
            seg_size.pop(addr, None)
    table.block_bytes[landed_rows] = landed_bytes


def _landed_block(
    addr: int, rounded: int, live: list[int], seg_starts: list[int], seg_size: dict[int, int]
) -> int:
    i = bisect.bisect_right(seg_starts, addr) - 1
    if i < 0:
        return rounded
    seg_end = seg_starts[i] + seg_size[seg_starts[i]]
    if addr >= seg_end:
        return rounded
    j = bisect.bisect_right(live, addr)
    free_end = min(live[j], seg_end) if j < len(live) else seg_end
    free = free_end - addr
    return free if rounded <= free <= rounded + SMALL_SIZE_BYTES else rounded


def _remove(values: list[int], value: int) -> None:
    i = bisect.bisect_left(values, value)
    if i < len(values) and values[i] == value:
        del values[i]


def _running_total(table: AllocationTable, n_events: int, sizes: np.ndarray) -> np.ndarray:
    """Bytes alive in each of the n + 1 states, from the allocations' intervals."""
    delta = np.zeros(n_events + 2, dtype=np.int64)
    np.add.at(delta, table.start + 1, sizes)
    np.add.at(delta, table.end_states(n_events) + 1, -sizes)
    return np.cumsum(delta)[: n_events + 1]
