"""The columns of a multi-process nsys export, against plain SQL on the real 2-rank export.

With several CUDA processes the reader keeps each activity's GPU start and device, and keys
each activity to its launch call by (process, correlation id). To spare SQLite work on every
row it makes the calls' keys from their threads in numpy, takes each activity's device from
its process where the contexts table gives the process one device, and reads start and end
as stored (no per-row type check). Each test compares every activity's columns with a join
written in plain SQL, on the export as captured and on copies changed so that each shortcut
must step aside (a process on two devices, a process the contexts table lacks, an activity
without a correlation id, an API call without a thread) or fail cleanly (text in a time).
"""

from __future__ import annotations

import lzma
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from profkit.errors import BadInput
from profkit.traces import nsys_columns
from profkit.traces.nsys_columns import read_nsys_columns

DATA = Path(__file__).parent / "data"
NSYS = DATA / "nsys-2025.3-h200x2-small-ddp2.sqlite.xz"
CONTEXTS = "TARGET_INFO_CUDA_CONTEXT_INFO"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
PROCESS = "((globalPid >> 24) & 16777215)"
# Each API call: its process (in its globalTid), correlation id, start and thread, launch-like
# calls first (where an activity's id has several calls, its launch wins), then by rowid.
CALLS = f"""
SELECT (globalTid >> 24) & 16777215, correlationId, start, globalTid FROM {RUNTIME}
ORDER BY nameId NOT IN (SELECT id FROM StringIds WHERE value LIKE '%Launch%'
                        OR value LIKE '%Memcpy%' OR value LIKE '%Memset%'
                        OR value LIKE '%Prefetch%'), rowid
"""
TABLES = (KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ranks-read") / NSYS.name.removesuffix(".xz")
    path.write_bytes(lzma.decompress(NSYS.read_bytes()))
    return path


def _changed(plain: Path, tmp_path: Path, *sql: str) -> Path:
    path = tmp_path / plain.name
    path.write_bytes(plain.read_bytes())
    with sqlite3.connect(path) as conn:
        for statement in sql:
            conn.execute(statement)
    return path


def _first_process(path: Path) -> int:
    """The lowest process id of the contexts table."""
    with sqlite3.connect(path) as conn:
        return int(conn.execute(f"SELECT min(processId) FROM {CONTEXTS}").fetchone()[0])


def _expected(path: Path) -> dict[str, np.ndarray]:
    """Every activity's columns, from a dictionary of the calls (a plain join)."""
    with sqlite3.connect(path) as conn:
        calls: dict[tuple[int, int], tuple[int, int]] = {}
        for pid, corr, start, tid in conn.execute(CALLS):
            if pid is not None and corr is not None:
                calls.setdefault((pid, corr), (start, tid))
        rows = []
        for table in TABLES:
            sql = f'SELECT start, "end" - start, deviceId, {PROCESS}, correlationId FROM {table}'
            for start, duration, device, pid, corr in conn.execute(sql + " ORDER BY rowid"):
                rows.append((start, duration, device, *calls.get((pid, corr), (-1, -1))))
    start, duration, device, launch, thread = (np.array(c) for c in zip(*rows, strict=True))
    return {
        "start": start,
        "duration": duration,
        "device": device,
        "launch_start": launch,
        "launch_thread_id": thread,
    }


def _assert_columns(path: Path) -> None:
    cols = read_nsys_columns(path)
    want = _expected(path)
    a = cols.arrays
    assert len(a["duration"]) == len(want["duration"]) > 10_000
    for name in ("start", "duration", "device", "launch_start"):
        np.testing.assert_array_equal(a[name], want[name], err_msg=name)
    thread = np.where(a["launch_thread"] >= 0, cols.threads[a["launch_thread"]], -1)
    np.testing.assert_array_equal(thread, want["launch_thread_id"])


def _devices_read(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[int, int]]]:
    """Record each chunk whose device column the reader had to read."""
    reads: list[tuple[str, tuple[int, int]]] = []
    original: Callable = nsys_columns.sqlite_scan.read_chunk

    def spy(conn: sqlite3.Connection, table: str, exprs: dict, bounds: tuple[int, int]):  # type: ignore[no-untyped-def]
        reads.append((table, bounds))
        return original(conn, table, exprs, bounds)

    monkeypatch.setattr(nsys_columns.sqlite_scan, "read_chunk", spy)
    return reads


