"""`profkit nsys`: the nsys argv, nsys discovery, the run pipeline, its files and its faults.

Nsight Systems cannot run on the CPU-only CI machine, so the pipeline tests put a clearly
labelled stand-in named ``nsys`` on PATH (:data:`STAND_IN`): a small script that runs the
program exactly as given (a real child process: the built-in workload's child or
``examples/user_train.py``), writes a placeholder ``.nsys-rep`` and exports a real (empty)
SQLite file. Everything profkit does around nsys is real; only nsys's own capture is not.
The kernel analysis (`_post_process`) belongs to `profkit kernels` and is stood in for here;
the end-to-end tests at the bottom run the real thing on a GPU machine with nsys.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import profkit.nsys.profile
from profkit.cli import app
from profkit.errors import BadInput, MissingTool, ProfkitError, ProfkitWarning
from profkit.nsys.argv import NsysOptions, RunFiles, check_name, default_name, profile_argv
from profkit.nsys.profile import _check_capture
from profkit.nsys.record import python_phase_times, run_section
from profkit.run.proc import Outcome, kill_tree, run_logged
from profkit.run.tools import find_nsys
from profkit.sidecar import read_sidecar, sidecar_path
from profkit.workload.config import WorkloadConfig

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "user_train.py"
EXAMPLE_ARGS = ["--steps", "2", "--warmup", "1", "--batch", "2", "--ctx", "16", "--d-model", "32"]
runner = CliRunner()

# A STAND-IN for nsys (not Nsight Systems): runs the program, fakes the capture's files.
STAND_IN = '''#!{python}
"""Stand-in for nsys in CPU tests: runs the program for real; the report is a placeholder."""
import json, os, signal, sqlite3, subprocess, sys
args = sys.argv[1:]
if os.environ.get("STAND_IN_ARGV"):
    with open(os.environ["STAND_IN_ARGV"], "a") as f:
        f.write(json.dumps(sys.argv) + "\\n")
if args == ["--version"]:
    print("NVIDIA Nsight Systems version 2025.3.1.90-253135822126v0 (stand-in)")
    sys.exit(0)
if args[0] == "profile":
    flags = []
    while args[1:] and args[1].startswith("-"):
        flags.append(args.pop(1))
    program = args[1:]
    output = next(f.split("=", 1)[1] for f in flags if f.startswith("--output="))
    if os.environ.get("STAND_IN_FAIL"):
        print("Collecting data...")
        print("Error: stand-in nsys refused: " + os.environ["STAND_IN_FAIL"], file=sys.stderr)
        sys.exit(1)
    # like nsys, run the program in a process group of its own
    child = subprocess.Popen(program, start_new_session=True)
    stopped = []
    def stop(signum, frame):  # like nsys on SIGINT: stop the program, then write the report
        stopped.append(signum)
        os.killpg(child.pid, signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN if os.environ.get("STAND_IN_DEAF") else stop)
    rc = child.wait()
    if not os.environ.get("STAND_IN_NO_REPORT"):
        with open(output, "w") as f:
            f.write("stand-in report\\n")
        print("Generated:\\n    " + output)
    sys.exit(130 if stopped else rc)
if args[0] == "export":
    output = args[args.index("--output") + 1]
    if os.path.exists(output):
        os.remove(output)
    sqlite3.connect(output).execute("CREATE TABLE StringIds (id INTEGER, value TEXT)").connection.commit()
    sys.exit(0)
sys.exit(f"stand-in nsys: unexpected arguments {{args}}")
'''


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in nsys on PATH; the test runs in tmp_path (profiles/, reports/ land there)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = _executable(bin_dir / "nsys", STAND_IN.format(python=sys.executable))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PROFKIT_NSYS", raising=False)
    monkeypatch.setenv("STAND_IN_ARGV", str(tmp_path / "argv.jsonl"))
    # the built-in child must import this checkout's profkit from tmp_path
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.chdir(tmp_path)
    return exe


@pytest.fixture
def analysis(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, str]]:
    """Stands in for `profkit kernels`' analysis; records what it was asked to read."""
    calls: list[tuple[Path, str]] = []

    def post_process(sqlite_path: Path, name: str) -> str:
        calls.append((sqlite_path, name))
        return f"# Kernels: {name}\n\n(kernel tables of {sqlite_path.name})\n"

    monkeypatch.setattr(profkit.nsys.profile, "_post_process", post_process)
    return calls


