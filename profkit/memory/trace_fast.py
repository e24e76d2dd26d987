"""Runs of trace entries decoded a few hundred at a time, at the speed of ``re``.

After its first few entries, a trace in a protocol 4 pickle is the same few opcodes over
and over: ``EMPTY_DICT MEMOIZE MARK``, then for each key a memo reference (the key
strings were memoized by the first entry) and a value (a memo reference, a number, a new
short string, or the stack: a new list of memo references to frame dicts), then
``SETITEMS``; every thousand entries ``APPENDS MARK``. :data:`ENTRY` matches one such entry
and :func:`take_run` splits a window of the pickle with it, so that each field of a few
hundred entries comes out as one list of opcode bytes, decoded column-wise: numbers by
one C unpickling of their opcodes, keys, actions and stacks by dict look-ups of their
bytes. What :data:`ENTRY` does not match (a new frame dict, an OOM entry, another shape)
is left to :class:`~profkit.memory.pickle_stream.PlainStream`, and so is a whole run with
anything unusual in it (a float, a bad number, a shared entry): the columns and the memo
come out exactly as if every entry had gone through ``TraceBuilder.add``, and so does the
first error.
"""

from __future__ import annotations

import pickle
import re
from itertools import chain, repeat
from typing import Any

import numpy as np

from profkit.memory import checks
from profkit.memory.pickle_stream import RETIRED, PlainStream
from profkit.memory.trace_columns import NO_SITE, EntrySink, TraceBuilder

_F = rb"(?:\x95.{8})?"  # FRAME: framing may cut between any two objects
_REF = rb"h.|j...."
_INT = rb"K.|M..|J....|\x8a(?:" + b"|".join(bytes([n]) + b"." * n for n in range(10)) + rb")"
_PLAIN = _REF + b"|" + _INT + rb"|\x88|\x89|N|G.{8}"
# New short strings (up to 63 bytes; longer ones go through PlainStream), memoized.
_STR = rb"\x8c(?:" + b"|".join(re.escape(bytes([n])) + b"." * n for n in range(64)) + rb")\x94"
_LIST = (
    rb"\]\x94(?:\((?:" + _F + rb"(?:h.|j....))+" + _F + rb"e|" + _F + rb"(?:h.|j....)" + _F + b"a)?"
)
_PAIR = _F + b"(" + _REF + b")" + _F + b"(?:(" + _PLAIN + b")|(" + _STR + b"|" + _LIST + b"))"
_REFS = re.compile(rb"\x95.{8}|h(.)|j(....)", re.DOTALL)
WINDOW_BYTES = (4 << 10, 256 << 10)  # a run's window grows from the first to the second
_WHAT_DECODES = (pickle.UnpicklingError, ValueError, OverflowError, IndexError, TypeError)


def entry_pattern(pairs: int) -> re.Pattern[bytes]:
    """One trace entry of ``pairs`` keys (with an ``APPENDS MARK`` before it, if any)."""
    return re.compile(rb"((?:e\()?" + _F + rb"\}\x94\(" + _PAIR * pairs + _F + b"u)", re.DOTALL)


class _Anomaly(Exception):
    """Something in the run that only PlainStream and TraceBuilder.add decide exactly."""


