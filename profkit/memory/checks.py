"""The one schema check of a CUDA memory snapshot's parts, shared by both readers.

Each check raises :class:`Malformed` naming the first part that is not what a snapshot
holds (``segments[0].blocks[3] has no 'state'``); the readers turn it into one line.
"""

from __future__ import annotations

import math
from typing import Any

# Bounds of a snapshot's numbers: far above any device, far below int64 sums overflowing.
MAX_BYTES = 1 << 50  # 1 PiB in one block or segment
MAX_ADDRESS = 1 << 64
MAX_DEVICES = 1 << 16
MAX_TIME_US = 1 << 62
# Trace actions that name no block or segment (so have no ``addr``/``size`` to check).
NO_BLOCK_ACTIONS = ("oom", "snapshot")


class Malformed(ValueError):
    """Names the first entry of a snapshot that does not have the expected structure."""


def normalize_segment(segment: Any, where: str) -> None:
    """Check one segment and its blocks; give blocks the ``address`` and ``requested_size``
    older torch versions omit (blocks tile their segment in order)."""
    check_dict(segment, where)
    address = whole(field(segment, "address", where), f"{where}.address", MAX_ADDRESS)
    whole(field(segment, "total_size", where), f"{where}.total_size", MAX_BYTES)
    if "device" in segment:
        whole(segment["device"], f"{where}.device", MAX_DEVICES)
    check_list(field(segment, "blocks", where), f"{where}.blocks")
    for index, block in enumerate(segment["blocks"]):
        at = f"{where}.blocks[{index}]"
        check_dict(block, at)
        size = whole(field(block, "size", at), f"{at}.size", MAX_BYTES)
        if not isinstance(field(block, "state", at), str):
            raise Malformed(f"{at}.state is {show(block['state'])}, not text")
        block.setdefault("address", address)
        block.setdefault("requested_size", size)
        whole(block["address"], f"{at}.address", MAX_ADDRESS)
        whole(block["requested_size"], f"{at}.requested_size", MAX_BYTES)
        check_frames(block.get("frames", []), f"{at}.frames")
        address += size


def check_entry_fields(entry: Any, where: str) -> tuple[str, int, int, int | None]:
    """Check a trace entry but its frames; return ``(action, addr, size, time_us)``.

    ``addr`` and ``size`` are 0 for an action that names no block; ``time_us`` is None
    when the entry has none.
    """
    check_dict(entry, where)
    action = field(entry, "action", where)
    if not isinstance(action, str):
        raise Malformed(f"{where}.action is {show(action)}, not text")
    addr = size = 0
    if action not in NO_BLOCK_ACTIONS:  # every other action names a block or segment
        addr = whole(field(entry, "addr", where), f"{where}.addr", MAX_ADDRESS)
        size = whole(field(entry, "size", where), f"{where}.size", MAX_BYTES)
    for key in ("size", "device_free"):  # an OOM's are optional, but numbers if there
        if action == "oom" and entry.get(key) is not None:
            whole(entry[key], f"{where}.{key}", MAX_BYTES)
    time_us = entry.get("time_us")
    if time_us is not None and not (
        type(time_us) in (int, float) and math.isfinite(time_us) and abs(time_us) < MAX_TIME_US
    ):
        raise Malformed(f"{where}.time_us is {show(time_us)}, not a time in microseconds")
    return action, addr, size, None if time_us is None else int(time_us)


def check_frames(frames: Any, where: str) -> None:
    check_list(frames, where)
    for index, frame in enumerate(frames):
        if not (
            type(frame) is dict
            and isinstance(frame.get("filename", ""), str)
            and isinstance(frame.get("name", ""), str)
            and type(frame.get("line", 0)) is int
        ):
            raise Malformed(f"{where}[{index}] is {show(frame)}, not a frame")


def field(mapping: dict[str, Any], key: str, where: str) -> Any:
    if key not in mapping:
        raise Malformed(f"{where} has no {key!r}")
    return mapping[key]


def whole(value: Any, where: str, limit: int) -> int:
    """``value`` as an int in ``[0, limit)`` (an integral float is fine), else Malformed."""
    if type(value) is int and 0 <= value < limit:
        return value
    if type(value) is float and math.isfinite(value) and value.is_integer() and 0 <= value < limit:
        return int(value)
    raise Malformed(f"{where} is {show(value)}, not a whole number below {limit:,}")


def check_list(value: Any, where: str) -> None:
    if not isinstance(value, list):
        raise Malformed(f"{where} is {show(value)}, not a list")


def check_dict(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise Malformed(f"{where} is {show(value)}, not a dict")


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
