"""Reading and writing CUDA memory snapshots, as plain data only.

A snapshot (``torch.cuda.memory._snapshot()``) is a dict of lists, dicts, strings,
numbers, booleans, ``None`` and tuples (``segment_pool_id``). Pickled, that needs no
Python global at all, so both readers refuse every global: a pickle that would build an
object or call a function (the only ways a pickle runs code) stops at its first global,
before anything is called. Nothing is allow-listed because nothing needs to be.

- :func:`read_snapshot` (what ``summarize`` and ``plot`` use) streams the pickle through
  :class:`~profkit.memory.pickle_stream.PlainStream` and keeps the allocator trace as
  compact columns (:class:`~profkit.memory.trace_columns.SnapshotColumns`): memory grows
  by ~60 bytes a trace entry instead of ~800 (docs/MEMORY.md, "Large snapshots").
- :func:`load_snapshot` loads the whole snapshot as Python objects (C unpickler with
  every global refused), for what needs all of it and for small files.

Both check the snapshot's structure the same way (``checks``) and say what is wrong in
the same one line. Snapshots are written with pickle protocol 4: pytorch.org/memory_viz's
own unpickler does not read protocol 5.
"""

from __future__ import annotations

import io
import lzma
import pickle
import zlib
from pathlib import Path
from typing import IO, Any

from profkit.errors import BadInput
from profkit.files import open_input, reading
from profkit.memory import checks
from profkit.memory.checks import MAX_ADDRESS, MAX_BYTES, MAX_DEVICES, MAX_TIME_US
from profkit.memory.pickle_stream import PlainStream, RefusedGlobal
from profkit.memory.trace_columns import EntrySink, SnapshotColumns, trace_columns
from profkit.memory.trace_fast import FastRuns

WHAT = "a CUDA memory snapshot"
_PICKLE_PROTO = 0x80  # protocol 2+ pickles open with PROTO
# What a protocol 0 or 1 pickle of plain data opens with: MARK, EMPTY_DICT/LIST/TUPLE,
# DICT/LIST, INT, LONG, FLOAT, STRING, UNICODE, NONE, True/False, BININT..., GLOBAL.
_PROTOCOL_0_STARTS = {bytes([c]) for c in b"(}])dlILFSVNIJKMGTUXcq"}
__all__ = [
    "MAX_ADDRESS",
    "MAX_BYTES",
    "MAX_DEVICES",
    "MAX_TIME_US",
    "RefusedGlobal",
    "load_snapshot",
    "normalize",
    "read_snapshot",
    "snapshot_columns",
]


