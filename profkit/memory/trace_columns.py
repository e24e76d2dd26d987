"""A snapshot's allocator trace as compact columns: what the timeline needs, nothing more.

A trace entry is a dict (``action``, ``addr``, ``size``, ``stream``, ``time_us``,
``compile_context``, ``user_metadata``, ``frames``), with its stack as a list of frame
dicts; held as Python objects that is several hundred bytes an entry. The timeline needs
five numbers of each: the action (a small code), ``addr``, ``size``, ``time_us`` and a
*call site*, an index into :attr:`SnapshotColumns.sites`, one list of frames per distinct
stack (stacks repeat massively: ~70 distinct ones for 5,000 entries of a training step).
That is 30 bytes an entry (``stream``, ``compile_context`` and ``user_metadata`` are not
used, so not kept; an ``oom`` entry keeps all its fields but the frames, for the summary).

:class:`EntrySink` builds the columns while the pickle streams by (it is the sink of
:class:`~profkit.memory.pickle_stream.PlainStream`), checking each entry as
``checks.check_entry_fields`` and ``checks.check_frames`` do, and :func:`trace_columns`
builds them from a trace already loaded as a list of dicts: both go through
:class:`TraceBuilder`, so both give the same columns and the same first error.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from profkit.memory import checks
from profkit.memory.pickle_stream import RETIRED, PlainStream

ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE = range(5)
SEGMENT_MAP, SEGMENT_UNMAP, OOM, SNAPSHOT = range(5, 9)
NO_SITE = -1
"""The site of an entry with no frames."""
_NO_FRAMES: list[dict[str, Any]] = []  # what the memo keeps of an empty stack taken


@dataclass
class TraceColumns:
    """One device's trace, one row per entry, in trace order."""

    action: np.ndarray
    """uint16 codes: an index into :attr:`SnapshotColumns.actions`."""
    addr: np.ndarray
    """uint64; 0 for an action that names no block (``oom``, ``snapshot``)."""
    size: np.ndarray
    """int64 requested bytes; 0 for an action that names no block."""
    time_us: np.ndarray | None
    """int64 (``int()`` of the entry's time); None unless every entry has one."""
    site: np.ndarray
    """int32 index into :attr:`SnapshotColumns.sites`; :data:`NO_SITE` without frames."""
    ooms: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Row -> the ``oom`` entry's fields but its frames."""

    def __len__(self) -> int:
        return len(self.action)


@dataclass
class SnapshotColumns:
    """A checked snapshot with its traces as columns (see the module docstring)."""

    segments: list[dict[str, Any]]
    """The allocator's state at the dump, checked and completed by ``normalize``."""
    traces: list[TraceColumns]
    actions: list[str]
    sites: list[list[dict[str, Any]]]
    allocator_settings: dict[str, Any]
    legacy: bool = False
    """The file held a bare list of segments (torch before 1.13), not a snapshot dict."""


class SiteTable:
    """Call-site ids: one per distinct stack, found by the stack's frame objects first
    (a pickle memoizes each frame dict once) and by their contents second."""

    def __init__(self) -> None:
        self.frames: list[list[dict[str, Any]]] = []
        self._by_ids: dict[tuple[int, ...], tuple[int, list[Any]]] = {}
        self._by_content: dict[tuple[Any, ...], int] = {}

    def site_of(self, frames: Any, where: str) -> int:
        """The id of ``frames`` (checked as frames the first time they are seen)."""
        if type(frames) is not list:
            checks.check_list(frames, where)
        if not frames:
            return NO_SITE
        key = tuple(map(id, frames))
        known = self._by_ids.get(key)
        if known is not None:
            return known[0]
        checks.check_frames(frames, where)
        content = tuple((f.get("filename"), f.get("line"), f.get("name")) for f in frames)
        site = self._by_content.get(content)
        if site is None:
            site = self._by_content[content] = len(self.frames)
            self.frames.append(list(frames))
        self._by_ids[key] = (site, frames)  # keeps the frame objects, so their ids stay theirs
        return site


