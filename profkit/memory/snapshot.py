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

import gzip
import io
import lzma
import pickle
from pathlib import Path
from typing import IO, Any

from profkit.errors import BadInput

_XZ_MAGIC = b"\xfd7zXZ\x00"
_GZIP_MAGIC = b"\x1f\x8b"
_PICKLE_PROTO = 0x80  # protocol 2+ pickles open with PROTO; every snapshot is protocol 2+
SIDECAR_SUFFIX = ".profkit.json"


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle referenced a Python global (a class or a function)."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler for plain data: every global is refused, so no code can run."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedGlobal(f"{module}.{name}")


def loads_plain(data: bytes) -> Any:
    """Unpickle ``data`` as plain data (see :class:`PlainUnpickler`)."""
    return PlainUnpickler(io.BytesIO(data)).load()


def _open(path: Path) -> IO[bytes]:
    try:
        raw = path.open("rb")
    except IsADirectoryError:
        raise BadInput(f"{path} is a directory, not a memory snapshot") from None
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    head = raw.read(6)
    raw.seek(0)
    if head.startswith(_XZ_MAGIC):
        return lzma.open(raw)  # type: ignore[return-value]
    if head.startswith(_GZIP_MAGIC):
        return gzip.open(raw)  # type: ignore[return-value]
    return raw


def load_snapshot(path: Path) -> dict[str, Any]:
    """Load a CUDA memory snapshot (``.pickle``, optionally ``.xz``/``.gz``) as plain data.

    Raises :class:`BadInput` with one line for anything that is not a snapshot: not a
    pickle, a truncated or corrupt one, a pickle of something else, or one that tries to
    build Python objects (refused before anything runs).
    """
    path = Path(path)
    with _open(path) as stream:
        try:
            first = stream.read(1)
        except (OSError, EOFError, lzma.LZMAError) as exc:
            raise BadInput(f"{path}: corrupt compressed file ({exc})") from None
        if not first:
            raise BadInput(f"{path} is empty, not a memory snapshot")
        if first[0] != _PICKLE_PROTO:
            raise BadInput(f"{path} is not a pickle (expected a CUDA memory snapshot .pickle)")
        try:
            stream.seek(0)  # compressed streams rewind cheaply from their start
            data = PlainUnpickler(stream).load()
        except RefusedGlobal as exc:
            raise BadInput(
                f"{path}: refused to load: the pickle asks for the Python object {exc}; "
                "a memory snapshot is plain data, so nothing was loaded or run"
            ) from None
        except (EOFError, lzma.LZMAError, gzip.BadGzipFile) as exc:
            raise BadInput(
                f"{path}: truncated or corrupt pickle ({exc or 'ran out of data'})"
            ) from None
        except Exception as exc:  # any malformed opcode stream: the file is corrupt
            raise BadInput(f"{path}: truncated or corrupt pickle ({exc})") from None
    return normalize(data, path)


def normalize(data: Any, path: Path | str = "snapshot") -> dict[str, Any]:
    """Check that ``data`` is a snapshot and fill what older torch versions leave out.

    Accepts the legacy form (a bare list of segments). Adds ``address`` to blocks that
    lack it (blocks tile their segment in order) and ``requested_size`` where missing.
    """
    if isinstance(data, list) and all(isinstance(s, dict) and "blocks" in s for s in data):
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data:
        kind = type(data).__name__
        raise BadInput(f"{path} holds a pickled {kind}, not a CUDA memory snapshot")
    segments = data["segments"]
    traces = data.setdefault("device_traces", [])
    if not isinstance(segments, list) or not isinstance(traces, list):
        raise BadInput(f"{path}: 'segments' and 'device_traces' must be lists")
    try:
        for segment in segments:
            address = int(segment["address"])
            for block in segment["blocks"]:
                block.setdefault("address", address)
                block.setdefault("requested_size", block["size"])
                address += int(block["size"])
        for trace in traces:
            for entry in trace:
                if entry["action"] not in ("oom", "snapshot"):  # every entry names its action
                    int(entry["addr"]), int(entry["size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"{path}: not a CUDA memory snapshot (malformed entry: {exc})") from None
    return data


def sidecar_path(snapshot_path: Path) -> Path:
    """``run.pickle`` (or ``run.pickle.xz``) -> ``run.profkit.json`` beside it."""
    name = snapshot_path.name
    for suffix in (".xz", ".gz"):
        name = name.removesuffix(suffix)
    name = name.removesuffix(".pickle")
    return snapshot_path.with_name(name + SIDECAR_SUFFIX)
