"""The results DB: typed columns, immediate commits, and clear errors for bad files."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profkit.errors import BadInput
from profkit.run import results
from profkit.run.environment import environment
from profkit.workload.config import WorkloadConfig


def test_record_commits_at_once_and_keeps_numbers_numeric(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "results.db"
    # A first row of nulls (an OOM) must not make the columns TEXT for the rows after it.
    results.record(db, "memory", {"size": "xl", "peak_gib": None, "steps": [1, 2]})
    results.record(db, "memory", {"size": "small", "peak_gib": 1.5, "new": 3})
    with sqlite3.connect(db) as other:  # a second connection sees both rows: committed
        got = other.execute("select size, peak_gib, typeof(peak_gib), new from memory").fetchall()
    assert got == [("xl", None, "null", None), ("small", 1.5, "real", 3)]
    rows = results.rows(db, "memory")
    assert rows[0]["steps"] == "[1, 2]"  # JSON text; readers decode what they know
    assert results.rows(db, "nothing_here") == []


def test_explicit_column_types_win(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    results.record(db, "t", {"x": None}, column_types={"x": float})
    results.record(db, "t", {"x": "2.5"})
    assert [r["x"] for r in results.rows(db, "t")] == [None, 2.5]


def test_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "notes.db"
    bad.write_text("these are my notes, not a database\n" * 20)
    with pytest.raises(BadInput, match="not a SQLite database"):
        results.open_db(bad)


def test_corrupt_database(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t (i integer, text text)")
        conn.executemany("insert into t values (?, ?)", [(i, "x" * 200) for i in range(400)])
    conn.close()
    data = db.read_bytes()
    # Keep the header, wreck the pages after it.
    db.write_bytes(data[:4096] + b"\xff" * (len(data) - 4096))
    with pytest.raises(BadInput, match="not a usable SQLite database"):
        results.open_db(db)


def test_unwritable_paths(tmp_path: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(BadInput, match="cannot write"):
        results.open_db(a_file / "results.db")
    with pytest.raises(BadInput, match="is a directory"):
        results.open_db(tmp_path)
    with pytest.raises(BadInput, match="no results database"):
        results.rows(tmp_path / "missing.db", "bench")


def test_config_key_ignores_labels_but_not_device_or_gpu() -> None:
    config = WorkloadConfig(size="tiny", device="cpu")
    labelled = config.replace(extra={"note": "x"})
    assert results.config_key(config, "cpu") == results.config_key(labelled, "cpu")
    assert results.config_key(config, "cpu") != results.config_key(config, "cuda", "H100")
    assert results.config_key(config, "cpu") != results.config_key(config.replace(steps=3), "cpu")


def test_environment_record() -> None:
    env = environment()
    assert env["torch_version"] and env["python_version"] and env["hostname"]
    assert env["timestamp_utc"].endswith("Z")
    assert env["profkit_version"]
    if env["git_commit"] is not None:  # run from a checkout
        assert len(env["git_commit"]) == 40


CONCURRENT_WRITER = """
import sys, time
from profkit.run import results
db, index, start_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
time.sleep(max(0.0, start_at - time.time()))  # every writer starts at the same instant
for k in range(3):
    results.record(db, "bench", {"writer": index, "k": k, "step_ms": 1.5 * index, "extra_%d" % index: k})
"""


@pytest.mark.parametrize("trial", range(4))
def test_concurrent_processes_creating_one_new_db_lose_no_row(tmp_path: Path, trial: int) -> None:
    """Six real processes record their first rows into one new DB at the same moment."""
    db = tmp_path / "results.db"
    writers = 6
    start_at = time.time() + 2.0  # time for every interpreter to import and wait
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_WRITER, str(db), str(i), repr(start_at)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(writers)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * writers, errors
    got = results.rows(db, "bench")
    assert sorted((r["writer"], r["k"]) for r in got) == [
        (i, k) for i in range(writers) for k in range(3)
    ]
    # Every writer's own column was added, and holds its values in its own rows.
    for row in got:
        assert row[f"extra_{row['writer']}"] == row["k"]
        assert row["step_ms"] == 1.5 * row["writer"]
