"""What can be checked before the work is checked before it: nothing is measured or drawn
only to be thrown away. Real runs; the point is what did not happen (no child ran, no file)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from cli_run import profkit as run_profkit

SNAPSHOT = Path(__file__).parent / "data" / "memory-tiny-ctx64-forward-fp32.pickle.xz"
BENCH = ["bench", "--size", "tiny", "--ctx", "16", "--steps", "2", "--device", "cpu"]
ATTENTION = ["attention", "--seq", "16", "--d-head", "8", "--iters", "1", "--device", "cpu"]


def profkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_profkit(*args, cwd=cwd, env={"TMPDIR": str(cwd)})


def foreign_db(path: Path, schema: str) -> bytes:
    with sqlite3.connect(path) as conn:
        conn.executescript(schema)
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize(
    ("argv", "schema", "words"),
    [
        (
            BENCH,
            "create table bench (owner text not null, size text); insert into bench values ('me', 'x');",
            "cannot take profkit's bench rows: NOT NULL constraint failed: bench.owner",
        ),
        (
            BENCH,
            "create table t (a int); create view bench as select a from t;",
            "has a view named 'bench'",
        ),
        (
            ATTENTION,
            "create table attention (owner text not null);",
            "cannot take profkit's attention rows: NOT NULL constraint failed: attention.owner",
        ),
        (
            ATTENTION,
            "create table t (a int); create view attention as select a from t;",
            "has a view named 'attention'",
        ),
    ],
    ids=["bench-not-null", "bench-view", "attention-not-null", "attention-view"],
)
def test_db_that_cannot_take_the_rows_is_refused_before_measuring(
    tmp_path: Path, argv: list[str], schema: str, words: str
) -> None:
    db = tmp_path / "r.db"
    before = foreign_db(db, schema)
    result = profkit(*argv, "--db", "r.db", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    assert db.read_bytes() == before  # untouched: the probe row was rolled back
    assert not list(tmp_path.glob("profkit-*"))  # no child ever started


def test_memory_plot_bad_format_draws_nothing(tmp_path: Path) -> None:
    shutil.copy(SNAPSHOT, tmp_path / "snap.pickle.xz")
    result = profkit("memory", "plot", "snap.pickle.xz", "--format", "xml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "error: unknown --format 'xml'; choose one of: table, json\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap.pickle.xz"]
