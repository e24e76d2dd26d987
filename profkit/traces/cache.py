"""A columnar cache of :class:`ActivityColumns`, so a second query skips the trace's parse.

The first read of a trace writes its compact columns as an Arrow IPC file (Feather v2,
zstd-compressed, through pyarrow); a later read of the same file (another ``--phase``,
``--range``, ``--top``, ``profkit diff``, ``profkit report``) loads them instead: a few
column reads instead of an SQL scan or a JSON parse. What the analysis derives from the
columns and asks to keep (:meth:`ActivityColumns.remember`: each activity's phase and
attribution points) is stored beside them as it is computed, so a later query loads that
too and only adds up and sorts. docs/PERFORMANCE.md has the figures.

Where: ``$PROFKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/profkit``, else ``~/.cache/profkit``,
one entry per trace path (``columns/<hash of the resolved path's bytes>/``), and one more
for an export of one process read with its GPU starts (a node of a job: the ``timed``
variant, :func:`cached_columns`). Not beside the export: exports sit in read-only or shared folders, and a cache there would show in the
user's ``git status``. A cache folder that cannot be written, or whose names the file
system refuses (too long), is skipped: the read still works, uncached.

The identity rule (:func:`identity`): an entry stands for the trace whose resolved path,
size, modification time, inode number and inode change time (ctime, ns) and the
fingerprint of its first and last :data:`FINGERPRINT` bytes are those it recorded, under
this :data:`VERSION` (bumped whenever the columns or their meaning change). Replacing a
file keeping its size and mtime (``cp -p``, ``rsync -a``, ``tar x``) always gives it a new
ctime, and a new inode where it is renamed into place; the fingerprint also catches a
changed header or tail where a file system keeps no ctime. It cannot see a change in the
middle of a file that keeps size, mtime, inode and ctime: only the file system (or a
clock set back to the same nanosecond) can make one. The identity is taken before and
after the first read; an entry is stored only if they agree. Metadata changes (``chmod``,
a new hard link) change the ctime too: such a trace is read again, never misread.

The integrity rule: every file of an entry is sealed with its CRC-32
(:mod:`.cache_files`), checked in full when the entry is opened, before any analysis sees
it; the entry's lookup tables are checked for their types and every code column for codes
within its table (``name``, ``shape``, ``launch_thread``). An entry that fails is read from
the trace again in the same run and replaces it; a derived file that fails is left out
(the analysis computes it again and rewrites it). The analysis then reads only the bytes
checked. An entry is replaced by a rename (the old folder moved aside first), never
changed in place, so another process may replace or remove it at any time: a reader has
either the old files or the new, never a mix, and never deletes an entry. The seal guards
against damage, not forgery: a file rewritten with a matching CRC is trusted (its codes
are still checked against their tables, the derived arrays' values are not). Off with
``PROFKIT_CACHE=0`` or ``--no-cache``. The cache is capped (``$PROFKIT_CACHE_MAX_MB``,
least recently used entries go first) and ``profkit cache`` shows or clears it:
:mod:`.cache_size`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from profkit.traces import cache_files as files
from profkit.traces import cache_size
from profkit.traces.columns import KEPT, SHAPE, ActivityColumns, Derived, RowMap
from profkit.traces.schema import KINDS, RANGE_COLUMNS, conform

VERSION = 7  # 2: Arrow IPC files, optional shape codes, kernel row ids, derived arrays;
# 3: start times and devices of multi-process exports (the streaming ranks need them);
# 4: an nsys export's host and session start in the meta (several nodes' reports);
# 5: start times and devices of per-rank Chrome traces (their ranks joined as columns);
# 6: sealed files (CRC-32), identity with inode, ctime and the trace's ends' fingerprint;
# 7: an nsys export's ranges left open at its end (meta ``unclosed_ranges``)
ENV_SWITCH = "PROFKIT_CACHE"
ENV_DIR = "PROFKIT_CACHE_DIR"
INDEX = "entry.json"
ACTIVITIES = "activities.arrow"
RANGES = "ranges.arrow"
DERIVED = "derived-{}.arrow"
DERIVED_NAME = re.compile(r"[a-z_]+")
DERIVED_FILE = re.compile(r"derived-([a-z_]+)\.arrow")
NOT_CACHED_META = ("sidecar",)  # read fresh each time: the sidecar changes on its own
FINGERPRINT = 64 << 10  # bytes hashed at each end of the trace: an SQLite header, a JSON tail
CODES = {"name": "names", SHAPE: "shapes", "launch_thread": "threads"}  # code -> its table
LEFTOVER_S = 3600  # a staging or replaced folder this old belongs to a process long gone
LOOKS = 3  # times an entry is opened again when another process replaced it meanwhile


class Unusable(Exception):
    """An entry that does not check out: read the trace instead."""


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


def entry_dir(trace: Path, variant: str = "") -> Path:
    """The entry's folder: named by a hash of the resolved path's bytes (any bytes: a path
    that is not UTF-8 has one too), and of the ``variant`` of the read it keeps, if any."""
    key = os.fsencode(trace.resolve()) + (b"\0" + variant.encode() if variant else b"")
    digest = hashlib.sha256(key).hexdigest()[: cache_size.NAME_LENGTH]
    return entries_dir() / digest


def entries_dir() -> Path:
    """The folder of the cache's entries, one folder each."""
    return cache_dir() / "columns"


