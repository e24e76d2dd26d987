"""A columnar cache of :class:`ActivityColumns`, so a second query skips the trace's parse.

The first read of a trace writes its compact columns as an Arrow IPC file (Feather v2,
zstd-compressed, through pyarrow); a later read of the same file (another ``--phase``,
``--range``, ``--top``, ``profkit diff``, ``profkit report``) loads them instead: a few
column reads instead of an SQL scan or a JSON parse. What the analysis derives from the
columns and asks to keep (:meth:`ActivityColumns.remember`: each activity's phase and
attribution points) is stored beside them as it is computed, so a later query loads that
too and only adds up and sorts. docs/PERFORMANCE.md has the figures.

Where: ``$PROFKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/profkit``, else ``~/.cache/profkit``,
one entry per trace path (``columns/<hash of the resolved path>/``). Not beside the
export: exports sit in read-only or shared folders, and a cache there would show in the
user's ``git status``. A cache folder that cannot be written is skipped: the read still
works, uncached.

Which: an entry records the trace's size, modification time (ns) and :data:`VERSION`
(bumped whenever the columns or their meaning change); so does every derived file, which
also records its row count. Any mismatch, or any file that fails to load (damaged,
truncated, half-written: files are written under a temporary name, then renamed), is
rebuilt from the trace, never trusted. Off with ``PROFKIT_CACHE=0`` or ``--no-cache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from profkit.traces import cache_files as files
from profkit.traces.columns import KEPT, SHAPE, ActivityColumns, Derived, RowMap
from profkit.traces.schema import RANGE_COLUMNS, conform

VERSION = 5  # 2: Arrow IPC files, optional shape codes, kernel row ids, derived arrays;
# 3: start times and devices of multi-process exports (the streaming ranks need them);
# 4: an nsys export's host and session start in the meta (several nodes' reports);
# 5: start times and devices of per-rank Chrome traces (their ranks joined as columns)
ENV_SWITCH = "PROFKIT_CACHE"
ENV_DIR = "PROFKIT_CACHE_DIR"
INDEX = "entry.json"
ACTIVITIES = "activities.arrow"
RANGES = "ranges.arrow"
DERIVED = "derived-{}.arrow"
DERIVED_NAME = re.compile(r"[a-z_]+")
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

    ``finish`` is applied to the columns in both cases (the reader's fresh meta, say). The
    columns' :attr:`~ActivityColumns.keep` then stores what the analysis derives in the entry.
    """
    if not enabled(use):
        return read()
    entry, expected = entry_dir(trace), identity(trace)
    columns = load(entry, expected)
    if columns is None:
        columns = read()
        store(entry, expected, columns)
    if (entry / INDEX).exists():
        columns.keep = lambda name, derived: store_derived(entry, expected, name, derived)
    if finish is not None:
        finish(columns)
    return columns


def load(entry: Path, expected: dict[str, Any]) -> ActivityColumns | None:
    """The entry's columns (with their derived arrays), or None if missing, stale or damaged.

    Arrays are read when first used (:class:`~.cache_files.LazyColumns`); the files'
    schemas and records are checked here.
    """
    try:
        index = json.loads((entry / INDEX).read_text())
        if index.get("identity") != expected:
            return None
        columns = _read_entry(entry, index)
    except Exception:
        return None
    if columns is not None:
        for path in sorted(entry.glob(DERIVED.format("*"))):
            derived = _read_derived(path, expected, entry)
            if derived is not None:
                columns.derived[path.stem.removeprefix("derived-")] = derived
    return columns