def test_the_columns_are_the_plain_sql_join(plain: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _devices_read(monkeypatch)
    _assert_columns(plain)
    assert reads == []  # every device came from its process


def test_a_process_on_two_devices_has_its_devices_read(plain: Path, tmp_path: Path) -> None:
    pid = _first_process(plain)
    path = _changed(plain, tmp_path, f"INSERT INTO {CONTEXTS} VALUES (7, 0, 1, {pid}, 5, 9, 0, 0)")
    _assert_columns(path)
    with sqlite3.connect(path) as conn:
        tables = nsys_columns.sqlite_scan.table_columns(conn)
        codec = nsys_columns.Codec.of(conn, tables)
        assert nsys_columns._process_devices(conn, tables, codec) is None


def test_a_process_the_contexts_table_lacks_has_its_devices_read(
    plain: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not the first kernel's process: the one left must not read as the only one.
    path = _changed(
        plain, tmp_path, f"DELETE FROM {CONTEXTS} WHERE processId = {_first_process(plain)}"
    )
    reads = _devices_read(monkeypatch)
    _assert_columns(path)
    assert {table for table, _ in reads} == set(TABLES)


def test_an_activity_without_a_correlation_id_keeps_its_device(
    plain: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sqlite3.connect(plain) as conn:
        rowid, device = conn.execute(
            f"SELECT rowid, deviceId FROM {KERNEL} WHERE deviceId = 1 LIMIT 1 OFFSET 7"
        ).fetchone()
    path = _changed(
        plain, tmp_path, f"UPDATE {KERNEL} SET correlationId = NULL WHERE rowid = {rowid}"
    )
    reads = _devices_read(monkeypatch)
    _assert_columns(path)
    assert [table for table, _ in reads] == [KERNEL]
    assert device == 1


def test_an_api_call_without_a_thread_launches_nothing(plain: Path, tmp_path: Path) -> None:
    """SQL keys a call with a NULL thread to no process; so does the reader."""
    with sqlite3.connect(plain) as conn:
        corr, tid = conn.execute(
            f"SELECT r.correlationId, r.globalTid FROM {RUNTIME} r JOIN {KERNEL} k "
            "ON k.correlationId = r.correlationId "
            f"AND ((r.globalTid >> 24) & 16777215) = {PROCESS.replace('globalPid', 'k.globalPid')} "
            "WHERE (r.globalTid >> 24) & 16777215 = "
            f"(SELECT max(processId) FROM {CONTEXTS}) LIMIT 1"
        ).fetchone()
    path = _changed(
        plain,
        tmp_path,
        f"UPDATE {RUNTIME} SET globalTid = NULL WHERE correlationId = {corr} AND globalTid = {tid}",
    )
    _assert_columns(path)
    cols = read_nsys_columns(path)
    assert (cols.arrays["launch_start"] == -1).sum() == 1


def test_text_in_a_start_time_is_one_clear_error(plain: Path, tmp_path: Path) -> None:
    path = _changed(plain, tmp_path, f"UPDATE {KERNEL} SET start = 'soon' WHERE rowid = 4321")
    with pytest.raises(BadInput, match=r"CUPTI_ACTIVITY_KIND_KERNEL.start holds text \('soon'\)"):
        read_nsys_columns(path)


def test_calls_stored_out_of_order_are_sorted_per_process(plain: Path, tmp_path: Path) -> None:
    """Real exports store each process's calls in correlation-id order; a table that does
    not (here: reversed) is sorted, and every activity still finds its own call."""
    path = _changed(
        plain,
        tmp_path,
        f"CREATE TABLE reversed AS SELECT * FROM {RUNTIME} ORDER BY rowid DESC",
        f"DELETE FROM {RUNTIME}",
        f"INSERT INTO {RUNTIME} SELECT * FROM reversed",
        "DROP TABLE reversed",
    )
    _assert_columns(path)
