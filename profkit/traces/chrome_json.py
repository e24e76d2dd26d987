"""A Chrome trace's events in batches, parsed a few MiB at a time instead of all at once.

A torch.profiler trace is one JSON object whose ``traceEvents`` array holds nearly all of
it; parsed whole, every event is a Python dict at once (about 8x the file in memory).
:class:`EventBatches` reads the document as a stream instead and cuts the array's raw
bytes after an event every :data:`CHUNK_BYTES`; each batch is parsed alone, by the same
parser (orjson) that would parse the whole document, so every value is what a
whole-document parse gives, and only one batch of dicts is alive at a time.

Why a cut is safe: a cut is tried where ``}`` then ``,`` then ``{"`` follow each other
(whitespace allowed), and the batch from the previous cut is parsed as ``[`` + bytes
+ ``]``. Batches start at a true element boundary (the array's start, then each accepted
cut), and JSON parses deterministically, so that text is a valid array only when the cut
ends an element of ``traceEvents`` itself: a cut inside a string or inside an object
nested in an event leaves a string or a container open and fails to parse. A failed
cut is retried at the candidate before it (:data:`MAX_CUT_TRIES` times).

The header: the keys before the array are parsed from the bytes before
``"traceEvents": [`` closed with ``}`` (valid only when the key is at the top level);
the keys after it (Kineto writes ``traceName`` there, some writers ``profkit`` and
``deviceProperties``) come with the last events, parsed as ``{"traceEvents":[`` + the
rest of the document. A document this cannot follow raises :class:`NotStreamable`
before or while it streams, and the caller reads it whole: one that does not start
with ``{`` (a top-level array of events, an empty file), lacks a top-level
``"traceEvents": [`` in its first :data:`HEADER_LIMIT_BYTES`, has more after the array
than the last chunk holds, repeats the key, or is invalid JSON before its last chunk
(the whole-document parse then says where). Invalid JSON in the last part (a
truncated trace) raises :class:`BrokenJSON` at once, with its byte offset.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import IO, Any

__all__ = ["CHUNK_BYTES", "BrokenJSON", "EventBatches", "NotStreamable"]

CHUNK_BYTES = 4 << 20  # per read: ~16k Kineto events, ~30 MiB of dicts once parsed
HEADER_LIMIT_BYTES = 64 << 20  # the keys before traceEvents are small (device properties)
MAX_CUT_TRIES = 4
_WS = rb"[ \t\r\n]*"  # JSON's whitespace, exactly
_ARRAY_KEY = re.compile(rb'"traceEvents"' + _WS + rb":" + _WS + rb"\[")
_CUT = re.compile(rb"\}" + _WS + rb"(,)" + _WS + rb"\{" + _WS + rb'"')
_TAIL_OPEN = b'{"traceEvents":['
_SEARCH_WINDOW = 64 << 10


class NotStreamable(Exception):
    """The document is not laid out as the splitter can follow: read it whole."""


class BrokenJSON(ValueError):
    """The document's last part is not valid JSON; ``detail`` says what and where."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class EventBatches:
    """Iterate over ``stream``'s ``traceEvents`` as lists of parsed events.

    ``header`` holds the document's other top-level keys once the iteration has ended
    (those before the array as soon as the first batch comes). ``loads`` parses bytes
    (orjson's or json's); ``decode_errors`` are the exceptions it raises for bad JSON.
    ``on_read()`` is called after every read of ``stream`` (a reader reports progress there).
    """

    def __init__(
        self,
        stream: IO[bytes],
        loads: Callable[[bytes], Any],
        decode_errors: tuple[type[Exception], ...],
        chunk_bytes: int = CHUNK_BYTES,
        on_read: Callable[[], None] | None = None,
    ) -> None:
        self._stream = stream
        self._loads = loads
        self._errors = decode_errors
        self._chunk_bytes = chunk_bytes
        self._on_read = on_read
        self._offset = 0  # where the buffer starts in the (decompressed) document
        self.header: dict[str, Any] = {}

    def __iter__(self) -> Iterator[list[Any]]:
        buffer = self._open()
        while chunk := self._read():
            buffer += chunk
            batch, start = self._batch(buffer)
            if batch:
                yield batch
            self._offset += start
            buffer = buffer[start:]
        yield self._tail(buffer)

    def _open(self) -> bytes:
        """Read up to the array's ``[``; keep the keys before it in ``header``."""
        buffer = b""
        while True:
            chunk = self._read()
            if not chunk:
                raise NotStreamable("no top-level traceEvents array")
            searched_to = max(len(buffer) - 64, 0)  # the key may straddle two reads
            buffer += chunk
            found = _ARRAY_KEY.search(buffer, searched_to)
            if found or len(buffer) > HEADER_LIMIT_BYTES:
                break
        if not found or buffer.lstrip(b" \t\r\n")[:1] != b"{":
            raise NotStreamable("no traceEvents array at the start of a JSON object")
        head = buffer[: found.start()].rstrip(b" \t\r\n")
        head = head[:-1] if head.endswith(b",") else head
        try:  # valid only when the key is a member of the top-level object
            header = self._loads(head + b"}")
        except self._errors:
            raise NotStreamable("traceEvents is not a top-level key") from None
        if not isinstance(header, dict):
            raise NotStreamable("not a JSON object")
        header.pop("traceEvents", None)  # an earlier non-array value: the array wins
        self.header = header
        self._offset = found.end()
        return buffer[found.end() :]

    def _read(self) -> bytes:
        chunk = self._stream.read(self._chunk_bytes)
        if self._on_read is not None:
            self._on_read()
        return chunk

    def _batch(self, buffer: bytes) -> tuple[list[Any], int]:
        """The events before the last cut that parses, and where the rest starts."""
        end = len(buffer)
        for _ in range(MAX_CUT_TRIES):
            cut = _last_cut(buffer, end)
            if cut is None:
                return [], 0  # no whole event yet: read more
            close, comma = cut
            try:
                return self._loads(b"[" + buffer[: close + 1] + b"]"), comma + 1
            except self._errors:
                end = close  # inside a string or a nested object: try the cut before it
        raise NotStreamable("no event boundary that parses")

    def _tail(self, rest: bytes) -> list[Any]:
        """The last events, and the keys after the array into ``header``."""
        if b'"traceEvents"' in rest:
            raise NotStreamable("traceEvents given twice")  # the last one wins: read whole
        try:
            doc = self._loads(_TAIL_OPEN + rest)
        except self._errors as exc:
            raise BrokenJSON(self._where(exc, len(_TAIL_OPEN))) from None
        events: list[Any] = doc.pop("traceEvents")
        self.header.update(doc)  # later keys win, as in a whole-document parse
        return events

    def _where(self, exc: Exception, prefix_bytes: int) -> str:
        message = getattr(exc, "msg", None) or str(exc).splitlines()[0]
        pos = getattr(exc, "pos", None)
        if not isinstance(pos, int):
            return str(message)
        return f"{message} (near byte {self._offset + pos - prefix_bytes:,} of the JSON)"


def _last_cut(buffer: bytes, end: int) -> tuple[int, int] | None:
    """The last candidate cut ending before ``end``: (its ``}``, its ``,``), or None."""
    window = _SEARCH_WINDOW
    while True:
        low = max(end - window, 0)
        last = None
        for last in _CUT.finditer(buffer, low, end):  # noqa: B007 - the last one is wanted
            pass
        if last is not None:
            return last.start(), last.start(1)
        if low == 0:
            return None
        window *= 4