class TraceBuilder:
    """The columns of one trace list, one entry at a time; remembers the first bad entry."""

    def __init__(self, owner: EntrySink) -> None:
        self.owner = owner
        self.count = 0
        self.error: str | None = None
        """The first bad entry, as ``[index].field is ..., not ...``."""
        self.action = array("H")
        self.addr = array("Q")
        self.size = array("q")
        self.time_us = array("q")
        self.missing_times = 0
        self.site = array("i")
        self.ooms: dict[int, dict[str, Any]] = {}

    def add(self, entry: Any) -> None:
        index = self.count
        self.count += 1
        if self.error is not None:
            return
        where = f"[{index}]"
        try:
            action, addr, size, time_us = checks.check_entry_fields(entry, where)
            frames = entry.get("frames", [])
            site = self.owner.sites.site_of(frames, f"{where}.frames")
        except checks.Malformed as exc:
            self.error = str(exc)
            return
        self.action.append(self.owner.code_of(action))
        self.addr.append(addr)
        self.size.append(size)
        if time_us is None:
            self.missing_times += 1
            time_us = 0
        self.time_us.append(time_us)
        self.site.append(site)
        if action == "oom":
            self.ooms[index] = {k: v for k, v in entry.items() if k != "frames"}
        self.owner.retire(entry, frames, site)
        if self.owner.pairs is None:
            self.owner.pairs = len(entry)

    def extend(
        self,
        action: np.ndarray,
        addr: np.ndarray,
        size: np.ndarray,
        time_us: np.ndarray | None,
        site: np.ndarray,
        count: int,
    ) -> None:
        """Add ``count`` entries checked column-wise (no OOM among them)."""
        self.count += count
        if self.error is not None:
            return
        self.action.frombytes(action.astype(np.uint16).tobytes())
        self.addr.frombytes(addr.astype(np.uint64).tobytes())
        self.size.frombytes(size.astype(np.int64).tobytes())
        if time_us is None:
            self.missing_times += count
            time_us = np.zeros(count, dtype=np.int64)
        self.time_us.frombytes(time_us.astype(np.int64).tobytes())
        self.site.frombytes(site.astype(np.int32).tobytes())

    def columns(self) -> TraceColumns:
        return TraceColumns(
            action=np.frombuffer(self.action, dtype=np.uint16),
            addr=np.frombuffer(self.addr, dtype=np.uint64),
            size=np.frombuffer(self.size, dtype=np.int64),
            time_us=None
            if self.missing_times or not self.count
            else np.frombuffer(self.time_us, dtype=np.int64),
            site=np.frombuffer(self.site, dtype=np.int32),
            ooms=self.ooms,
        )


class EntrySink:
    """Takes the trace entries out of a streaming pickle (a :class:`PlainStream` sink).

    A list is a trace when the first item appended to it is a dict with an ``action``
    (only trace entries have one); its later items all go to its :class:`TraceBuilder`,
    whatever they are, so that a bad one is named by its index.
    """

    def __init__(self) -> None:
        self.sites = SiteTable()
        self.actions: list[str] = list(ACTIONS)
        self._codes = {name: code for code, name in enumerate(ACTIONS)}
        self.builders: dict[int, tuple[TraceBuilder, list[Any]]] = {}
        self.stream: PlainStream | None = None
        self.pairs: int | None = None
        """How many keys the first entry had: the shape ``trace_fast`` looks for."""
        self.runs: Any = None
        """A ``trace_fast.FastRuns`` that takes whole runs of entries, if any."""

    def code_of(self, action: str) -> int:
        code = self._codes.get(action)
        if code is None:
            code = self._codes[action] = len(self.actions)
            self.actions.append(action)
        return code

    def builder(self, target: list[Any]) -> TraceBuilder | None:
        known = self.builders.get(id(target))
        return known[0] if known is not None else None

    def extend(self, target: list[Any], items: list[Any]) -> bool:
        builder = self.builder(target)
        if builder is None:
            first = items[0] if items else None
            if not (type(first) is dict and "action" in first):
                return False
            builder = TraceBuilder(self)
            self.builders[id(target)] = (builder, target)  # keeps the list: its id stays its
            for earlier in target:  # items of an earlier batch that did not look like entries
                builder.add(earlier)
            target.clear()
        for item in items:
            builder.add(item)
        return True

    def take_run(self, target: list[Any]) -> None:
        """At a dict opening in ``target``'s items: let :attr:`runs` take the entries there
        (after the items before them in the batch, taken first to keep the order)."""
        builder = self.builder(target)
        if builder is None or self.runs is None or self.runs.disabled or self.stream is None:
            return
        for item in self.stream.stack:
            builder.add(item)
        self.stream.stack.clear()
        self.runs.take_run(builder)

    def retire(self, entry: dict[str, Any], frames: Any, site: int) -> None:
        """Free the memo of an entry taken: its frames list becomes the site's shared one."""
        if self.stream is not None:
            self.stream.retire(entry, RETIRED)
            if type(frames) is list:
                self.stream.retire(frames, self.sites.frames[site] if site >= 0 else _NO_FRAMES)


def trace_columns(sink: EntrySink, trace: list[Any], device: int) -> TraceColumns:
    """Columns of a trace list (the taken one, or one loaded whole); raises
    :class:`~profkit.memory.checks.Malformed` naming its first bad entry."""
    builder = sink.builder(trace)
    if builder is None:
        builder = TraceBuilder(sink)
        for entry in trace:
            builder.add(entry)
    if builder.error is not None:
        raise checks.Malformed(f"device_traces[{device}]{builder.error}")
    return builder.columns()
