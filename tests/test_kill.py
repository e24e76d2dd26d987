"""Killing a sweep, however it is killed, leaves no child running and no temporary files.

Real processes throughout: ``python -m profkit bench`` / ``report --run`` / ``attention``
are started, their child is found in ``/proc``, and the parent is sent SIGKILL or SIGTERM.
TMPDIR points into the test's own directory so leftovers are seen exactly.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profkit.run import proc as proc_lib

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--size", "tiny", "--ctx", "16", "--steps", "2", "--device", "cpu"]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def start(args: list[str], tmp: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    return subprocess.Popen(
        [sys.executable, "-m", "profkit", *args],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def wait_for_child(parent: subprocess.Popen[str], marker: str, timeout_s: float = 120) -> int:
    """The pid of the parent's descendant whose command line holds ``marker``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and parent.poll() is None:
        for pid in proc_lib.descendants(parent.pid):
            if marker in cmdline(pid):
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no child with {marker!r} appeared")


def watching(pid: int, timeout_s: float = 60) -> None:
    """Wait until the child runs its parent watcher: SIGTERM is then blocked in its mask."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        blocked = int(
            next(x for x in status.splitlines() if x.startswith("SigBlk:")).split()[1], 16
        )
        if blocked & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.05)
    raise AssertionError("the child never started watching its parent")


def gone_within(pid: int, marker: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if marker not in cmdline(pid):  # dead (and reaped, or a zombie with no cmdline)
            return True
        time.sleep(0.05)
    return False


def leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("profkit-*"))


def rows(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            return int(conn.execute("select count(*) from bench").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def endless(tag: int) -> str:
    """A warm-up count no test waits for, unique to this test run (the /proc search key)."""
    return str(900_000_000 + os.getpid() % 100_000 * 10 + tag)


def test_sigkill_of_bench_kills_its_child_and_the_child_removes_its_temp(tmp_path: Path) -> None:
    warmup = endless(1)
    parent = start(["bench", *FAST, "--warmup", warmup, "--db", "r.db"], tmp_path)
    try:
        child = wait_for_child(parent, f'"warmup": {warmup}')
        watching(child)
        parent.kill()
        parent.wait()
        assert gone_within(child, f'"warmup": {warmup}', 5.0), "child outlived its parent"
    finally:
        parent.kill()
        parent.communicate()
    deadline = time.monotonic() + 5
    while leftovers(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leftovers(tmp_path) == []


def test_sigterm_of_bench_is_ctrl_c_finished_rows_kept_child_and_temp_gone(tmp_path: Path) -> None:
    warmup = endless(2)
    db = tmp_path / "r.db"
    argv = ["bench", *FAST, "--mode", "forward", "--warmup", "0", warmup, "--db", "r.db"]
    parent = start(argv, tmp_path)
    try:
        child = wait_for_child(parent, f'"warmup": {warmup}')
        assert rows(db) == 1  # the first config finished before the endless one started
        parent.send_signal(signal.SIGTERM)
        _, stderr = parent.communicate(timeout=60)
    finally:
        parent.kill()
    assert parent.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert gone_within(child, f'"warmup": {warmup}', 5.0)
    assert rows(db) == 1
    assert leftovers(tmp_path) == []


def test_a_stale_temp_dir_of_a_dead_run_is_removed_by_the_next(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"profkit-child-{dead.pid}-abc"
    stale.mkdir()
    (stale / "result.json.tmp").write_text("{")
    mine = tmp_path / f"profkit-child-{os.getpid()}-abc"
    mine.mkdir()
    assert proc_lib.remove_stale_tempdirs(tmp_path) == [stale]
    assert leftovers(tmp_path) == [mine.name]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_report_run_leaves_no_child(tmp_path: Path, sig: signal.Signals) -> None:
    """Killed the moment its first child appears, still starting up: it dies all the same."""
    parent = start(["report", "--run", "--plan", "minimal", "--profiles", "p"], tmp_path)
    try:
        child = wait_for_child(parent, "profkit.run.child")
        parent.send_signal(sig)
        parent.communicate(timeout=60)
        assert gone_within(child, "profkit.run.child", 5.0), "child outlived report --run"
    finally:
        parent.kill()
    if sig == signal.SIGTERM:
        assert parent.returncode == 130
        assert leftovers(tmp_path) == []
    else:
        # A child SIGKILLed by the kernel before its watcher ran cannot clean up: the next
        # run removes what a dead owner left (and nothing of a live one).
        proc_lib.remove_stale_tempdirs(tmp_path)
        assert leftovers(tmp_path) == []


def attention_rows(db: Path) -> list[tuple[int, str, int]]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        try:
            query = "select seq, status, pid from attention order by rowid"
            return [(int(s), str(st), int(p)) for s, st, p in conn.execute(query)]
        except sqlite3.OperationalError:
            return []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_attention_grid_keeps_finished_cells_and_resume_runs_the_rest(
    tmp_path: Path, sig: signal.Signals
) -> None:
    db = tmp_path / "r.db"
    # Cells of growing cost: the first two take a fraction of a second, the last seconds.
    grid = ["--d-head", "16", "--seq", "32", "48", "256", "--iters", "300", "--warmup", "0"]
    argv = ["attention", *grid, "--device", "cpu", "--db", "r.db"]
    parent = start(argv, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while len(attention_rows(db)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        parent.send_signal(sig)
        _, stderr = parent.communicate(timeout=60)
    finally:
        parent.kill()
    if sig == signal.SIGTERM:  # as Ctrl-C: the table of what finished, then exit 130
        assert parent.returncode == 130 and "Traceback" not in stderr
    kept = attention_rows(db)
    assert [(seq, status) for seq, status, _ in kept][:2] == [(32, "ok"), (48, "ok")]
    assert len(kept) in (2, 3)
    resumed = subprocess.run(
        [sys.executable, "-m", "profkit", *argv, "--resume", "--format", "json"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    after = attention_rows(db)
    assert after[: len(kept)] == kept  # the finished cells were not run again
    assert sorted(seq for seq, status, _ in after if status == "ok") == [32, 48, 256]