def identity(trace: Path, variant: str = "") -> dict[str, Any]:
    """What must match for an entry to stand for ``trace`` (the module doc's rule), read the
    ``variant`` way: a stat and two reads of :data:`FINGERPRINT` bytes, whatever the
    trace's size."""
    with open(trace, "rb") as handle:
        stat = os.fstat(handle.fileno())
        ends = hashlib.blake2b(handle.read(FINGERPRINT), digest_size=16)
        if stat.st_size > FINGERPRINT:
            handle.seek(max(stat.st_size - FINGERPRINT, FINGERPRINT))
            ends.update(handle.read(FINGERPRINT))
    return {
        "version": VERSION,
        "path": str(trace.resolve()),  # JSON keeps undecodable bytes as escapes
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
        "inode": stat.st_ino,
        "ends": ends.hexdigest(),
        **({"variant": variant} if variant else {}),
    }


def cached_columns(
    trace: Path,
    read: Callable[[], ActivityColumns],
    use: bool | None = None,
    finish: Callable[[ActivityColumns], None] | None = None,
    variant: str = "",
) -> ActivityColumns:
    """``read()``'s columns for ``trace``, from the cache when a valid entry holds them.

    ``finish`` is applied to the columns in both cases (the reader's fresh meta, say). The
    columns' :attr:`~ActivityColumns.keep` then stores what the analysis derives in the entry.
    ``variant`` names a read that keeps other arrays than the plain one (``"timed"``: GPU
    starts and devices of an export that keeps none alone): its entry is another one, so
    that neither read evicts the other's.
    """
    if not enabled(use):
        return _finished(read(), finish)
    try:
        entry, expected = entry_dir(trace, variant), identity(trace, variant)
    except (OSError, RuntimeError, ValueError):  # a path the cache cannot name: uncached
        return _finished(read(), finish)
    columns = load(entry, expected)
    if columns is None:
        columns = read()
        if not _unchanged(trace, expected, variant) or not store(entry, expected, columns):
            return _finished(columns, finish)  # nothing in the entry to add derived files to
        for name, derived in columns.derived.items():  # what the reader derived as it read
            store_derived(entry, expected, name, derived)
        cache_size.trim(entry.parent, INDEX, keep=entry)  # under its cap: PROFKIT_CACHE_MAX_MB
    else:
        cache_size.touch(entry)  # used now: trimming keeps it longest
    columns.keep = lambda name, derived: store_derived(entry, expected, name, derived)
    return _finished(columns, finish)


def _finished(
    columns: ActivityColumns, finish: Callable[[ActivityColumns], None] | None
) -> ActivityColumns:
    if finish is not None:
        finish(columns)
    return columns


def _unchanged(trace: Path, expected: dict[str, Any], variant: str) -> bool:
    """Whether ``trace`` still has the identity it had before it was read."""
    try:
        return identity(trace, variant) == expected
    except OSError:
        return False