# --- the nsys argv ------------------------------------------------------------------------

REPORT = Path("profiles/run.nsys-rep")
BASE = ["nsys", "profile", "--output=profiles/run.nsys-rep", "--force-overwrite=true"]


@pytest.mark.parametrize(
    ("options", "builtin", "expected"),
    [
        (
            NsysOptions(),
            True,
            [*BASE, "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
             "--capture-range=cudaProfilerApi", "--capture-range-end=stop"],
        ),
        (
            NsysOptions(),
            False,
            [*BASE, "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none"],
        ),
        (
            NsysOptions(trace="cuda,nvtx,osrt", cuda_memory=True, python_backtrace=True,
                        sample=True),
            True,
            [*BASE, "--trace=cuda,nvtx,osrt", "--sample=process-tree",
             "--cpuctxsw=process-tree", "--capture-range=cudaProfilerApi",
             "--capture-range-end=stop", "--cuda-memory-usage=true", "--python-backtrace=cuda"],
        ),
        (
            NsysOptions(capture_range="cudaProfilerApi", extra_args=("--stats=true", "-w", "true")),
            False,
            [*BASE, "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
             "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
             "--stats=true", "-w", "true"],
        ),
        (
            NsysOptions(capture_range="nvtx",
                        extra_args=("--nvtx-capture=train", "--capture-range-end=repeat:3")),
            False,
            [*BASE, "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
             "--capture-range=nvtx", "--nvtx-capture=train", "--capture-range-end=repeat:3"],
        ),
        (
            NsysOptions(capture_range="none"),
            True,
            [*BASE, "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none"],
        ),
    ],
    ids=["builtin-default", "program-default", "all-flags", "passthrough", "nvtx-range",
         "builtin-whole-run"],
)  # fmt: skip
def test_profile_argv_golden(options: NsysOptions, builtin: bool, expected: list[str]) -> None:
    assert profile_argv("nsys", REPORT, options, builtin) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trace": "cuda nvtx"}, "--trace takes comma-separated API names"),
        ({"trace": ""}, "--trace takes comma-separated API names"),
        ({"capture_range": "steps"}, "unknown --capture-range 'steps'"),
        ({"python_backtrace": True, "trace": "nvtx"}, "keep cuda in --trace"),
        ({"extra_args": ("--trace=osrt",)}, "profkit sets --trace itself; use --trace"),
        ({"extra_args": ("-o", "x")}, "profkit sets -o itself; use --name/--out-dir"),
        ({"extra_args": ("--sample=cpu",)}, "use --sample"),
        ({"extra_args": ("--capture-range=nvtx",)}, "use --capture-range"),
    ],
)
def test_bad_options_are_bad_input(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInput, match=message.replace("(", r"\(")):
        NsysOptions(**kwargs)


@pytest.mark.parametrize(
    ("target", "name"),
    [
        (WorkloadConfig(size="large", ctx=256), "large-ctx256-train-fp32"),
        (WorkloadConfig(size="small", ctx=128, dtype="bf16", compile=True),
         "small-ctx128-train-bf16-compiled"),
        (["python", "my_train.py", "--lr", "3e-4"], "my_train"),
        (["python3", "-u", "scripts/run v2.py"], "run-v2"),
        (["python", "-m", "pkg.train", "--x"], "train"),
        (["./run.sh", "a.txt"], "run"),
    ],
)  # fmt: skip
def test_default_names(target: Any, name: str) -> None:
    assert default_name(target) == name


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "-rf", "two words", ".."])
def test_names_must_be_plain_file_names(bad: str) -> None:
    with pytest.raises(BadInput, match="--name must be a plain file name"):
        check_name(bad)


# --- finding nsys ---------------------------------------------------------------------------


