"""A streaming unpickler for plain data that never keeps a snapshot's trace entries.

:class:`PlainStream` reads a pickle of any protocol (0 to 5) from a byte stream in
chunks, like :class:`pickle.Unpickler` restricted to plain data (dicts, lists, tuples,
sets, strings, bytes, numbers, booleans, ``None``): every *global* is refused with
:class:`RefusedGlobal` before anything is looked up, so no code can run, and the opcodes
that build objects (``REDUCE``, ``BUILD``, ``OBJ``, ``NEWOBJ``...) can only meet plain
data, which they refuse as corrupt. Nothing is ever called.

What it adds: every time items are appended to a list, it first offers them to a *sink*
(:class:`ListSink`), which may take them instead (the trace entries of a CUDA memory
snapshot, turned into compact columns as they come, see ``trace_columns``). The memo
slots of what the sink took are handed back to it (:meth:`PlainStream.retire`), so the
memo does not keep the entries alive either. Memory then grows with what the sink keeps,
not with the pickle.

Written for speed on the opcodes a snapshot is made of (``LONG_BINGET``, ``BINGET``,
``MEMOIZE``, ``LONG1``, ``MARK``...); the rest go through :meth:`PlainStream._rare`.
"""

from __future__ import annotations

import codecs
import copyreg
import struct
from typing import IO, Any, Protocol

CHUNK_BYTES = 1 << 20
# Room for any opcode with a one-byte length (SHORT_BINUNICODE: 2 + 255 bytes) so that the
# hot loop needs no bounds check; longer arguments go through ``_need``.
_MARGIN = 300
_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U16 = struct.Struct("<H").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_F64 = struct.Struct(">d").unpack_from
_PAD = b"\xff" * _MARGIN  # not an opcode
HIGHEST_PROTOCOL = 5
TRUNCATED = "pickle data was truncated"


class RefusedGlobal(Exception):
    """The pickle referenced a Python global (a class or a function): ``module.name``."""


class CorruptPickle(ValueError):
    """The bytes are not a valid pickle of plain data (truncated, damaged, or not one)."""


class _Retired:
    """What the memo holds for an entry the sink took; a pickle that refers back to one
    (torch's never do) shows it by this name wherever the snapshot's checks meet it."""

    def __repr__(self) -> str:
        return "<a trace entry referenced twice>"


RETIRED = _Retired()


class ListSink(Protocol):
    """Takes the items appended to some lists instead of the lists themselves."""

    def extend(self, target: list[Any], items: list[Any]) -> bool:
        """Take ``items`` (appended to ``target``) and return True, or return False."""
        ...

    def take_run(self, target: list[Any]) -> None:
        """A dict begins among ``target``'s items (at ``stream.pos``): the sink may read on
        from there itself, moving ``stream.pos`` and clearing ``stream.stack``."""
        ...