def load(entry: Path, expected: dict[str, Any]) -> ActivityColumns | None:
    """The entry's columns (with their derived arrays), or None if missing, stale or damaged.

    Every file is read and checked now (the module doc's integrity rule); arrays are
    decompressed when first used (:class:`~.cache_files.LazyColumns`).
    """
    for _ in range(LOOKS):
        try:
            folder = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None  # no entry, or a cache folder the file system refuses
        try:
            return _open_entry(entry, folder, expected)
        except FileNotFoundError:
            continue  # another process replaced the entry while it was opened: look again
        except Exception:  # damaged, stale or not ours: read the trace instead
            return None
        finally:
            os.close(folder)
    return None


def _open_entry(entry: Path, folder: int, expected: dict[str, Any]) -> ActivityColumns | None:
    index = json.loads(bytes(files.read_sealed(folder, INDEX)))
    if not isinstance(index, dict) or index.get("identity") != expected:
        return None
    columns = _read_entry(
        entry, index, files.read_sealed(folder, ACTIVITIES), files.read_sealed(folder, RANGES)
    )
    for name in sorted(os.listdir(folder)):
        match = DERIVED_FILE.fullmatch(name)
        if match is None:
            continue
        try:
            content = files.read_sealed(folder, name)
        except (OSError, files.Unsealed):
            continue  # damaged or gone: the analysis computes it again and rewrites it
        derived = _read_derived(content, expected, entry / name)
        if derived is not None:
            columns.derived[match.group(1)] = derived
    return columns


def _read_entry(
    entry: Path, index: dict[str, Any], activities: memoryview, ranges_file: memoryview
) -> ActivityColumns:
    """The entry's columns, every lookup table and code checked (raises on any mismatch)."""
    rows, names, kinds = index["rows"], index["names"], index["kinds"]
    threads = index["threads"]
    _require(isinstance(rows, int) and rows >= 0, "rows")
    _require(_all(names, str) and _all(kinds, str) and len(names) == len(kinds), "names")
    _require(set(kinds) <= set(KINDS), "kinds")
    _require(_all(index["shapes"], list), "shapes")
    _require(all(len(s) == 2 and _all(s, str) for s in index["shapes"]), "shapes")
    shapes = [(str(grid), str(block)) for grid, block in index["shapes"]]
    _require(_all(threads, int) and all(-(2**63) <= t < 2**63 for t in threads), "threads")
    meta = index["meta"]
    _require(isinstance(meta, dict) and isinstance(meta.get("thread_names", {}), dict), "meta")
    meta["thread_names"] = {int(k): str(v) for k, v in meta.get("thread_names", {}).items()}
    kept = {name: np.dtype(KEPT[name]) for name in index["arrays"]}  # KeyError: unknown
    schema, _ = files.read_record(activities)
    _require(set(schema.names) == set(kept) and {"name", "duration"} <= set(kept), "arrays")
    for name, dtype in kept.items():
        _require(np.dtype(schema.field(name).type.to_pandas_dtype()) == dtype, name)
    tables = {"names": len(names), "shapes": len(shapes), "threads": len(threads)}
    low = {"launch_thread": -1}  # -1: no known launch

    def check(name: str, array: np.ndarray) -> bool:
        fits = len(array) == rows and array.dtype == kept[name]
        if fits and name in CODES and len(array):  # codes index the lookup tables
            fits = bool(array.min() >= low.get(name, 0) and array.max() < tables[CODES[name]])
        return fits

    arrays = files.LazyColumns(activities, schema.names, rows, files.column, check, str(entry))
    for name in [n for n in CODES if n in kept]:  # read now, then let go: a hit without
        arrays.read_columns([name])  # --range never needs them (raises if one does not fit)
    ranges = conform(files.read_table(ranges_file).to_pandas(), RANGE_COLUMNS)
    return ActivityColumns(
        arrays=arrays,
        names=names,
        kinds=kinds,
        shapes=shapes,
        threads=np.array(threads, dtype=np.int64),
        ranges=ranges,
        meta=meta,
        kernel_rows=_row_map(index["kernel_rows"], rows),
        known_launch_bounds=_bounds(index["launch_bounds"]),
    )


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise Unusable(what)


def _all(values: Any, kind: type) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, kind) and not isinstance(v, bool) for v in values
    )


