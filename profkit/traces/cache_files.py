"""The files of a cache entry (:mod:`profkit.traces.cache`): sealed, checked whole, read by column.

Every file of an entry (its ``entry.json`` too) is written under a temporary name, then
renamed into place, and ends with a seal: :data:`SEAL_MAGIC`, the length of what precedes
it and the CRC-32 of those bytes (:class:`SealedWriter`). When an entry is opened each file
is mapped whole into this process's memory and its seal checked (:func:`read_sealed`): a
flipped bit anywhere (in the seal too), a truncated or half-written file is
:class:`Unsealed`, and the cache reads the trace again. The Arrow IPC files (Feather v2,
zstd) are then read from those very bytes, column by column when first asked for
(:class:`LazyColumns`): a query answered from kept sums never decompresses the
per-activity arrays, and nothing another process does to the folder later (replacing the
entry, removing it) changes what this one reads.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from profkit.errors import BadInput

COMPRESSION = "zstd"  # measured against Parquet and lz4 in docs/PERFORMANCE.md
META_KEY = b"profkit"  # the schema metadata key of a file's own record
SEAL_MAGIC = b"PKSEAL01"
SEAL = struct.Struct("<8sQI")  # magic, length of the content before the seal, its CRC-32
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class Unsealed(Exception):
    """A cache file whose seal does not match its bytes (damaged, truncated, half-written),
    or that is not a regular file: the cache reads the trace instead."""


class Damaged(BadInput):
    """A column that read back wrong after its sealed file checked out (a profkit bug)."""


class SealedWriter:
    """A binary sink that keeps the CRC-32 and length of what goes through it; :meth:`seal`
    appends the seal. Takes what pyarrow writes (through ``pa.PythonFile``)."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.crc, self.size = raw, 0, 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += view.nbytes
        self.raw.write(view)
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed)

    def close(self) -> None:
        """pyarrow closes its sink when done; the seal still goes after (:meth:`seal`)."""

    def seal(self) -> None:
        self.raw.write(SEAL.pack(SEAL_MAGIC, self.size, self.crc))