class FastRuns:
    """Takes runs of trace entries for a :class:`PlainStream` (see the module docstring)."""

    def __init__(self, reader: PlainStream, sink: EntrySink) -> None:
        self.reader, self.sink = reader, sink
        self.pairs = self.stride = 0
        self.pattern: re.Pattern[bytes] | None = None  # once the first entry gave its shape
        self.window = WINDOW_BYTES[0]
        self.blocked_until = -1  # stream offset before which runs are left to PlainStream
        self.misses = 0  # windows in a row whose first entry did not match
        self.disabled = False
        self._names: dict[bytes, Any] = {}  # opcode bytes of a key or an action -> the string
        self._sites: dict[bytes, int] = {}  # opcode bytes of a stack -> its site
        self._strings: dict[bytes, str] = {}

    def take_run(self, builder: TraceBuilder) -> None:
        """Take the entries at the reader's position, as many as match, a window at a time."""
        reader = self.reader
        if self.pattern is None and self.sink.pairs:
            self.pairs, self.stride = self.sink.pairs, 2 + 3 * self.sink.pairs
            self.pattern = entry_pattern(self.pairs)
        if self.pattern is None or reader.memo_far or reader.memo_rewritten:
            return
        if reader.buf[reader.pos + 1] != 0x94:  # no MEMOIZE after the dict: protocol 0-3
            self.disabled = True  # its pickler memoizes every entry the same way
            return
        while self._offset() >= self.blocked_until:
            if reader.end - reader.pos < self.window and not reader.eof:
                reader._refill(self.window)
            parts = self.pattern.split(
                reader.buf[reader.pos : min(reader.pos + self.window, reader.end)]
            )
            matched = len(parts) // self.stride
            taken = next((i for i in range(matched) if parts[i * self.stride]), matched)
            if taken == 0:  # leave the next bytes to PlainStream, more of them each miss in a row
                self.misses += 1
                self.blocked_until = self._offset() + (WINDOW_BYTES[0] << min(self.misses, 8))
                break
            self.misses = 0
            size = sum(map(len, parts[1 : taken * self.stride : self.stride]))
            memo_length = len(reader.memo)
            try:
                self._decode(parts, taken, builder)
            except _Anomaly:
                del reader.memo[memo_length:]  # PlainStream reads the run again
                self.blocked_until = self._offset() + size
                break
            reader.pos += size
            if taken < matched:  # an entry of another shape: PlainStream reads it
                break
            self.window = min(self.window * 2, WINDOW_BYTES[1])
        self.window = WINDOW_BYTES[0]

    def _offset(self) -> int:
        return self.reader.bytes_read - self.reader.end + self.reader.pos

    def _decode(self, parts: list[Any], k: int, builder: TraceBuilder) -> None:
        stride, end = self.stride, k * self.stride
        keys = [self._key(parts[2 + 3 * j : end : stride]) for j in range(self.pairs)]
        if len(set(keys)) != self.pairs or not {"action", "addr", "size"} <= set(keys):
            raise _Anomaly
        plain = {name: parts[3 + 3 * j : end : stride] for j, name in enumerate(keys)}
        puts = {name: parts[4 + 3 * j : end : stride] for j, name in enumerate(keys)}
        # The run's new values first: later entries may refer to what earlier ones memoized.
        self._memoize([self._put_values(puts[name], name == "frames") for name in keys], k)
        actions = self._actions(plain["action"], puts["action"])
        addr = self._numbers(plain["addr"], puts["addr"], checks.MAX_ADDRESS)
        size = self._numbers(plain["size"], puts["size"], checks.MAX_BYTES)
        times = None
        if "time_us" in puts:
            times = self._numbers(plain["time_us"], puts["time_us"], checks.MAX_TIME_US)
        sites = self._frames(plain.get("frames"), puts.get("frames"), k)
        builder.extend(actions, addr, size, times, sites, k)

    def _key(self, column: list[bytes]) -> str:
        if column.count(column[0]) != len(column):
            raise _Anomaly
        name = self._name(column[0])
        if type(name) is not str:
            raise _Anomaly
        return name

    def _name(self, opcodes: bytes) -> Any:
        """The object a memo reference (or a new string) stands for; anything else (a
        number where a name should be) is left to the exact path."""
        name = self._names.get(opcodes)
        if name is None:
            kind = opcodes[0]
            if kind == 0x8C:
                name = self._string(opcodes)
            elif kind == 0x68:  # BINGET
                name = self._memo(opcodes[1])
            elif kind == 0x6A:  # LONG_BINGET
                name = self._memo(int.from_bytes(opcodes[1:], "little"))
            else:
                raise _Anomaly
            self._names[opcodes] = name
        return name

    def _memo(self, index: int) -> Any:
        memo = self.reader.memo
        if index >= len(memo):
            raise _Anomaly  # PlainStream says it: "memo value not found"
        return memo[index]

    def _string(self, opcodes: bytes) -> str:
        text = self._strings.get(opcodes)
        if text is None:
            text = self._strings[opcodes] = str(opcodes[2:-1], "utf-8", "surrogatepass")
        return text

    def _actions(self, plain: list[Any], puts: list[Any]) -> np.ndarray:
        opcodes = (
            plain
            if puts.count(None) == len(puts)
            else [p or u for p, u in zip(plain, puts, strict=True)]
        )
        names = [self._name(o) for o in set(opcodes)]
        if any(type(n) is not str or n in checks.NO_BLOCK_ACTIONS for n in names):
            raise _Anomaly  # an OOM keeps all its fields: TraceBuilder.add does that
        codes = {o: self.sink.code_of(self._name(o)) for o in set(opcodes)}
        return np.array([codes[o] for o in opcodes], dtype=np.uint16)

    def _numbers(self, plain: list[Any], puts: list[Any], limit: int) -> np.ndarray:
        """Whole numbers in [0, limit), by one C unpickling of their opcodes (numbers only)."""
        if puts.count(None) != len(puts):
            raise _Anomaly
        try:  # the opcodes are numbers, None, booleans or memo references: no global
            values = pickle.loads(b"\x80\x04(" + b"".join(plain) + b"l.")
            array = np.array(values)
        except _WHAT_DECODES:
            raise _Anomaly from None  # memo references, or too big for 64 bits
        if set(map(type, values)) != {int} or array.dtype.kind not in "iu":
            raise _Anomaly  # floats, None, booleans: checked one by one
        if array.min() < 0 or array.max() >= limit:
            raise _Anomaly  # out of range: TraceBuilder.add names the entry
        return array

    def _frames(self, plain: list[Any] | None, puts: list[Any] | None, k: int) -> np.ndarray:
        if plain is None or puts is None:
            return np.full(k, NO_SITE, dtype=np.int32)
        opcodes = [p or u for p, u in zip(plain, puts, strict=True)]
        known = self._sites
        for o in set(opcodes).difference(known):
            known[o] = self._site(o)
        return np.array([known[o] for o in opcodes], dtype=np.int32)

    def _site(self, opcodes: bytes) -> int:
        if opcodes[0] == 0x5D:  # a new list of memo references
            indices = [self._index(m) for m in _REFS.finditer(opcodes, 2)]
            frames = [self._memo(i) for i in indices if i >= 0]
        elif opcodes[0] in (0x68, 0x6A):
            frames = self._name(opcodes)
        else:
            raise _Anomaly
        try:
            return self.sink.sites.site_of(frames, "frames")
        except checks.Malformed:
            raise _Anomaly from None

    @staticmethod
    def _index(match: re.Match[bytes]) -> Any:
        short, long = match.groups()
        if short is None and long is None:
            return -1  # a FRAME header
        return short[0] if short is not None else int.from_bytes(long, "little")

    def _put_values(self, column: list[Any], frames: bool) -> list[Any] | None:
        """What each entry memoizes for this key (None where it memoizes nothing)."""
        if column.count(None) == len(column):
            return None
        if frames:
            sites = self._sites
            for o in set(column).difference(sites):
                if o is not None:
                    sites[o] = self._site(o)
            return [None if o is None else self._canonical(sites[o]) for o in column]
        if any(o is not None and o[0] != 0x8C for o in column):
            raise _Anomaly  # a new list that is not a stack
        return [None if o is None else self._string(o) for o in column]

    def _canonical(self, site: int) -> list[Any]:
        return self.sink.sites.frames[site] if site != NO_SITE else _EMPTY

    def _memoize(self, columns: list[list[Any] | None], k: int) -> None:
        """Each entry's memo slots, in order: the entry (retired), then its new values."""
        memo = self.reader.memo
        present = [c for c in columns if c is not None]
        if all(None not in c for c in present):
            memo.extend(chain.from_iterable(zip(repeat(RETIRED, k), *present, strict=False)))
            return
        for values in zip(repeat(RETIRED, k), *present, strict=False):
            memo.extend(v for v in values if v is not None)


_EMPTY: list[Any] = []