def _read_entry(entry: Path, index: dict[str, Any]) -> ActivityColumns | None:
    rows = int(index["rows"])
    names, kinds = list(index["names"]), list(index["kinds"])
    shapes = [(str(g), str(b)) for g, b in index["shapes"]]
    kept = {name: np.dtype(dtype) for name, dtype in KEPT.items() if name in index["arrays"]}
    columns, _ = files.read_record(entry / ACTIVITIES)
    if set(columns) != set(kept) or len(names) != len(kinds):
        return None
    limits = {"name": len(names), SHAPE: len(shapes)}

    def check(name: str, array: np.ndarray) -> bool:
        fits = len(array) == rows and array.dtype == kept[name]
        if fits and name in limits and len(array):  # codes index the lookup tables
            fits = bool(array.min() >= 0 and array.max() < limits[name])
        return fits

    arrays = files.LazyColumns(entry / ACTIVITIES, columns, rows, files.column, check, entry)
    ranges = conform(files.read_table(entry / RANGES).to_pandas(), RANGE_COLUMNS)
    meta = dict(index["meta"])
    meta["thread_names"] = {int(k): v for k, v in meta.get("thread_names", {}).items()}
    rows_map = index.get("kernel_rows")
    bounds = index["launch_bounds"]
    return ActivityColumns(
        arrays=arrays,
        names=names,
        kinds=kinds,
        shapes=shapes,
        threads=np.array(index["threads"], dtype=np.int64),
        ranges=ranges,
        meta=meta,
        kernel_rows=None
        if rows_map is None
        else RowMap(
            np.array(rows_map["starts"], dtype=np.int64),
            np.array(rows_map["rowids"], dtype=np.int64),
            int(rows_map["count"]),
        ),
        known_launch_bounds=(int(bounds[0]), int(bounds[1])) if bounds else (),
    )


def store(entry: Path, expected: dict[str, Any], columns: ActivityColumns) -> None:
    """Write the entry (to a temporary folder, then renamed); skip silently if we cannot."""
    import pyarrow as pa

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=entry.parent))
    except OSError:
        return  # a read-only or missing cache folder: work uncached
    try:
        files.write_table(staging / ACTIVITIES, pa.table(dict(columns.arrays)))
        ranges = pa.Table.from_pandas(columns.ranges.astype(object_strings()), preserve_index=False)
        files.write_table(staging / RANGES, ranges)
        meta = {k: v for k, v in columns.meta.items() if k not in NOT_CACHED_META}
        rows_map = columns.kernel_rows
        index = {
            "identity": expected,
            "rows": len(columns),
            "arrays": list(columns.arrays),
            "names": columns.names,
            "kinds": columns.kinds,
            "shapes": columns.shapes,
            "threads": columns.threads.tolist(),
            "meta": meta,
            "launch_bounds": columns.launch_bounds(),
            "kernel_rows": None
            if rows_map is None
            else {
                "starts": rows_map.starts.tolist(),
                "rowids": rows_map.rowids.tolist(),
                "count": rows_map.count,
            },
        }
        (staging / INDEX).write_text(json.dumps(index, default=str))
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
    except OSError:
        pass  # disk full, permissions: the read itself succeeded
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def store_derived(entry: Path, expected: dict[str, Any], name: str, derived: Derived) -> None:
    """Write one derived file into the entry; skip silently if we cannot."""
    if not DERIVED_NAME.fullmatch(name):
        raise ValueError(f"derived arrays need a plain name, not {name!r}")
    try:
        record = {"identity": expected, "meta": derived.meta}
        files.write_arrays(entry / DERIVED.format(name), derived.arrays, record)
    except OSError:
        pass


def _read_derived(path: Path, expected: dict[str, Any], entry: Path) -> Derived | None:
    """A derived file's arrays (read when used), or None if stale or damaged."""
    try:
        columns, record = files.read_record(path)
        if record.get("identity") != expected or set(columns) != set(record["arrays"]):
            return None
    except Exception:
        return None

    def check(name: str, array: np.ndarray) -> bool:
        dtype, shape = record["arrays"][name]
        return array.dtype == np.dtype(dtype) and list(array.shape) == shape

    arrays = files.LazyColumns(path, columns, -1, files.listed(record), check, entry)
    return Derived(arrays=arrays, meta=record["meta"])


def object_strings() -> dict[str, Any]:
    """Text columns of the ranges as plain objects (Arrow stores them as its strings)."""
    return {name: object for name, dtype in RANGE_COLUMNS.items() if dtype != "int64"}
