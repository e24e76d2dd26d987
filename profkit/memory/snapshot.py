"""Reading and writing CUDA memory snapshots, as plain data only.

A snapshot (``torch.cuda.memory._snapshot()``) is a dict of lists, dicts, strings,
numbers, booleans, ``None`` and tuples (``segment_pool_id``). Pickled, that needs no
Python global at all, so :func:`load_snapshot` uses an unpickler whose ``find_class``
refuses every global: a pickle that would build an object or call a function (the only
ways a pickle runs code) stops at its first global, before anything is called. Nothing
is allow-listed because nothing needs to be.

Snapshots are written with pickle protocol 4: pytorch.org/memory_viz's own unpickler
does not read protocol 5.
"""

from __future__ import annotations

import io
import lzma
import math
import pickle
import zlib
from pathlib import Path
from typing import Any

from profkit.errors import BadInput
from profkit.files import open_input, reading

WHAT = "a CUDA memory snapshot"
_PICKLE_PROTO = 0x80  # protocol 2+ pickles open with PROTO
# What a protocol 0 or 1 pickle of plain data opens with: MARK, EMPTY_DICT/LIST/TUPLE,
# DICT/LIST, INT, LONG, FLOAT, STRING, UNICODE, NONE, True/False, BININT..., GLOBAL.
_PROTOCOL_0_STARTS = {bytes([c]) for c in b"(}])dlILFSVNIJKMGTUXcq"}
# Bounds of a snapshot's numbers: far above any device, far below int64 sums overflowing.
MAX_BYTES = 1 << 50  # 1 PiB in one block or segment
MAX_ADDRESS = 1 << 64
MAX_DEVICES = 1 << 16
MAX_TIME_US = 1 << 62


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle referenced a Python global (a class or a function)."""


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
    with open_input(path, WHAT) as stream, reading(path):
        first = stream.read(1)
        if not first:
            raise BadInput(f"{path} is empty (0 bytes), not {WHAT}")
        stream.seek(0)  # compressed streams rewind cheaply from their start
        try:
            data = PlainUnpickler(stream).load()
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
    return normalize(data, path)


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
    if isinstance(data, list) and all(isinstance(s, dict) and "blocks" in s for s in data):
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data:
        kind = type(data).__name__
        raise BadInput(f"{path} holds a pickled {kind}, not {WHAT}")
    data.setdefault("device_traces", [])
    try:
        _check_list(data["segments"], "segments")
        for index, segment in enumerate(data["segments"]):
            _normalize_segment(segment, f"segments[{index}]")
        _check_list(data["device_traces"], "device_traces")
        for device, trace in enumerate(data["device_traces"]):
            _check_list(trace, f"device_traces[{device}]")
            for index, entry in enumerate(trace):
                _check_entry(entry, f"device_traces[{device}][{index}]")
    except _Malformed as exc:
        raise BadInput(f"{path}: not a usable CUDA memory snapshot ({exc})") from None
    return data


class _Malformed(ValueError):
    """Names the first entry of a snapshot that does not have the expected structure."""


def _normalize_segment(segment: Any, where: str) -> None:
    _check_dict(segment, where)
    address = _whole(_field(segment, "address", where), f"{where}.address", MAX_ADDRESS)
    _whole(_field(segment, "total_size", where), f"{where}.total_size", MAX_BYTES)
    if "device" in segment:
        _whole(segment["device"], f"{where}.device", MAX_DEVICES)
    _check_list(_field(segment, "blocks", where), f"{where}.blocks")
    for index, block in enumerate(segment["blocks"]):
        at = f"{where}.blocks[{index}]"
        _check_dict(block, at)
        size = _whole(_field(block, "size", at), f"{at}.size", MAX_BYTES)
        if not isinstance(_field(block, "state", at), str):
            raise _Malformed(f"{at}.state is {_show(block['state'])}, not text")
        block.setdefault("address", address)
        block.setdefault("requested_size", size)
        _whole(block["address"], f"{at}.address", MAX_ADDRESS)
        _whole(block["requested_size"], f"{at}.requested_size", MAX_BYTES)
        _check_frames(block.get("frames", []), f"{at}.frames")
        address += size


def _check_entry(entry: Any, where: str) -> None:
    _check_dict(entry, where)
    action = _field(entry, "action", where)
    if not isinstance(action, str):
        raise _Malformed(f"{where}.action is {_show(action)}, not text")
    if action not in ("oom", "snapshot"):  # every other action names a block or segment
        _whole(_field(entry, "addr", where), f"{where}.addr", MAX_ADDRESS)
        _whole(_field(entry, "size", where), f"{where}.size", MAX_BYTES)
    for key in ("size", "device_free"):  # an OOM's are optional, but numbers if there
        if action == "oom" and entry.get(key) is not None:
            _whole(entry[key], f"{where}.{key}", MAX_BYTES)
    time_us = entry.get("time_us")
    if time_us is not None and not (
        type(time_us) in (int, float) and math.isfinite(time_us) and abs(time_us) < MAX_TIME_US
    ):
        raise _Malformed(f"{where}.time_us is {_show(time_us)}, not a time in microseconds")
    _check_frames(entry.get("frames", []), f"{where}.frames")


def _check_frames(frames: Any, where: str) -> None:
    _check_list(frames, where)
    for index, frame in enumerate(frames):
        if not (
            type(frame) is dict
            and isinstance(frame.get("filename", ""), str)
            and isinstance(frame.get("name", ""), str)
            and type(frame.get("line", 0)) is int
        ):
            raise _Malformed(f"{where}[{index}] is {_show(frame)}, not a frame")


def _field(mapping: dict[str, Any], key: str, where: str) -> Any:
    if key not in mapping:
        raise _Malformed(f"{where} has no {key!r}")
    return mapping[key]


def _whole(value: Any, where: str, limit: int) -> int:
    """``value`` as an int in ``[0, limit)`` (an integral float is fine), else _Malformed."""
    if type(value) is int and 0 <= value < limit:
        return value
    if type(value) is float and math.isfinite(value) and value.is_integer() and 0 <= value < limit:
        return int(value)
    raise _Malformed(f"{where} is {_show(value)}, not a whole number below {limit:,}")


def _check_list(value: Any, where: str) -> None:
    if not isinstance(value, list):
        raise _Malformed(f"{where} is {_show(value)}, not a list")


def _check_dict(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise _Malformed(f"{where} is {_show(value)}, not a dict")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