def write_sealed(path: Path, fill: Callable[[SealedWriter], None]) -> None:
    """Write ``path`` through ``fill(writer)``, sealed; under a temporary name of its own
    (two processes writing the same file never share one), renamed into place."""
    fd, name = tempfile.mkstemp(prefix=".writing-", dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw:
            writer = SealedWriter(raw)
            fill(writer)
            writer.seal()
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_json(path: Path, value: Any) -> None:
    """``value`` as JSON (ASCII: a path's undecodable bytes travel as escapes), sealed."""
    text = json.dumps(value, default=str).encode("ascii")

    def fill(writer: SealedWriter) -> None:
        writer.write(text)

    write_sealed(path, fill)


def write_table(path: Path, table: Any, record: dict[str, Any] | None = None) -> None:
    """Write ``table`` (a pyarrow Table) as one sealed Arrow IPC file; ``record`` goes in
    its schema."""
    import pyarrow as pa

    if record is not None:
        table = table.replace_schema_metadata({META_KEY: json.dumps(record).encode()})
    compression = COMPRESSION if pa.Codec.is_available(COMPRESSION) else None
    options = pa.ipc.IpcWriteOptions(compression=compression)

    def fill(writer: SealedWriter) -> None:
        with (
            pa.PythonFile(writer, mode="w") as sink,
            pa.ipc.new_file(sink, table.schema, options=options) as ipc,
        ):
            ipc.write_table(table, max_chunksize=max(len(table), 1))

    try:
        write_sealed(path, fill)
    finally:
        # A column's compressed copy was as large as the column: give the pool's free
        # memory back now, not at exit (it would add to the analysis' peak).
        pa.default_memory_pool().release_unused()


def write_arrays(path: Path, arrays: Mapping[str, np.ndarray], record: dict[str, Any]) -> None:
    """Arrays of any lengths and shapes in one file: each is a column holding one list (its
    values, flattened); their shapes and dtypes go in the record (``record["arrays"]``)."""
    import pyarrow as pa

    record = {**record, "arrays": {k: [a.dtype.str, list(a.shape)] for k, a in arrays.items()}}
    columns = {}
    for key, array in arrays.items():
        flat = np.ascontiguousarray(array).reshape(-1)
        if flat.dtype == np.bool_:  # Arrow packs booleans in bits: no zero-copy read back
            flat = flat.view(np.uint8)
        offsets = pa.array([0, flat.size], pa.int64())
        columns[key] = pa.LargeListArray.from_arrays(offsets, pa.array(flat))
    write_table(path, pa.table(columns), record)


def read_sealed(folder: int, name: str) -> memoryview:
    """The content of file ``name`` in the folder open as ``folder`` (a descriptor), mapped
    and checked against its seal. Raises :class:`Unsealed`, or FileNotFoundError where the
    file is not there (any more).

    Mapped, not copied (a quarter of the time at 90 MB): the cache never changes a file in
    place (each is written aside and renamed), so the mapping keeps the bytes checked,
    whoever replaces or removes the file afterwards.
    """
    fd = os.open(name, READ_FLAGS, dir_fd=folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size < SEAL.size:
            raise Unsealed(f"{name}: not a sealed file")
        data = memoryview(mmap.mmap(fd, info.st_size, access=mmap.ACCESS_READ))
    finally:
        os.close(fd)
    magic, length, crc = SEAL.unpack_from(data, len(data) - SEAL.size)
    content = data[: len(data) - SEAL.size]
    if magic != SEAL_MAGIC or length != len(content) or zlib.crc32(content) != crc:
        raise Unsealed(f"{name}: its seal does not match its bytes")
    return content


def open_ipc(content: memoryview, fields: list[int] | None = None) -> Any:
    """An Arrow IPC file reader over ``content`` (no copy), reading only ``fields`` if given."""
    import pyarrow as pa

    options = None if fields is None else pa.ipc.IpcReadOptions(included_fields=fields)
    return pa.ipc.open_file(pa.BufferReader(pa.py_buffer(content)), options=options)


def read_table(content: memoryview) -> Any:
    """A whole Arrow IPC file as a pyarrow Table (for the small ones)."""
    return open_ipc(content).read_all()


def read_record(content: memoryview) -> tuple[Any, dict[str, Any]]:
    """A file's schema and record (``{}`` if none): no column read."""
    schema = open_ipc(content).schema
    metadata = schema.metadata or {}
    return schema, json.loads(metadata[META_KEY]) if META_KEY in metadata else {}


class LazyColumns(Mapping[str, np.ndarray]):
    """The columns of one file as numpy arrays (read-only), each read when first asked for.

    ``content`` is the file's checked bytes (:func:`read_sealed`); ``read(table, name)``
    turns the one-column table read into the array; ``check(name, array)`` says whether it
    is what the entry promised (the entry was checked when opened: a column that fails
    here is a bug, said in one line).
    """

    def __init__(
        self,
        content: memoryview,
        names: list[str],
        length: int,
        read: Callable[[Any, str], np.ndarray],
        check: Callable[[str, np.ndarray], bool],
        where: str,
    ) -> None:
        self.content, self.names, self.length = content, names, length
        self._read, self._check, self._where = read, check, where
        self._loaded: dict[str, np.ndarray] = {}
        # The analysis' chunks run on several threads and may all ask for a column first
        # at once: one loads it, the others wait (each loading its own copy took 4x).
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> np.ndarray:
        found = self._loaded.get(name)
        if found is not None:
            return found
        if name not in self.names:
            raise KeyError(name)
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = self._load(name)
        return self._loaded[name]

    def load(self, names: list[str]) -> None:
        """Read the columns ``names`` not read yet, in one read: pyarrow decompresses them
        on several threads at once (a --range hit at x1000 reads 0.8 GB of them)."""
        with self._lock:
            missing = [n for n in names if n in self.names and n not in self._loaded]
            if len(missing) > 1:
                self._loaded.update(self.read_columns(missing))

    def _load(self, name: str) -> np.ndarray:
        return self.read_columns([name])[name]

    def read_columns(self, names: list[str]) -> dict[str, np.ndarray]:
        """The columns ``names``, read (and checked) now, not kept."""
        arrays: dict[str, np.ndarray] = {}
        try:
            table = open_ipc(self.content, [self.names.index(n) for n in names]).read_all()
            for name in names:
                arrays[name] = self._read(table, name)
            usable = all(self._check(name, array) for name, array in arrays.items())
        except Exception as exc:  # pyarrow and numpy fail in many ways
            usable = False
            reason = f"{type(exc).__name__}: {exc}"
        else:
            reason = "its values do not fit the entry"
        if not usable:
            raise Damaged(
                f"the profkit cache read {self._where} back wrong ({reason}); "
                "run the command with --no-cache"
            )
        return arrays

    @property
    def loaded(self) -> list[str]:
        """The columns read so far."""
        return list(self._loaded)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def column(table: Any, name: str) -> np.ndarray:
    """A plain column as a numpy array."""
    return table.column(name).to_numpy()


def listed(record: dict[str, Any]) -> Callable[[Any, str], np.ndarray]:
    """Reads back a column written by :func:`write_arrays` (its dtype and shape from ``record``)."""

    def read(table: Any, name: str) -> np.ndarray:
        dtype, shape = record["arrays"][name]
        values = table.column(name).chunk(0).values.to_numpy().view(dtype)
        return values.reshape(shape)

    return read