class PlainStream:
    """One pickle read from ``stream`` as plain data (see the module docstring)."""

    def __init__(self, stream: IO[bytes], sink: ListSink | None = None) -> None:
        self.stream = stream
        self.sink = sink
        self.buf = b""
        self.pos = 0
        self.end = 0  # where the data in ``buf`` ends (padding follows at EOF)
        self.eof = False
        self.memo_rewritten = False  # a PUT overwrote a memo slot (never in protocol 4+)
        self.memo: list[Any] = []
        self.memo_far: dict[int, Any] = {}  # PUT indices beyond the end (protocols 0-3)
        self.slot_of: dict[int, int] = {}  # id of a memoized container -> its memo index
        self.stack: list[Any] = []
        self.meta: list[list[Any]] = []
        self.bytes_read = 0

    # -- buffer ---------------------------------------------------------------------------

    def _refill(self, needed: int = _MARGIN) -> None:
        """Keep the unread bytes and read on until ``needed`` bytes are there (or EOF).

        At EOF the buffer gets ``_MARGIN`` bytes of an invalid opcode after the data, so the
        hot loop still needs no bounds check: whatever runs into them fails, as truncated.
        """
        parts = [self.buf[self.pos : self.end]]
        have = len(parts[0])
        while have < max(needed, _MARGIN) and not self.eof:
            chunk = self.stream.read(max(CHUNK_BYTES, needed - have))
            if not chunk:
                self.eof = True
                break
            self.bytes_read += len(chunk)
            parts.append(chunk)
            have += len(chunk)
        self.end = have
        if self.eof:
            parts.append(_PAD)
        self.buf = b"".join(parts)
        self.pos = 0

    def _need(self, n: int) -> int:
        """Position of ``n`` readable bytes at the cursor (raises if the pickle ends first)."""
        if self.pos + n > self.end:
            self._refill(self.end - self.pos + n)
            if self.pos + n > self.end:
                raise CorruptPickle(TRUNCATED)
        return self.pos

    def _take(self, n: int) -> bytes:
        at = self._need(n)
        self.pos = at + n
        return self.buf[at : at + n]

    def _line(self) -> bytes:
        """A protocol 0 argument: the bytes up to the next newline (which is consumed)."""
        while True:
            end = self.buf.find(b"\n", self.pos, self.end)
            if end >= 0:
                line = self.buf[self.pos : end]
                self.pos = end + 1
                return line
            if self.eof:
                raise CorruptPickle(TRUNCATED)
            self._refill(self.end - self.pos + CHUNK_BYTES)

    # -- the memo -------------------------------------------------------------------------

    def _put(self, index: int, value: Any) -> None:
        memo = self.memo
        if index == len(memo):
            memo.append(value)
            while len(memo) in self.memo_far:
                memo.append(self.memo_far.pop(len(memo)))
        elif index < len(memo):
            memo[index] = value
            self.memo_rewritten = True
        else:
            self.memo_far[index] = value
        if type(value) is dict or type(value) is list:
            self.slot_of[id(value)] = index

    def _get(self, index: int) -> Any:
        if index < len(self.memo):
            return self.memo[index]
        if index in self.memo_far:
            return self.memo_far[index]
        raise CorruptPickle(f"memo value not found at index {index}")

    def retire(self, value: Any, replacement: Any) -> None:
        """The sink took ``value``: its memo slot (if it has one) holds ``replacement`` now."""
        index = self.slot_of.pop(id(value), None)
        if index is not None:
            if index < len(self.memo):
                self.memo[index] = replacement
            else:
                self.memo_far[index] = replacement

    # -- the stack ------------------------------------------------------------------------

    def _pop_mark(self) -> list[Any]:
        if not self.meta:
            raise CorruptPickle("could not find MARK")
        items = self.stack
        self.stack = self.meta.pop()
        return items

    def _extend(self, target: Any, items: list[Any]) -> None:
        if type(target) is not list:
            raise CorruptPickle(f"cannot append to {type(target).__name__}")
        if self.sink is None or not self.sink.extend(target, items):
            target.extend(items)

    def load(self) -> Any:
        """Read the pickle and return its object."""
        self._refill()
        try:
            return self._run()
        except (CorruptPickle, RefusedGlobal):
            if self.eof and self.pos > self.end:
                raise CorruptPickle(TRUNCATED) from None
            raise
        except (IndexError, KeyError, TypeError, ValueError, struct.error, OverflowError) as exc:
            if self.eof and self.pos > self.end:  # an argument ran into the padding
                raise CorruptPickle(TRUNCATED) from None
            raise CorruptPickle(f"{type(exc).__name__}: {exc}") from None

    def _run(self) -> Any:
        buf, pos, memo = self.buf, self.pos, self.memo
        stack = self.stack
        append = stack.append
        safe = len(buf) - _MARGIN
        frombytes = int.from_bytes
        slot_of = self.slot_of
        take_run = getattr(self.sink, "take_run", None)
        try:
            while True:
                if pos > safe:
                    if self.eof:
                        raise CorruptPickle(TRUNCATED)
                    self.pos = pos
                    self._refill()
                    buf, pos = self.buf, 0
                    safe = len(buf) - _MARGIN
                op = buf[pos]
                pos += 1
                if op == 0x6A:  # LONG_BINGET
                    index = _U32(buf, pos)[0]
                    pos += 4
                    append(memo[index] if index < len(memo) else self._get(index))
                elif op == 0x68:  # BINGET
                    index = buf[pos]
                    pos += 1
                    append(memo[index] if index < len(memo) else self._get(index))
                elif op == 0x94:  # MEMOIZE
                    top = stack[-1]
                    if type(top) is dict or type(top) is list:
                        slot_of[id(top)] = len(memo)
                    memo.append(top)
                elif op == 0x8A:  # LONG1
                    n = buf[pos]
                    append(frombytes(buf[pos + 1 : pos + 1 + n], "little", signed=True))
                    pos += 1 + n
                elif op == 0x28:  # MARK
                    self.meta.append(stack)
                    stack = []
                    append = stack.append
                elif op == 0x4B:  # BININT1
                    append(buf[pos])
                    pos += 1
                elif op == 0x7D:  # EMPTY_DICT
                    if take_run is not None and self.meta and self.meta[-1]:
                        below = self.meta[-1][-1]
                        if type(below) is list:  # an item of a list: perhaps a trace entry
                            self.pos, self.stack, self.buf = pos - 1, stack, buf
                            take_run(below)
                            if self.pos != pos - 1 or self.buf is not buf:
                                buf, pos, stack = self.buf, self.pos, self.stack
                                append = stack.append
                                safe = len(buf) - _MARGIN
                                continue
                    append({})
                elif op == 0x75:  # SETITEMS
                    self.stack = stack
                    items = self._pop_mark()
                    stack = self.stack
                    append = stack.append
                    target = stack[-1]
                    if type(target) is not dict or len(items) % 2:
                        raise CorruptPickle("SETITEMS needs a dict and pairs of items")
                    for i in range(0, len(items), 2):
                        target[items[i]] = items[i + 1]
                elif op == 0x8C:  # SHORT_BINUNICODE
                    n = buf[pos]
                    append(str(buf[pos + 1 : pos + 1 + n], "utf-8", "surrogatepass"))
                    pos += 1 + n
                elif op == 0x4A:  # BININT
                    append(_I32(buf, pos)[0])
                    pos += 4
                elif op == 0x5D:  # EMPTY_LIST
                    append([])
                elif op == 0x65:  # APPENDS
                    self.stack = stack
                    items = self._pop_mark()
                    stack = self.stack
                    append = stack.append
                    self._extend(stack[-1], items)
                elif op == 0x4D:  # BININT2
                    append(_U16(buf, pos)[0])
                    pos += 2
                elif op == 0x61:  # APPEND
                    value = stack.pop()
                    self._extend(stack[-1], [value])
                elif op == 0x2E:  # STOP
                    if not stack:
                        raise CorruptPickle("unpickling stack underflow")
                    return stack.pop()
                else:
                    self.pos, self.stack, self.buf = pos, stack, buf
                    self._rare(op)
                    buf, pos, stack = self.buf, self.pos, self.stack
                    append = stack.append
                    safe = len(buf) - _MARGIN
        except Exception:
            if buf is self.buf:  # where it failed, to tell truncation from damage
                self.pos = max(self.pos, pos)
            raise

    def _rare(self, op: int) -> None:
        if self.pos > self.end:
            raise CorruptPickle(TRUNCATED)
        handler = _RARE.get(op)
        if handler is None:
            raise CorruptPickle(f"invalid load key, {chr(op)!r}.")
        handler(self)