class PlainUnpickler(pickle.Unpickler):
    """An unpickler for plain data: every global is refused, so no code can run."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedGlobal(f"{module}.{name}")


def loads_plain(data: bytes) -> Any:
    """Unpickle ``data`` as plain data (see :class:`PlainUnpickler`)."""
    return PlainUnpickler(io.BytesIO(data)).load()


def load_snapshot(path: Path) -> dict[str, Any]:
    """Load a CUDA memory snapshot (``.pickle``, optionally ``.xz``/``.gz``) as plain data.

    Raises :class:`BadInput` with one line for anything that is not a snapshot: not a
    regular file, not a pickle, a truncated or corrupt one, a pickle of something else or
    of a snapshot with the wrong structure (see :func:`normalize`), or one that tries to
    build Python objects (refused before anything runs).
    """
    path = Path(path)
    data = _unpickle(path, lambda stream: PlainUnpickler(stream).load())
    return normalize(data, path)


def read_snapshot(path: Path, fast: bool = True) -> SnapshotColumns:
    """Read a snapshot like :func:`load_snapshot`, keeping its traces as columns only.

    Same checks, same one-line errors; memory grows with the trace entries' columns, not
    with the pickle. ``fast=False`` leaves every entry to the opcode-by-opcode reader
    (``trace_fast`` takes runs of them otherwise: same result, a few times faster). A snapshot whose trace entries turn up anywhere but in
    ``device_traces`` (torch never writes one) is read whole instead.
    """
    path = Path(path)
    sink = EntrySink()

    def stream_load(stream: IO[bytes]) -> Any:
        reader = PlainStream(stream, sink)
        sink.stream = reader
        if fast:
            sink.runs = FastRuns(reader, sink)
        return reader.load()

    data = _unpickle(path, stream_load)
    sink.stream = sink.runs = None  # the reader and its memo can go
    legacy = isinstance(data, list)
    data = _snapshot_dict(data, path)
    traces = data["device_traces"]  # checked by _columns: here only looked through
    taken = {id(t) for t in traces if isinstance(t, list)} if isinstance(traces, list) else set()
    if any(key not in taken for key in sink.builders):
        return snapshot_columns(load_snapshot(path))
    columns = _columns(data, sink, path)
    columns.legacy = legacy
    return columns


def snapshot_columns(data: dict[str, Any]) -> SnapshotColumns:
    """The columns of a snapshot loaded whole (see :func:`load_snapshot`)."""
    return _columns(data, EntrySink(), "snapshot")


def _unpickle(path: Path, load: Any) -> Any:
    """``load(stream)`` on the opened file, every failure turned into one line."""
    with open_input(path, WHAT) as stream, reading(path):
        head = stream.read(16)
        if not head:
            raise BadInput(f"{path} is empty (0 bytes), not {WHAT}")
        if head.startswith(b"SQLite format 3\0"):  # its "S" would pass for protocol 0's STRING
            raise BadInput(
                f"{path} is an SQLite database (an nsys export or results DB), not {WHAT}"
            )
        first = head[:1]
        stream.seek(0)  # compressed streams rewind cheaply from their start
        try:
            return load(stream)
        except RefusedGlobal as exc:
            raise BadInput(
                f"{path}: refused to load: the pickle asks for the Python object {exc}; "
                "a memory snapshot is plain data, so nothing was loaded or run"
            ) from None
        except (OSError, EOFError, lzma.LZMAError, zlib.error):
            raise  # the stream itself is broken: ``reading`` says so
        except Exception as exc:  # any malformed opcode stream
            if first[0] != _PICKLE_PROTO and first not in _PROTOCOL_0_STARTS:
                raise BadInput(f"{path} is not a pickle (expected {WHAT} .pickle)") from None
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BadInput(f"{path}: truncated or corrupt pickle ({detail})") from None


def _snapshot_dict(data: Any, path: Path | str) -> dict[str, Any]:
    """The snapshot dict (a legacy bare list of segments becomes one), or BadInput."""
    if isinstance(data, list) and all(isinstance(s, dict) and "blocks" in s for s in data):
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data:
        kind = type(data).__name__
        raise BadInput(f"{path} holds a pickled {kind}, not {WHAT}")
    data.setdefault("device_traces", [])
    return data


def _columns(data: dict[str, Any], sink: EntrySink, path: Path | str) -> SnapshotColumns:
    """Check ``data`` (segments, then each trace in order) and build its columns."""
    try:
        _normalize_segments(data)
        checks.check_list(data["device_traces"], "device_traces")
        traces = []
        for device, trace in enumerate(data["device_traces"]):
            checks.check_list(trace, f"device_traces[{device}]")
            traces.append(trace_columns(sink, trace, device))
    except checks.Malformed as exc:
        raise BadInput(f"{path}: not a usable CUDA memory snapshot ({exc})") from None
    settings = data.get("allocator_settings")
    return SnapshotColumns(
        segments=data["segments"],
        traces=traces,
        actions=sink.actions,
        sites=sink.sites.frames,
        allocator_settings=settings if isinstance(settings, dict) else {},
    )


def normalize(data: Any, path: Path | str = "snapshot") -> dict[str, Any]:
    """Check that ``data`` has a snapshot's structure; fill what older torch versions omit.

    The one schema check of a snapshot, so that nothing downstream meets a surprise:
    segments with an ``address``, a ``total_size`` and ``blocks`` (each with a ``size`` and
    a ``state``); trace entries with an ``action`` and, where they need them, an ``addr``
    and a ``size``; frames as ``{filename, line, name}``; sizes and addresses whole numbers
    in range, times finite. Raises :class:`BadInput` naming the first entry that is not.
    Accepts the legacy form (a bare list of segments); adds ``address`` to blocks that lack
    it (blocks tile their segment in order) and ``requested_size`` where missing.
    """
    data = _snapshot_dict(data, path)
    try:
        _normalize_segments(data)
        checks.check_list(data["device_traces"], "device_traces")
        for device, trace in enumerate(data["device_traces"]):
            checks.check_list(trace, f"device_traces[{device}]")
            for index, entry in enumerate(trace):
                where = f"device_traces[{device}][{index}]"
                checks.check_entry_fields(entry, where)
                checks.check_frames(entry.get("frames", []), f"{where}.frames")
    except checks.Malformed as exc:
        raise BadInput(f"{path}: not a usable CUDA memory snapshot ({exc})") from None
    return data


def _normalize_segments(data: dict[str, Any]) -> None:
    checks.check_list(data["segments"], "segments")
    for index, segment in enumerate(data["segments"]):
        checks.normalize_segment(segment, f"segments[{index}]")
