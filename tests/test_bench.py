"""``profkit bench``: the JSON contract, the DB, --resume, failing and interrupted sweeps.

Every sweep here is real: each config runs in its own ``python -m profkit.run.child`` process
on the CPU with the tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from profkit.cli import app
from profkit.run import bench as bench_lib
from profkit.workload import flops
from profkit.workload.config import WorkloadConfig

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--size", "tiny", "--ctx", "16", "--steps", "2", "--device", "cpu"]
# Warm-up steps no test waits for: the config that has it is killed (timeout or Ctrl-C).
ENDLESS_WARMUP = "987654321"

runner = CliRunner()


def invoke(*args: str) -> Any:
    return runner.invoke(app, ["bench", *args])


def db_count(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return int(conn.execute("select count(*) from bench").fetchone()[0])
    except sqlite3.Error:
        return 0  # not created yet


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One real sweep shared by the contract tests: forward and train, 1 warm-up, 2 steps."""
    db = tmp_path_factory.mktemp("sweep") / "results.db"
    result = invoke(
        *FAST, "--mode", "forward", "train", "--warmup", "1", "--db", str(db), "-f", "json"
    )
    assert result.exit_code == 0, result.output
    return db, json.loads(result.stdout)  # stdout is the JSON and nothing else


def test_json_rows_follow_the_contract(sweep: tuple[Path, list[dict[str, Any]]]) -> None:
    _, rows = sweep
    assert [r["mode"] for r in rows] == ["forward", "train"]
    for row in rows:
        assert list(row)[: len(bench_lib.CONTRACT_FIELDS)] == list(bench_lib.CONTRACT_FIELDS)
        assert row["status"] == "ok" and row["error"] is None
        assert (row["size"], row["ctx"], row["batch"], row["device"]) == ("tiny", 16, 4, "cpu")
        assert (row["warmup"], row["steps"], row["compile"]) == (1, 2, False)
        assert row["mfu"] is None and row["peak_memory_gib"] is None  # CPU
        assert len(row["step_times_ms"]) == 2 and len(row["warmup_step_times_ms"]) == 1
        assert row["step_ms"] == pytest.approx(sum(row["step_times_ms"]) / 2)
        assert row["step_ms_min"] <= row["step_ms_median"] <= row["step_ms_max"]
        assert row["tokens_per_s"] == pytest.approx(4 * 16 / (row["step_ms"] / 1e3))
        step_flops = flops.step_flops(WorkloadConfig(size="tiny", ctx=16, mode=row["mode"]))
        assert row["flops_per_step"] == step_flops.step
        assert row["tflops"] == pytest.approx(step_flops.step / (row["step_ms"] / 1e3) / 1e12)
        assert row["torch_version"] == torch.__version__ and row["finished_at"]
    forward, train = rows
    assert forward["backward_ms"] is None and forward["optimizer_ms_std"] is None
    assert forward["step_ms"] == pytest.approx(forward["forward_ms"])
    assert train["step_ms"] == pytest.approx(
        train["forward_ms"] + train["backward_ms"] + train["optimizer_ms"]
    )


def test_db_holds_the_same_rows(sweep: tuple[Path, list[dict[str, Any]]]) -> None:
    db, rows = sweep
    stored = bench_lib.load(db)
    assert [{k: r[k] for k in bench_lib.CONTRACT_FIELDS} for r in stored] == [
        {k: r[k] for k in bench_lib.CONTRACT_FIELDS} for r in rows
    ]
    assert stored[1]["step_times_ms"] == rows[1]["step_times_ms"]


def test_one_process_rows_have_no_parallelism(
    sweep: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    db, rows = sweep
    assert [(r["nproc"], r["parallel"]) for r in rows] == [(1, None), (1, None)]
    assert [r["parallel"] for r in bench_lib.load(db)] == [None, None]
    # Rows written before the field was null said "ddp" for one process: read as null.
    old = tmp_path / "old.db"
    old.write_bytes(db.read_bytes())
    with sqlite3.connect(old) as conn:
        conn.execute("update bench set parallel = 'ddp'")
    assert [r["parallel"] for r in bench_lib.load(old)] == [None, None]


def test_a_sweep_where_every_config_failed_exits_2_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    result = invoke(*FAST, "--mode", "forward", "train", "--timeout", "0.5", "--db", str(db),
                    "-f", "json")  # fmt: skip
    assert result.exit_code == 2, result.output
    rows = json.loads(result.stdout)  # rendered before the exit
    assert [r["status"] for r in rows] == ["error", "error"]
    assert all(r["error"] == "timed out after 0.5 s" for r in rows)
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: every config failed (2 with status error); the rows, with their errors, "
        f"are in {db}"
    )
    assert db_count(db) == 2