# -- the other opcodes, each reading its argument through _take/_line -----------------------


def _push(value: Any) -> Any:
    return lambda self: self.stack.append(value)


def _int_text(self: PlainStream) -> None:
    line = self._line()
    if line == b"01":
        self.stack.append(True)
    elif line == b"00":
        self.stack.append(False)
    else:
        self.stack.append(int(line))


def _string_text(self: PlainStream) -> None:
    line = self._line()
    if len(line) < 2 or line[0] != line[-1] or line[:1] not in (b"'", b'"'):
        raise CorruptPickle("the STRING opcode argument must be quoted")
    self.stack.append(codecs.escape_decode(line[1:-1])[0].decode("ascii"))


def _sized(length: Any, size: int, make: Any) -> Any:
    def handler(self: PlainStream) -> None:
        n = length(self._take(size), 0)[0]
        if n < 0:
            raise CorruptPickle("negative byte count")
        self.stack.append(make(self._take(n)))

    return handler


def _utf8(data: bytes) -> str:
    return str(data, "utf-8", "surrogatepass")


def _long_binary(data: bytes) -> int:
    return int.from_bytes(data, "little", signed=True)


def _u8(data: bytes, _: int) -> tuple[int]:
    return (data[0],)


def _mark_build(make: Any) -> Any:
    def handler(self: PlainStream) -> None:
        items = self._pop_mark()
        self.stack.append(make(items))

    return handler


def _dict_from(items: list[Any]) -> dict[Any, Any]:
    if len(items) % 2:
        raise CorruptPickle("odd number of items for DICT")
    return {items[i]: items[i + 1] for i in range(0, len(items), 2)}


def _tuple_n(n: int) -> Any:
    def handler(self: PlainStream) -> None:
        if len(self.stack) < n:
            raise CorruptPickle("unpickling stack underflow")
        items = tuple(self.stack[len(self.stack) - n :])
        del self.stack[len(self.stack) - n :]
        self.stack.append(items)

    return handler


def _setitem(self: PlainStream) -> None:
    value, key = self.stack.pop(), self.stack.pop()
    target = self.stack[-1]
    if type(target) is not dict:
        raise CorruptPickle("SETITEM needs a dict")
    target[key] = value


def _additems(self: PlainStream) -> None:
    items = self._pop_mark()
    target = self.stack[-1]
    if type(target) is not set:
        raise CorruptPickle("ADDITEMS needs a set")
    target.update(items)


def _pop(self: PlainStream) -> None:
    if self.stack:
        self.stack.pop()
    else:
        self._pop_mark()


def _put_with(argument: Any) -> Any:
    def handler(self: PlainStream) -> None:
        if not self.stack:
            raise CorruptPickle("unpickling stack underflow")
        index = argument(self)
        if index < 0:
            raise CorruptPickle("negative PUT argument")
        self._put(index, self.stack[-1])

    return handler