def test_nsys_discovery_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = {}
    for where in ("flag", "env", "path"):
        (tmp_path / where).mkdir()
        found[where] = _executable(tmp_path / where / "nsys", "#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    monkeypatch.setenv("PROFKIT_NSYS", str(found["env"]))
    assert find_nsys(found["flag"]) == found["flag"]
    assert find_nsys(None) == found["env"]
    monkeypatch.delenv("PROFKIT_NSYS")
    assert find_nsys(None) == found["path"]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(MissingTool, match="Nsight Systems \\(nsys\\) was not found"):
        find_nsys(None)


def test_a_relative_nsys_is_made_absolute_and_a_bare_name_is_a_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``./nsys`` as a Path prints ``nsys``, which exec would look up on PATH instead."""
    here = _executable(tmp_path / "nsys", "#!/bin/sh\n")
    (tmp_path / "bin").mkdir()
    other = _executable(tmp_path / "bin" / "nsys-2025.3", "#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("PROFKIT_NSYS", raising=False)
    assert find_nsys("./nsys") == here and find_nsys(Path("./nsys")) == here
    assert find_nsys("nsys-2025.3") == other
    with pytest.raises(MissingTool, match="--nsys points to bin/nsys, which is not an"):
        find_nsys("bin/nsys")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_non_executable_nsys_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    plain = tmp_path / "nsys"
    plain.write_text("not a program\n")
    args = ["nsys", "--dry-run", "--", sys.executable, str(EXAMPLE)]
    if how == "flag":
        args[1:1] = ["--nsys", str(plain)]
    else:
        monkeypatch.setenv("PROFKIT_NSYS", str(plain))
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    origin = "--nsys" if how == "flag" else "PROFKIT_NSYS"
    assert result.stderr == f"error: {origin} points to {plain}, which is not an executable file\n"


def test_an_nsys_that_cannot_run_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = _executable(tmp_path / "nsys", "not a program at all\n")  # executable bit, no format
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["nsys", "--nsys", str(broken), "--", sys.executable, "-c", "1"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == f"error: cannot run {broken}: Exec format error"


def test_missing_nsys_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("PROFKIT_NSYS", raising=False)
    result = runner.invoke(app, ["nsys", "--", sys.executable, str(EXAMPLE)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: Nsight Systems (nsys) was not found: install")
    assert "--nsys PATH" in result.stderr and len(result.stderr.splitlines()) == 1


# --- the command line -----------------------------------------------------------------------


def test_help() -> None:
    result = runner.invoke(app, ["nsys", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in ("--name", "--nsys", "--trace", "--cuda-memory", "--python-backtrace",
                 "--sample", "--capture-range", "--nsys-arg", "--out-dir", "--dry-run"):  # fmt: skip
        assert flag in result.stdout
    assert "overwritten" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "csv"], "unknown --format 'csv'; choose one of: table, md, json"),
        (["--trace", "cuda;osrt"], "--trace takes comma-separated API names"),
        (["--capture-range", "steps"], "unknown --capture-range 'steps'"),
        (["--nsys-arg=--output=x"], "profkit sets --output itself"),
        (["--name", "a/b"], "--name must be a plain file name"),
        (["--size", "huge"], "unknown size 'huge'"),
        (["--size", "small", "medium"], "`profkit nsys` runs one config; got 2"),
        (["--ctx", "0"], "--ctx must be between 1 and"),
        (["--size", "tiny", "--", "python", "x.py"], "--size: workload options apply to"),
        (["--steps", "3", "--bf16", "--", "python", "x.py"], "--bf16, --steps: workload options"),
        (["--", "no-such-program-here", "x"], "program not found on PATH: no-such-program-here"),
        (["--", "./no/such/script.sh"], "program not found: ./no/such/script.sh"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str, stand_in: Path) -> None:
    result = runner.invoke(app, ["nsys", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on CPU-only machines")
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_builtin_model_without_cuda_exits_2(device: str, stand_in: Path) -> None:
    result = runner.invoke(app, ["nsys", "--size", "tiny", "--device", device])
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "error: nsys profiling of the built-in model needs a CUDA device"
    )
    assert "profkit nsys -- python train.py" in result.stderr
    assert not Path("profiles").exists()  # nothing started, nothing written


def test_dry_run_prints_the_exact_command(stand_in: Path) -> None:
    result = runner.invoke(
        app, ["nsys", "--size", "large", "--ctx", "256", "--bf16", "--cuda-memory", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    config = WorkloadConfig(size="large", ctx=256, dtype="bf16").to_json()
    prefix = (
        f"{stand_in} profile --output=profiles/large-ctx256-train-bf16.nsys-rep "
        "--force-overwrite=true --trace=cuda,nvtx --sample=none --cpuctxsw=none "
        "--capture-range=cudaProfilerApi --capture-range-end=stop --cuda-memory-usage=true "
        f"{sys.executable} -m profkit.run.child --config '{config}' --result "
    )
    assert result.stdout.startswith(prefix)
    assert result.stdout.rstrip().endswith("/result.json --capture cuda-profiler-api")
    program = runner.invoke(
        app, ["nsys", "--dry-run", "--nsys-arg", "--stats=true", "--", "python", "t.py", "-x"]
    )
    assert program.stdout == (
        f"{stand_in} profile --output=profiles/t.nsys-rep --force-overwrite=true "
        "--trace=cuda,nvtx --sample=none --cpuctxsw=none --stats=true python t.py -x\n"
    )


# --- the pipeline, with the stand-in nsys ---------------------------------------------------


def test_user_program_end_to_end(stand_in: Path, analysis: list[tuple[Path, str]]) -> None:
    program = [sys.executable, str(EXAMPLE), *EXAMPLE_ARGS]
    result = runner.invoke(app, ["nsys", "--format", "json", "--", *program])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)  # stdout is the JSON record and nothing else
    profiles = Path("profiles")
    files = {p.name for p in profiles.iterdir()}
    assert files == {
        "user_train.nsys-rep", "user_train.sqlite", "user_train.profkit.json",
        "user_train.nsys.log",
    }  # fmt: skip
    assert analysis == [(profiles / "user_train.sqlite", "user_train")]
    assert json.loads((profiles / "user_train.profkit.json").read_text()) == record
    assert record["config"] is None and record["program"] == program
    assert record["result"]["status"] == "ok" and record["result"]["returncode"] == 0
    assert record["nsys"]["version"] == "2025.3.1.90"
    assert record["nsys"]["returncode"] == 0
    calls = [json.loads(line) for line in Path("argv.jsonl").read_text().splitlines()]
    profile_call = next(c for c in calls if c[1] == "profile")
    assert profile_call[1:] == [*record["nsys"]["argv"][1:], *program]
    assert set(record["timings_s"]) == {"nsys_profile", "export", "analysis", "total"}
    timings = record["timings_s"]
    assert timings["total"] >= timings["nsys_profile"] + timings["export"] + timings["analysis"]
    # the program's own output streamed through to stderr, and is in the log
    assert "step 1: loss" in result.stderr
    log = (profiles / "user_train.nsys.log").read_text()
    assert "step 1: loss" in log and "2 steps on cpu: " in log  # the example ran to its end
    report = Path("reports/user_train.md").read_text()
    assert report.startswith("# Kernels: user_train\n")
    assert "## Run" in report and "### Where the command's time went" in report
    assert "wrote profiles/user_train.nsys-rep" in result.stderr


def test_builtin_workload_end_to_end_records_python_phase_times(
    stand_in: Path, analysis: list[tuple[Path, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The one fake beyond nsys: pretend CUDA is here so the real child runs (on the CPU).
    monkeypatch.setattr(profkit.nsys.profile, "require_cuda", lambda config: None)
    args = ["nsys", "--size", "tiny", "--ctx", "16", "--warmup", "1", "--steps", "3",
            "--name", "tiny-run", "--format", "md"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(Path("profiles/tiny-run.profkit.json").read_text())
    config = WorkloadConfig(size="tiny", ctx=16, warmup=1, steps=3)
    assert record["config"] == config.to_dict()
    child = record["result"]
    assert child["status"] == "ok" and child["device"] == "cpu"
    assert len(child["steps"]) == 3 and len(child["warmup_steps"]) == 1
    assert all(s["forward_ms"] > 0 and s["optimizer_ms"] > 0 for s in child["steps"])
    assert "--capture-range=cudaProfilerApi" in record["nsys"]["argv"]
    calls = [json.loads(line) for line in Path("argv.jsonl").read_text().splitlines()]
    profile_call = next(c for c in calls if c[1] == "profile")
    assert profile_call[-2:] == ["--capture", "cuda-profiler-api"]
    assert analysis == [(Path("profiles/tiny-run.sqlite"), "tiny-run")]
    assert result.stdout == Path("reports/tiny-run.md").read_text()
    assert "### Python time per phase" in result.stdout
    assert "| optimizer | 3 |" in result.stdout


def test_nsys_failure_gives_its_output_tail_and_the_log(
    stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_FAIL", "no permission to trace")
    result = runner.invoke(app, ["nsys", "--", sys.executable, "-c", "pass"])
    name = Path(sys.executable).stem  # "python" or "python3": the program names the run
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "error: nsys or the program failed (exit status 1): Error: stand-in nsys refused: "
        f"no permission to trace; full output in profiles/{name}.nsys.log"
    )
    log = Path(f"profiles/{name}.nsys.log").read_text()
    assert "Collecting data..." in log  # the whole output, nsys's stdout included
    assert sorted(p.name for p in Path("profiles").iterdir()) == [
        f"{name}.nsys.log", f"{name}.profkit.json"
    ]  # fmt: skip


def test_program_failure_keeps_the_report(stand_in: Path, analysis: list[Any]) -> None:
    script = Path("crash.py")
    script.write_text("import sys\nprint('training...')\nsys.exit('CUDA out of memory')\n")
    result = runner.invoke(app, ["nsys", "--", sys.executable, str(script)])
    assert result.exit_code == 2 and analysis == []
    assert result.stderr.splitlines()[-1] == (
        "error: the program failed under nsys (error: program ended with exit status 1); "
        "kept profiles/crash.nsys-rep, profiles/crash.profkit.json; full output in "
        "profiles/crash.nsys.log; `profkit kernels profiles/crash.nsys-rep` reads what was "
        "captured"
    )
    record = read_sidecar(Path("profiles/crash.sqlite"))
    assert record is not None and record["result"]["returncode"] == 1
    assert "CUDA out of memory" in Path("profiles/crash.nsys.log").read_text()


def test_no_report_is_an_error(stand_in: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAND_IN_NO_REPORT", "1")
    result = runner.invoke(app, ["nsys", "--name", "quiet", "--", sys.executable, "-c", "pass"])
    assert result.exit_code == 2
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: nsys wrote no report: ")
    assert last.endswith("full output in profiles/quiet.nsys.log")


def test_same_name_overwrites_the_earlier_run(
    stand_in: Path, analysis: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    program = ["--name", "again", "--", sys.executable, "-c", "print('one run')"]
    assert runner.invoke(app, ["nsys", *program]).exit_code == 0
    stale = Path("profiles/again.sqlite")
    assert stale.exists()
    monkeypatch.setenv("STAND_IN_FAIL", "second run")
    result = runner.invoke(app, ["nsys", *program])
    assert result.exit_code == 2
    assert "replacing the earlier run's files named again" in result.stderr
    # the failed run leaves no file of the first run that could pass for its own
    assert not stale.exists() and not Path("reports/again.md").exists()
    assert not Path("profiles/again.nsys-rep").exists()


def test_analysis_failure_keeps_the_capture(
    stand_in: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_kernels(sqlite_path: Path, name: str) -> str:
        raise BadInput(f"{sqlite_path}: no CUDA kernels were traced")

    monkeypatch.setattr(profkit.nsys.profile, "_post_process", no_kernels)
    result = runner.invoke(app, ["nsys", "--name", "k", "--", sys.executable, "-c", "pass"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "error: profiles/k.sqlite: no CUDA kernels were traced "
        "(kept profiles/k.nsys-rep, profiles/k.sqlite)"
    )
    assert json.loads(Path("profiles/k.profkit.json").read_text())["timings_s"]["export"] >= 0


def _outcome(tmp_path: Path, returncode: int | None, output: str) -> Outcome:
    log = tmp_path / "profiles" / "run.nsys.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(output)
    return Outcome(returncode, 1.0, log, timed_out=returncode is None)


@pytest.mark.parametrize(
    ("result", "wrote", "report", "rc", "message"),
    [
        ({"status": "oom", "error": "CUDA out of memory. Tried to allocate 2.00 GiB"}, True,
         True, 0, "the built-in workload failed under nsys (oom: CUDA out of memory. Tried to "
         "allocate 2.00 GiB); kept {d}/run.nsys-rep; full output in {d}/run.nsys.log; "
         "`profkit kernels {d}/run.nsys-rep` reads what was captured"),
        ({"status": "error", "error": "RuntimeError: boom"}, True, False, 0,
         "the built-in workload failed under nsys (RuntimeError: boom); no report; "
         "full output in {d}/run.nsys.log"),
        ({"status": "error", "error": "child exited with status 1 without a result"}, False,
         False, 1, "nsys failed (exit status 1): Error: unrecognised option '--bogus'; "
         "full output in {d}/run.nsys.log"),
        ({"status": "ok", "error": None}, True, False, 0,
         "nsys wrote no report: Error: unrecognised option '--bogus'; "
         "full output in {d}/run.nsys.log"),
        ({"status": "error", "error": "timed out"}, False, False, None,
         "nsys run timed out; no files kept; full output in {d}/run.nsys.log"),
    ],
    ids=["oom-kept", "error-no-report", "nsys-failed", "no-report", "timed-out"],
)  # fmt: skip
def test_builtin_failures_name_what_failed_and_what_was_kept(
    tmp_path: Path,
    result: dict[str, Any],
    wrote: bool,
    report: bool,
    rc: int | None,
    message: str,
) -> None:
    files = RunFiles("run", tmp_path / "profiles", tmp_path / "reports")
    outcome = _outcome(tmp_path, rc, "Collecting data...\nError: unrecognised option '--bogus'\n")
    if report:
        files.report.write_text("report")
    with pytest.raises(ProfkitError) as caught:
        _check_capture(result, outcome, files, wrote, builtin=True)
    assert str(caught.value) == message.format(d=files.out_dir)


# --- Ctrl-C and process trees -------------------------------------------------------------


def _wait_for(path: Path, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _gone(pid: int, timeout_s: float = 10) -> bool:
    """Whether ``pid`` ends within ``timeout_s`` (SIGKILL takes a moment to land)."""
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"  # a zombie is dead, only not yet reaped by its parent


SLEEPER = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(120)\n"


def test_kill_tree_reaches_a_regrouped_grandchild(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    # the middle process starts the sleeper in a session of its own, as nsys may do
    middle = (
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', {SLEEPER!r}, {str(pid_file)!r}], "
        "start_new_session=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", middle], start_new_session=True)
    grandchild = int(_wait_for(pid_file))
    kill_tree(proc)
    proc.wait(timeout=10)
    assert _gone(grandchild)


def test_run_logged_times_out_and_keeps_the_log(tmp_path: Path) -> None:
    code = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"
    outcome = run_logged([sys.executable, "-c", code], tmp_path / "x.log", timeout_s=1)
    assert outcome.timed_out and outcome.returncode is None
    assert outcome.last_line() == "started"


def test_the_error_line_is_the_error_not_the_usage_hint(tmp_path: Path) -> None:
    # what nsys 2025.3 printed for an unknown flag, on the H100
    nsys_said = (
        "unrecognised option '--bogus-flag=1'\n\n"
        "usage: nsys profile [<args>] [application] [<application args>]\n"
        "Try 'nsys profile --help' for more information.\n"
    )
    outcome = _outcome(tmp_path, 1, nsys_said)
    assert outcome.error_line() == "unrecognised option '--bogus-flag=1'"
    assert _outcome(tmp_path, 0, "Generated:\n\tNo reports were generated\n").error_line() == (
        "No reports were generated"
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_nsys_and_the_program_and_keeps_the_report(
    stand_in: Path, sig: signal.Signals
) -> None:
    pid_file = Path("program.pid").resolve()
    cmd = [sys.executable, "-m", "profkit", "nsys", "--name", "stopped", "--",
           sys.executable, "-c", SLEEPER, str(pid_file)]  # fmt: skip
    profkit_proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    program = int(_wait_for(pid_file))
    profkit_proc.send_signal(sig)
    _, stderr = profkit_proc.communicate(timeout=60)
    assert profkit_proc.returncode == 130, stderr
    assert "stopping: nsys is writing the report of what it captured" in stderr
    assert (
        "stopped; kept profiles/stopped.nsys-rep, profiles/stopped.profkit.json, "
        "profiles/stopped.nsys.log\n" in stderr
    )
    assert "interrupted; results already written are kept" in stderr
    assert _gone(program)
    record = json.loads(Path("profiles/stopped.profkit.json").read_text())
    assert record["result"]["status"] == "interrupted"


def test_a_command_deaf_to_ctrl_c_is_killed_with_its_tree(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    deaf = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + SLEEPER
    middle = (  # the middle process ignores SIGINT and regroups the sleeper, as nsys may
        "import signal, subprocess, sys\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        f"subprocess.run([sys.executable, '-c', {deaf!r}, {str(pid_file)!r}], "
        "start_new_session=True)\n"
    )
    main = threading.main_thread().ident
    assert main is not None

    def ctrl_c() -> None:  # a real SIGINT to the main thread, blocked in waitpid, as a tty does
        _wait_for(pid_file)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=ctrl_c).start()
    stopping: list[bool] = []
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_logged(
            [sys.executable, "-c", middle], tmp_path / "x.log", stop_grace_s=0.5,
            on_stopping=lambda: stopping.append(True),
        )  # fmt: skip
    assert stopping == [True] and time.monotonic() - started < 30
    assert _gone(int(pid_file.read_text()))


# --- the sidecar and the run section ------------------------------------------------------

RESULT = {
    "status": "ok",
    "steps": [
        {"forward_ms": 10.0, "backward_ms": 20.0, "optimizer_ms": 5.0},
        {"forward_ms": 12.0, "backward_ms": 22.0, "optimizer_ms": 5.0},
        {"forward_ms": 11.0, "backward_ms": 30.0, "optimizer_ms": 6.0},
    ],
}


def test_python_phase_times_golden() -> None:
    table = python_phase_times(RESULT)
    assert table["phase"].tolist() == ["forward", "backward", "optimizer", "step"]
    assert table["total_ms"].tolist() == [33.0, 72.0, 16.0, 121.0]
    assert table["median_ms"].tolist() == [11.0, 22.0, 5.0, 39.0]
    assert table.loc[3, "min_ms"] == 35.0 and table.loc[3, "max_ms"] == 47.0
    forward_only = {"steps": [{"forward_ms": 2.0, "backward_ms": None, "optimizer_ms": None}]}
    assert python_phase_times(forward_only)["phase"].tolist() == ["forward", "step"]
    assert python_phase_times({"status": "ok"}).empty


def test_run_section_shows_command_phases_and_timings() -> None:
    record = {
        "name": "large-ctx256-train-fp32",
        "config": WorkloadConfig(size="large", ctx=256).to_dict(),
        "nsys": {"argv": ["nsys", "profile", "--trace=cuda,nvtx"], "version": "2025.3.1"},
        "result": RESULT,
        "timings_s": {"nsys_profile": 40.0, "export": 8.0, "analysis": 2.0, "total": 51.0},
    }
    text = run_section(record)
    assert "Built-in model `large-ctx256-train-fp32`: size large, ctx 256, batch 4" in text
    assert "Nsight Systems 2025.3.1:\n\n```\nnsys profile --trace=cuda,nvtx ...\n```" in text
    assert "| step | 3 | 121.00 | 40.33 | 39.00 | 35.00 | 47.00 |" in text
    assert "| other (setup, nsys lookup, files) | 1.00 |" in text
    assert "| total | 51.00 |" in text


def test_sidecar_sits_beside_either_trace(tmp_path: Path) -> None:
    assert sidecar_path(Path("p/run.v2.sqlite")) == Path("p/run.v2.profkit.json")
    assert sidecar_path(Path("p/run.nsys-rep")) == Path("p/run.profkit.json")
    assert read_sidecar(tmp_path / "none.sqlite") is None
    (tmp_path / "bad.profkit.json").write_text("{not json")
    with pytest.warns(ProfkitWarning, match="ignored .*bad.profkit.json: not valid JSON"):
        assert read_sidecar(tmp_path / "bad.sqlite") is None


# --- end to end with the real Nsight Systems (GPU machine) ----------------------------------


@pytest.mark.gpu
@pytest.mark.nsys
def test_real_nsys_builtin_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    args = ["nsys", "--size", "tiny", "--ctx", "32", "--warmup", "1", "--steps", "2", "-f", "json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["result"]["status"] == "ok" and record["result"]["device"].startswith("cuda")
    assert Path("profiles/tiny-ctx32-train-fp32.sqlite").stat().st_size > 0
    assert "## Run" in Path("reports/tiny-ctx32-train-fp32.md").read_text()


@pytest.mark.gpu
@pytest.mark.nsys
def test_real_nsys_user_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    result = runner.invoke(app, ["nsys", "--", sys.executable, str(EXAMPLE), *EXAMPLE_ARGS])
    assert result.exit_code == 0, result.output
    assert Path("profiles/user_train.sqlite").stat().st_size > 0
    assert Path("reports/user_train.md").exists()
