"""The files of a cache entry (:mod:`profkit.traces.cache`): Arrow IPC, read column by column.

Each file is one Arrow IPC file (Feather v2), zstd-compressed, written under a temporary
name and then renamed, with a JSON record in its schema's metadata where it needs one.
Columns are read when first asked for (:class:`LazyColumns`): a query answered from kept
sums never decompresses the per-activity arrays. A file's schema and record are checked
when it is opened; a column that then fails to read or to check out is a damaged entry,
which is removed, with one line asking to run the command again (see :class:`Damaged`).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from profkit.errors import BadInput

COMPRESSION = "zstd"  # measured against Parquet and lz4 in docs/PERFORMANCE.md
META_KEY = b"profkit"  # the schema metadata key of a file's own record


class Damaged(BadInput):
    """A cache file read back wrong after its entry was accepted (it is removed)."""


def write_table(path: Path, table: Any, record: dict[str, Any] | None = None) -> None:
    """Write ``table`` (a pyarrow Table) as one Arrow IPC file; ``record`` goes in its schema."""
    import pyarrow as pa

    if record is not None:
        table = table.replace_schema_metadata({META_KEY: json.dumps(record).encode()})
    compression = COMPRESSION if pa.Codec.is_available(COMPRESSION) else None
    options = pa.ipc.IpcWriteOptions(compression=compression)
    temporary = path.with_name(f".writing-{os.getpid()}-{path.name}")
    try:
        with (
            pa.OSFile(str(temporary), "wb") as sink,
            pa.ipc.new_file(sink, table.schema, options=options) as writer,
        ):
            writer.write_table(table, max_chunksize=max(len(table), 1))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
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


def read_table(path: Path) -> Any:
    """A whole Arrow IPC file as a pyarrow Table (for the small ones)."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def read_record(path: Path) -> tuple[list[str], dict[str, Any]]:
    """A file's column names and record (``{}`` if none): its schema, no column read."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        schema = pa.ipc.open_file(source).schema
    metadata = schema.metadata or {}
    return list(schema.names), json.loads(metadata[META_KEY]) if META_KEY in metadata else {}


class LazyColumns(Mapping[str, np.ndarray]):
    """The columns of one file as numpy arrays (read-only), each read when first asked for.

    ``read(table, name)`` turns the one-column table read into the array; ``check(name,
    array)`` says whether it is what the entry promised. ``entry`` is removed when a column
    fails either way.
    """

    def __init__(
        self,
        path: Path,
        names: list[str],
        length: int,
        read: Callable[[Any, str], np.ndarray],
        check: Callable[[str, np.ndarray], bool],
        entry: Path,
    ) -> None:
        self.path, self.names, self.length = path, names, length
        self._read, self._check, self._entry = read, check, entry
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
                self._loaded.update(self._read_columns(missing))

    def _load(self, name: str) -> np.ndarray:
        return self._read_columns([name])[name]

    def _read_columns(self, names: list[str]) -> dict[str, np.ndarray]:
        import pyarrow as pa

        arrays: dict[str, np.ndarray] = {}
        try:
            options = pa.ipc.IpcReadOptions(included_fields=[self.names.index(n) for n in names])
            with pa.memory_map(str(self.path)) as source:
                table = pa.ipc.open_file(source, options=options).read_all()
            for name in names:
                arrays[name] = self._read(table, name)
            usable = all(self._check(name, array) for name, array in arrays.items())
        except Exception as exc:  # a damaged file reads wrong in many ways
            usable = False
            reason = f"{type(exc).__name__}: {exc}"
        else:
            reason = "its values do not fit the entry"
        if not usable:
            shutil.rmtree(self._entry, ignore_errors=True)
            raise Damaged(
                f"the profkit cache entry {self._entry} was damaged ({self.path.name}: "
                f"{reason}); it is removed: run the command again (or use --no-cache)"
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