def _get_with(argument: Any) -> Any:
    return lambda self: self.stack.append(self._get(argument(self)))


def _proto(self: PlainStream) -> None:
    version = self._take(1)[0]
    if version > HIGHEST_PROTOCOL:
        raise CorruptPickle(f"unsupported pickle protocol: {version}")


def _refuse_named(self: PlainStream) -> None:
    module = self._line().decode("utf-8", "replace")
    name = self._line().decode("utf-8", "replace")
    raise RefusedGlobal(f"{module}.{name}")


def _refuse_stack_global(self: PlainStream) -> None:
    name, module = self.stack.pop(), self.stack.pop()
    if type(name) is not str or type(module) is not str:
        raise CorruptPickle("STACK_GLOBAL requires str")
    raise RefusedGlobal(f"{module}.{name}")


def _refuse_extension(size: int) -> Any:
    def handler(self: PlainStream) -> None:
        code = int.from_bytes(self._take(size), "little")
        key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        if key is None:
            raise CorruptPickle(f"unregistered extension code {code}")
        raise RefusedGlobal(f"{key[0]}.{key[1]}")

    return handler


def _corrupt(message: str) -> Any:
    def handler(self: PlainStream) -> None:
        raise CorruptPickle(message)

    return handler


_NO_CALLABLE = "builds an object from no class or function (plain data only)"
_RARE: dict[int, Any] = {
    0x80: _proto,
    0x95: lambda self: self._take(8),  # FRAME: framing is only a hint to readers
    0x4E: _push(None),
    0x88: _push(True),
    0x89: _push(False),
    0x29: lambda self: self.stack.append(()),
    0x8F: lambda self: self.stack.append(set()),
    0x47: lambda self: self.stack.append(_F64(self._take(8))[0]),
    0x8B: _sized(_I32, 4, _long_binary),  # LONG4
    0x58: _sized(_U32, 4, _utf8),  # BINUNICODE
    0x8D: _sized(_U64, 8, _utf8),  # BINUNICODE8
    0x42: _sized(_U32, 4, bytes),  # BINBYTES
    0x43: _sized(_u8, 1, bytes),  # SHORT_BINBYTES
    0x8E: _sized(_U64, 8, bytes),  # BINBYTES8
    0x96: _sized(_U64, 8, bytearray),  # BYTEARRAY8
    0x54: _sized(_I32, 4, lambda b: b.decode("ascii")),  # BINSTRING
    0x55: _sized(_u8, 1, lambda b: b.decode("ascii")),  # SHORT_BINSTRING
    0x49: _int_text,  # INT
    0x4C: lambda self: self.stack.append(int(self._line().rstrip(b"L"))),  # LONG
    0x46: lambda self: self.stack.append(float(self._line())),  # FLOAT
    0x53: _string_text,  # STRING
    0x56: lambda self: self.stack.append(str(self._line(), "raw-unicode-escape")),  # UNICODE
    0x6C: _mark_build(list),  # LIST
    0x74: _mark_build(tuple),  # TUPLE
    0x64: _mark_build(_dict_from),  # DICT
    0x91: _mark_build(frozenset),  # FROZENSET
    0x85: _tuple_n(1),
    0x86: _tuple_n(2),
    0x87: _tuple_n(3),
    0x73: _setitem,
    0x90: _additems,
    0x30: _pop,
    0x31: lambda self: self._pop_mark(),  # POP_MARK
    0x32: lambda self: self.stack.append(self.stack[-1]),  # DUP
    0x67: _get_with(lambda self: int(self._line())),  # GET
    0x70: _put_with(lambda self: int(self._line())),  # PUT
    0x71: _put_with(lambda self: self._take(1)[0]),  # BINPUT
    0x72: _put_with(lambda self: _U32(self._take(4))[0]),  # LONG_BINPUT
    0x63: _refuse_named,  # GLOBAL
    0x69: _refuse_named,  # INST
    0x93: _refuse_stack_global,
    0x82: _refuse_extension(1),
    0x83: _refuse_extension(2),
    0x84: _refuse_extension(4),
    0x52: _corrupt(f"REDUCE {_NO_CALLABLE}"),
    0x62: _corrupt(f"BUILD {_NO_CALLABLE}"),
    0x6F: _corrupt(f"OBJ {_NO_CALLABLE}"),
    0x81: _corrupt(f"NEWOBJ {_NO_CALLABLE}"),
    0x92: _corrupt(f"NEWOBJ_EX {_NO_CALLABLE}"),
    0x50: _corrupt("a persistent id instruction, but no persistent_load function"),
    0x51: _corrupt("a persistent id instruction, but no persistent_load function"),
    0x97: _corrupt("out-of-band buffers, but no buffers argument"),
    0x98: _corrupt("out-of-band buffers, but no buffers argument"),
}
