"""Findings of a new user's pass over every command: bad input is caught early and said once.

Each bad input must exit 2 with exactly one line on stderr (no blank line before it, no
traceback, no half-done work), checked through the real CLI on real files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from nsys_data import PROBE, SMALL_FP32, sql_activity_totals, unpack
from typer.testing import CliRunner

from profkit.cli import app

runner = CliRunner()
DATA = Path(__file__).parent / "data"
SNAPSHOT = DATA / "memory-tiny-ctx64-train-fp32.pickle.xz"


def invoke(*args: str | Path) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def one_error(result: Any, *needles: str) -> str:
    """Assert exit 2, nothing on stdout and exactly one ``error:`` line on stderr."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == "", result.stdout
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return str(result.stderr)


def test_memory_summarize_unknown_device() -> None:
    one_error(invoke("memory", "summarize", SNAPSHOT, "--device", "5"), "no device 5; devices: 0")
    one_error(invoke("memory", "summarize", SNAPSHOT, "--device", "-1"), "no device -1")
    assert invoke("memory", "summarize", SNAPSHOT, "--device", "0").exit_code == 0


def test_kernels_negative_tolerance_is_rejected_before_reading() -> None:
    for value in ("-3", "nan"):
        one_error(
            invoke("kernels", "missing-a", "missing-b", "--compare", "--tolerance", value),
            "--tolerance must be >= 0",
        )


def test_kernels_help_says_two_paths_compare() -> None:
    result = invoke("kernels", "--help")
    assert result.exit_code == 0
    assert "Two or more paths compare" in " ".join(result.stdout.split())


def test_kernels_unknown_phase_lists_only_phases_present(tmp_path: Path) -> None:
    small = unpack(SMALL_FP32, tmp_path)
    message = one_error(invoke("kernels", small, "--phase", "bogus"))
    assert message.endswith("phases: forward, backward, optimizer\n"), message
    # The probe capture has kernels outside every phase: there `unattributed` is a phase.
    message = one_error(invoke("kernels", PROBE, "--phase", "bogus"))
    assert message.endswith("phases: forward, backward, unattributed\n"), message
    assert invoke("kernels", PROBE, "--phase", "unattributed").exit_code == 0


def test_kernels_reads_a_compressed_export_directly_and_keeps_it(tmp_path: Path) -> None:
    xz = DATA / f"{SMALL_FP32}.sqlite.xz"
    packed = invoke("kernels", xz, "--format", "json")
    assert packed.exit_code == 0, packed.stderr
    unpacked = unpack(SMALL_FP32, tmp_path)
    plain = invoke("kernels", unpacked, "--format", "json")
    packed_json, plain_json = json.loads(packed.stdout), json.loads(plain.stdout)
    assert packed_json["totals"] == plain_json["totals"]
    totals = packed_json["totals"]
    activities = totals["kernels"] + totals["memcpy"] + totals["memset"]
    assert activities == sql_activity_totals(unpacked)[0] == 4_028
    assert totals["kernels"] == 3_858  # kernel launches alone
    assert packed_json["source"]["path"] == str(xz)
    assert packed_json["source"]["config"]["size"] == "small"  # the sidecar beside the .xz
    assert xz.is_file()


def test_nsys_dry_run_json_without_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys anywhere
    monkeypatch.delenv("PROFKIT_NSYS", raising=False)
    python = sys.executable
    result = invoke("nsys", "--dry-run", "--format", "json", "--", python, "t.py", "-x")
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["argv"][:2] == ["nsys", "profile"] and plan["argv"][-3:] == [python, "t.py", "-x"]
    assert plan["nsys_found"] is False
    assert plan["files"]["sqlite"] == "profiles/t.sqlite"
    assert plan["files"]["markdown"] == "reports/t.md"
    assert result.stderr == "note: nsys is not on PATH; the command shows it as `nsys`\n"
    text = invoke("nsys", "--dry-run", "--", python, "t.py")
    assert text.exit_code == 0 and text.stdout.startswith(
        "nsys profile --output=profiles/t.nsys-rep"
    )
    assert not (tmp_path / "profiles").exists() and not Path("profiles/t.sqlite").exists()
    # --out-dir holds every file the run writes, its report too.
    planned = invoke(
        "nsys", "--dry-run", "--format", "json", "--out-dir", "o", "--", python, "t.py"
    )
    files = json.loads(planned.stdout)["files"]
    assert {Path(f).parent for f in files.values()} == {Path("o")}