def test_resume_skips_configs_already_done(
    sweep: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    db = tmp_path / "results.db"
    db.write_bytes(sweep[0].read_bytes())
    args = [*FAST, "--warmup", "1", "--db", str(db), "--resume", "-f", "json"]
    again = invoke(*args, "--mode", "forward", "train")
    assert again.exit_code == 0, again.output
    assert "skipped" in again.stderr and db_count(db) == 2
    assert json.loads(again.stdout) == json.loads(json.dumps(sweep[1]))
    more = invoke(*args, "--mode", "forward", "forward-backward", "train")
    assert more.exit_code == 0, more.output
    assert db_count(db) == 3  # only the new config ran
    assert [r["mode"] for r in json.loads(more.stdout)] == ["forward", "forward-backward", "train"]


@pytest.mark.slow
def test_a_killed_config_becomes_an_error_row_and_the_sweep_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    result = invoke(
        *FAST, "--mode", "forward", "--warmup", "1", ENDLESS_WARMUP, "2",
        "--timeout", "12", "--db", str(db), "-f", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["status"] for r in rows] == ["ok", "error", "ok"]
    assert rows[1]["error"].startswith("timed out after 12 s")
    assert rows[1]["step_ms"] is None and rows[1]["tflops"] is None
    assert [r["status"] for r in bench_lib.load(db)] == ["ok", "error", "ok"]


def test_interrupted_sweep_keeps_finished_rows(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    # A warm-up count unique to this run: the orphan check below must not see another
    # session's test children on a shared machine.
    endless = str(int(ENDLESS_WARMUP) + os.getpid() % 100_000)
    argv = [
        sys.executable, "-m", "profkit", "bench", *FAST, "--mode", "forward",
        "--warmup", "0", endless, "--db", str(db),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while db_count(db) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert db_count(db) == 1, "the first config never finished"
        time.sleep(1.0)  # the second child is now running its endless warm-up
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    rows = bench_lib.load(db)
    assert [(r["warmup"], r["status"]) for r in rows] == [(0, "ok")]
    # The running child was ended with its parent, not orphaned.
    time.sleep(0.5)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert f'"warmup": {endless}' not in text, f"orphaned child {cmdline.parent.name}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size", "huge"], "unknown size 'huge'; choose one of: tiny, small"),
        (["--size", "tiny", "--ctx", "0"], "--ctx must be between 1 and"),
        (["--size", "tiny", "--ctx", "100000000"], "--ctx must be between 1 and"),
        (["--size", "tiny", "--steps", "0"], "--steps must be at least 1"),
        (["--size", "tiny", "--warmup", "-1"], "--warmup must be 0 or more"),
        (["--size", "tiny", "--steps", str(10**20)], "--steps must be at most 2,147,483,647"),
        (["--size", "tiny", "--warmup", str(2**31)], "--warmup must be at most 2,147,483,647"),
        (["--size", "tiny", "--mode", "inference"], "unknown --mode 'inference'"),
        (["--size", "tiny", "--compile", "maybe"], "unknown --compile 'maybe'"),
        (["--size", "tiny", "--format", "xml"], "unknown --format 'xml'"),
        (["--size", "tiny", "--timeout", "0"], "--timeout must be a positive number of seconds"),
        (["--size", "tiny", "--device", "tpu"], "unknown --device 'tpu'"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    db = tmp_path / "results.db"
    result = invoke(*args, "--db", str(db))
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert not db.exists()  # rejected before anything ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_fails_before_any_child(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    started = time.monotonic()
    result = invoke("--size", "tiny", "--device", "cuda", "--db", str(db))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --device cuda: no CUDA device is visible here (try --device cpu)"
    )
    assert not db.exists() and time.monotonic() - started < 5


def test_corrupt_db_and_unwritable_out_fail_before_the_sweep(tmp_path: Path) -> None:
    corrupt = tmp_path / "results.db"
    corrupt.write_bytes(b"\x00garbage" * 100)
    result = invoke(*FAST, "--db", str(corrupt))
    assert result.exit_code == 2
    assert "is not a SQLite database" in result.stderr and result.stderr.count("\n") == 1
    assert corrupt.read_bytes() == b"\x00garbage" * 100  # left as it was

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    db = tmp_path / "fresh.db"
    for bad in ("--out", "--db"):
        target = str(blocker / "out.md") if bad == "--out" else str(blocker / "r.db")
        args = ["--out", target, "--db", str(db)] if bad == "--out" else ["--db", target]
        result = invoke(*FAST, *args)
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"error: cannot write {target}")
    assert not db.exists()


def test_table_marks_failed_rows_and_drops_empty_columns() -> None:
    config = WorkloadConfig(size="2.7B", ctx=4096, mode="train", device="cuda")
    # What the child reports for a CUDA OOM (no CUDA here to produce one for real).
    oom = {
        "status": "oom",
        "error": "CUDA out of memory. Tried to allocate 8.00 GiB.",
        "device": "cuda",
        "peak_memory_bytes": 75 * 1024**3,
    }
    env = {"gpu_name": "NVIDIA H100 80GB HBM3", "torch_version": "2.11.0"}
    row = bench_lib.bench_row(config, oom, env)
    assert row["status"] == "oom" and row["step_ms"] is None and row["mfu"] is None
    assert row["peak_memory_gib"] == 75.0 and row["gpu_name"] == env["gpu_name"]
    assert row["peak_tflops"] == 66.9  # fp32 without TF32 on an H100 SXM
    table = bench_lib.table([row])
    assert list(table.columns) == ["size", "ctx", "mode", "dtype", "status", "peak GiB", "error"]
    assert "H100" in bench_lib.title([row])


@pytest.mark.parametrize("command", ["bench", "doctor", "demo"])
def test_help(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output


def test_options_are_documented_in_help() -> None:
    text = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"}).output
    for option in ("--size", "--ctx", "--mode", "--dtype", "--bf16", "--compile", "--warmup",
                   "--db", "--resume", "--timeout", "--format", "--out"):  # fmt: skip
        assert option in text