def _row_map(kept: Any, rows: int) -> RowMap | None:
    """The kernels' row ids: runs that start at 0, in order, within the activities."""
    if kept is None:
        return None
    starts, rowids, count = kept["starts"], kept["rowids"], kept["count"]
    _require(_all(starts, int) and _all(rowids, int) and len(starts) == len(rowids), "rows")
    _require(isinstance(count, int) and 0 <= count <= rows, "kernel count")
    _require(not starts or (starts[0] == 0 and starts[-1] < max(count, 1)), "kernel rows")
    _require(all(a < b for a, b in itertools.pairwise(starts)), "kernel rows")
    _require(all(0 <= r < 2**62 for r in rowids), "row ids")
    return RowMap(np.array(starts, dtype=np.int64), np.array(rowids, dtype=np.int64), count)


def _bounds(kept: Any) -> tuple[int, int] | tuple[()]:
    if not kept:
        return ()
    _require(_all(kept, int) and len(kept) == 2 and kept[0] <= kept[1], "launch bounds")
    return (kept[0], kept[1])


def store(entry: Path, expected: dict[str, Any], columns: ActivityColumns) -> bool:
    """Write the entry (into a folder of its own, then renamed into place); False, silently,
    if we cannot."""
    import pyarrow as pa

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(entry.parent)
        staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=entry.parent))
    except OSError:
        return False  # a read-only, missing or unnameable cache folder: work uncached
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
        files.write_json(staging / INDEX, index)
        return _swap_in(staging, entry)
    except OSError:
        return False  # disk full, permissions: the read itself succeeded
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap_in(staging: Path, entry: Path) -> bool:
    """Put ``staging`` in ``entry``'s place. The old entry is first moved aside (readers
    holding its files keep reading them), then removed; if another process put its entry in
    meanwhile, that one stays (it is as good)."""
    aside = Path(tempfile.mkdtemp(prefix=".replaced-", dir=entry.parent))
    try:
        with contextlib.suppress(FileNotFoundError):
            os.replace(entry, aside / "entry")
        try:
            os.rename(staging, entry)
        except OSError:
            return False
        return True
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _remove_leftovers(folder: Path) -> None:
    """Staging and replaced folders of processes killed mid-write (old ones only: a
    process writing now may be on another host that shares the cache)."""
    cutoff = time.time() - LEFTOVER_S
    for child in os.scandir(folder):
        if child.name.startswith((".writing-", ".replaced-")):
            try:
                if child.stat(follow_symlinks=False).st_mtime < cutoff:
                    shutil.rmtree(child.path, ignore_errors=True)
            except OSError:
                pass


def store_derived(entry: Path, expected: dict[str, Any], name: str, derived: Derived) -> None:
    """Write one derived file into the entry; skip silently if we cannot."""
    if not DERIVED_NAME.fullmatch(name):
        raise ValueError(f"derived arrays need a plain name, not {name!r}")
    try:
        record = {"identity": expected, "meta": derived.meta}
        files.write_arrays(entry / DERIVED.format(name), derived.arrays, record)
    except OSError:
        return
    # The entry grew after its first trim (sums, host calls): the cap holds for what it is now.
    cache_size.trim(entry.parent, INDEX, keep=entry)


def _read_derived(content: memoryview, expected: dict[str, Any], path: Path) -> Derived | None:
    """A derived file's arrays (read when used), or None if stale or not as recorded."""
    try:
        schema, record = files.read_record(content)
        listed = record.get("arrays")
        if record.get("identity") != expected or not isinstance(listed, dict):
            return None
        if set(schema.names) != set(listed) or not isinstance(record.get("meta"), dict):
            return None
        for key, (dtype, shape) in listed.items():
            values = schema.field(key).type.value_type.to_pandas_dtype()
            if np.dtype(values).itemsize != np.dtype(dtype).itemsize or not _all(shape, int):
                return None
    except Exception:
        return None

    def check(name: str, array: np.ndarray) -> bool:
        dtype, shape = record["arrays"][name]
        return array.dtype == np.dtype(dtype) and list(array.shape) == shape

    arrays = files.LazyColumns(content, schema.names, -1, files.listed(record), check, str(path))
    return Derived(arrays=arrays, meta=record["meta"])


def object_strings() -> dict[str, Any]:
    """Text columns of the ranges as plain objects (Arrow stores them as its strings)."""
    return {name: object for name, dtype in RANGE_COLUMNS.items() if dtype != "int64"}