# --- bad output paths are caught before the work ----------------------------------------------

PROC = Path("/proc")
needs_proc = pytest.mark.skipif(not PROC.is_dir(), reason="needs Linux /proc (unwritable as root)")


@needs_proc
@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--size", "tiny", "--out", "/proc/x.md"],
        ["attention", "--d-head", "16", "--seq", "16", "--db", "/proc/x.db"],
        ["demo", "--report", "/proc/x.md"],
        ["sizes", "--out", "/proc/x.csv"],
        ["doctor", "--out", "/proc/x.md"],
    ],
)
def test_unwritable_paths_fail_before_any_work(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [*args, "--db", str(tmp_path / "r.db")] if args[0] == "bench" else args
    args = [*args, "--profiles", str(tmp_path / "p")] if args[0] == "demo" else args
    one_error(invoke(*args), "cannot write /proc/x.")
    assert list(tmp_path.iterdir()) == []  # no DB, no profiles, no report


def test_a_parent_that_is_a_file_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file\n")
    one_error(
        invoke("sizes", "--out", blocker / "sub" / "x.md"),
        f"its parent {blocker} is a file, not a directory",
    )
    one_error(
        invoke("compare", "dtype", "--db", tmp_path),
        f"{tmp_path} is a directory, not a results database",
    )


def test_demo_unknown_device_before_any_step(tmp_path: Path) -> None:
    result = invoke("demo", "--device", "tpu", "--profiles", tmp_path / "p", "--report", "r.md")
    one_error(result, "unknown --device 'tpu'; choose one of: auto, cpu, cuda, mps")
    assert not (tmp_path / "p").exists()


def test_interrupted_sweep_leaves_no_empty_db(tmp_path: Path) -> None:
    from profkit.run.bench import bench
    from profkit.run.results import record, rows
    from profkit.workload.config import WorkloadConfig

    def stop(_index: int, _config: WorkloadConfig) -> None:
        raise KeyboardInterrupt

    db = tmp_path / "profiles" / "results.db"
    with pytest.raises(KeyboardInterrupt):
        bench([WorkloadConfig(size="tiny", device="cpu")], db, on_start=stop)
    assert not db.exists()
    record(db, "notes", {"x": 1})  # a DB with rows is kept by the same interruption
    with pytest.raises(KeyboardInterrupt):
        bench([WorkloadConfig(size="tiny", device="cpu")], db, on_start=stop)
    assert rows(db, "notes") == [{"x": 1}]


# --- errors are one line: no blank line left by a progress bar ----------------------------------

no_cuda = pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the no-CUDA message"
)


@no_cuda
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["torch", "--size", "tiny", "--device", "cuda"], "--device cuda: no CUDA device"),
        (["memory", "capture", "--size", "tiny"], "memory snapshots need a CUDA device"),
        (["attention", "--d-head", "16", "--seq", "16", "--device", "cuda"], "no CUDA device"),
    ],
)
def test_no_cuda_errors_are_one_line(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    one_error(invoke(*args), message)


@needs_proc
def test_torch_unwritable_out_dir_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    one_error(invoke("torch", "--size", "tiny", "--out-dir", "/proc/x"), "/proc/x")


def test_flags_render_as_flags_in_help() -> None:
    result = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout
    assert "<list[str]>" in result.stdout  # options that take values keep their type
