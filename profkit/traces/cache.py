"""A columnar cache of :class:`ActivityColumns`, so a second query skips the trace's parse.

The first read of a trace writes its compact columns as Parquet (through pyarrow); a later
read of the same file (another ``--phase``, ``--range``, ``--top``, ``profkit diff``,
``profkit report``) loads them instead: a few column reads instead of an SQL scan or a JSON
parse. docs/PERFORMANCE.md has the figures.

Where: ``$PROFKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/profkit``, else ``~/.cache/profkit``,
one entry per trace path (``columns/<hash of the resolved path>/``). Not beside the
export: exports sit in read-only or shared folders, and a cache there would show in the
user's ``git status``. A cache folder that cannot be written is skipped: the read still
works, uncached.

Which: an entry records the trace's size, modification time (ns) and :data:`VERSION`
(bumped whenever the columns or their meaning change); any mismatch, or any entry that
fails to load (damaged, truncated, half-written), is rebuilt from the trace, never
trusted. Off with ``PROFKIT_CACHE=0`` or ``--no-cache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from profkit.traces.columns import ARRAYS, ActivityColumns
from profkit.traces.schema import RANGE_COLUMNS, conform

VERSION = 1
ENV_SWITCH = "PROFKIT_CACHE"
ENV_DIR = "PROFKIT_CACHE_DIR"
INDEX = "entry.json"
ACTIVITIES = "activities.parquet"
RANGES = "ranges.parquet"
NOT_CACHED_META = ("sidecar",)  # read fresh each time: the sidecar changes on its own


def enabled(requested: bool | None = None) -> bool:
    """Whether to use the cache: ``requested`` if given, else ``$PROFKIT_CACHE`` (default on)."""
    if requested is not None:
        return requested
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_dir() -> Path:
    """The folder holding every entry (see the module doc)."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "profkit"


def entry_dir(trace: Path) -> Path:
    digest = hashlib.sha256(str(trace.resolve()).encode()).hexdigest()[:24]
    return cache_dir() / "columns" / digest


def identity(trace: Path) -> dict[str, Any]:
    """What must match for an entry to stand for ``trace``."""
    stat = trace.stat()
    return {
        "version": VERSION,
        "path": str(trace.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }


def cached_columns(
    trace: Path,
    read: Callable[[], ActivityColumns],
    use: bool | None = None,
    finish: Callable[[ActivityColumns], None] | None = None,
) -> ActivityColumns:
    """``read()``'s columns for ``trace``, from the cache when a valid entry holds them.

    ``finish`` is applied to the columns in both cases (the reader's fresh meta, say).
    """
    if not enabled(use):
        return read()
    entry = entry_dir(trace)
    columns = load(entry, identity(trace))
    if columns is None:
        columns = read()
        store(entry, identity(trace), columns)
    if finish is not None:
        finish(columns)
    return columns


def load(entry: Path, expected: dict[str, Any]) -> ActivityColumns | None:
    """The entry's columns, or None if it is missing, stale or damaged."""
    try:
        index = json.loads((entry / INDEX).read_text())
        if index.get("identity") != expected:
            return None
        return _read_entry(entry, index)
    except Exception:
        return None


def _read_entry(entry: Path, index: dict[str, Any]) -> ActivityColumns | None:
    import pyarrow.parquet as pq

    rows = int(index["rows"])
    handle = pq.ParquetFile(entry / ACTIVITIES)
    arrays = {}
    for name, dtype in ARRAYS.items():  # one column at a time: no second copy of them all
        column = handle.read(columns=[name]).column(0).to_numpy()
        if len(column) != rows or column.dtype != dtype:
            return None
        arrays[name] = column
    names, kinds = list(index["names"]), list(index["kinds"])
    shapes = [(str(g), str(b)) for g, b in index["shapes"]]
    if len(names) != len(kinds) or not _codes_fit(arrays, len(names), len(shapes)):
        return None
    ranges = conform(pq.read_table(entry / RANGES).to_pandas(), RANGE_COLUMNS)
    meta = dict(index["meta"])
    meta["thread_names"] = {int(k): v for k, v in meta.get("thread_names", {}).items()}
    return ActivityColumns(
        arrays=arrays,
        names=names,
        kinds=kinds,
        shapes=shapes,
        threads=np.array(index["threads"], dtype=np.int64),
        ranges=ranges,
        meta=meta,
    )


def _codes_fit(arrays: dict[str, np.ndarray], names: int, shapes: int) -> bool:
    if not len(arrays["name"]):
        return True
    return bool(
        arrays["name"].min() >= 0
        and arrays["name"].max() < names
        and arrays["shape"].min() >= 0
        and arrays["shape"].max() < shapes
    )


def store(entry: Path, expected: dict[str, Any], columns: ActivityColumns) -> None:
    """Write the entry (to a temporary folder, then renamed); skip silently if we cannot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=entry.parent))
    except OSError:
        return  # a read-only or missing cache folder: work uncached
    try:
        table = pa.table({name: columns.arrays[name] for name in ARRAYS})
        pq.write_table(table, staging / ACTIVITIES, compression="zstd", compression_level=1)
        ranges = pa.Table.from_pandas(columns.ranges.astype(object_strings()), preserve_index=False)
        pq.write_table(ranges, staging / RANGES)
        meta = {k: v for k, v in columns.meta.items() if k not in NOT_CACHED_META}
        index = {
            "identity": expected,
            "rows": len(columns),
            "names": columns.names,
            "kinds": columns.kinds,
            "shapes": columns.shapes,
            "threads": columns.threads.tolist(),
            "meta": meta,
        }
        (staging / INDEX).write_text(json.dumps(index, default=str))
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
    except OSError:
        pass  # disk full, permissions: the read itself succeeded
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def object_strings() -> dict[str, Any]:
    """Text columns of the ranges as plain objects (Arrow stores them as its strings)."""
    return {name: object for name, dtype in RANGE_COLUMNS.items() if dtype != "int64"}
