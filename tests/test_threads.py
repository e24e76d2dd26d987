"""Honest numbers on a busy CPU: the thread count a measurement uses, and unstable timings.

Real sweeps: children are started with a restricted CPU affinity or ``--threads`` and the
count they really ran with (``torch.get_num_threads()`` in the child) is read back from
the results DB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profkit.run import bench as bench_lib
from profkit.run.stability import coefficient_of_variation, unstable
from profkit.run.threads import choose_threads, usable_cores
from profkit.workload.config import WorkloadConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--size", "tiny", "--ctx", "16", "--steps", "3", "--warmup", "0", "--device", "cpu"]


def bench(tmp: Path, *args: str, omp: str | None, cpus: set[int] | None = None) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_NUM_THREADS", None)
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    result = subprocess.run(
        [sys.executable, "-m", "profkit", "bench", *TINY, *args, "--db", "r.db", "-f", "json"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_threads_option_is_what_the_child_runs_with(tmp_path: Path) -> None:
    rows = bench(tmp_path, "--threads", "2", omp="1")
    assert [(r["threads"], r["threads_source"]) for r in rows] == [(2, "--threads")]
    stored = bench_lib.load(tmp_path / "r.db")
    assert [(r["threads"], r["threads_source"]) for r in stored] == [(2, "--threads")]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_without_a_setting_the_sweep_uses_the_cores_it_may_run_on(tmp_path: Path) -> None:
    one_cpu = {min(os.sched_getaffinity(0))}
    rows = bench(tmp_path, omp=None, cpus=one_cpu)
    assert rows[0]["threads"] == 1
    assert rows[0]["threads_source"].startswith("1 usable cores, ")


def test_omp_num_threads_is_an_explicit_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert choose_threads() == choose_threads(None)
    assert (choose_threads().threads, choose_threads().reason) == (3, "OMP_NUM_THREADS")
    assert (choose_threads(5).threads, choose_threads(5).reason) == (5, "--threads")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert 1 <= choose_threads().threads <= usable_cores()


def test_bad_thread_count_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "profkit", "bench", *TINY, "--threads", "0", "--db", "r.db"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == "error: --threads must be between 1 and 1024, got 0\n"
    assert not (tmp_path / "r.db").exists()


def _row(step_ms: list[float]) -> dict:
    config = WorkloadConfig(size="tiny", ctx=16, steps=len(step_ms), mode="forward", device="cpu")
    steps = [{"forward_ms": t} for t in step_ms]
    return bench_lib.bench_row(config, {"status": "ok", "steps": steps, "threads": 1}, {})


def test_spread_or_too_few_steps_mark_a_row_unstable() -> None:
    assert coefficient_of_variation([10.0, 12.0, 14.0]) == pytest.approx(2.0 / 12.0)
    assert unstable([10.0, 12.0, 14.0])  # cv 16.7%
    assert not unstable([10.0, 10.5, 11.0])  # cv 4.8%
    assert unstable([10.0, 10.0])  # too few to know
    shaky, steady, short = _row([10.0, 12.0, 14.0]), _row([10.0, 10.5, 11.0]), _row([5.0, 5.0])
    assert (shaky["unstable"], steady["unstable"], short["unstable"]) == (True, False, True)
    assert shaky["step_cv"] == pytest.approx(1 / 6)
    table = bench_lib.table([shaky, steady, short])
    assert list(table["cv %"].fillna(-1)) == [16.7, 4.8, 0.0]
    assert "unstable: step times spread > 10% (cv %) or fewer than 3 steps" in bench_lib.title(
        [shaky, steady]
    )
    assert "cv %" not in bench_lib.table([steady]).columns
