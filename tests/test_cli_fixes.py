"""Findings of a new user's pass over every command: bad input is caught early and said once.

Each bad input must exit 2 with exactly one line on stderr (no blank line before it, no
traceback, no half-done work), checked through the real CLI on real files.
"""

from __future__ import annotations

import hashlib
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


def test_kernels_help_says_what_several_paths_do() -> None:
    result = invoke("kernels", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "several nodes' reports of one job" in text  # read as one job, per rank
    assert "Other sets of traces are compared side by side" in text


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
    assert "<list[str]>" not in result.stdout  # a list option takes names: --size SIZE...
    assert "SIZE..." in result.stdout and "<int>" in result.stdout  # one value keeps its type


# --- a second new user's pass: outputs into inputs, help, a trace as the results DB -----------


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--size", "tiny", "--ctx", "16", "--steps", "1", "--device", "cpu"],
        ["attention", "--d-head", "4", "--seq", "8", "--iters", "1", "--device", "cpu"],
        ["compare", "dtype"],
        ["report", "--profiles", "none"],
    ],
    ids=lambda args: args[0],
)
def test_an_nsys_export_is_refused_as_the_results_db(args: list[str], tmp_path: Path) -> None:
    """Before: bench and attention wrote their rows into the export; compare and report
    found "no bench rows" in it."""
    export = tmp_path / "run.sqlite"
    export.write_bytes(PROBE.read_bytes())
    before = file_digest(export)
    one_error(
        invoke(
            *args, "--db", export, *(["--out", tmp_path / "r.md"] if args[0] == "report" else [])
        ),
        f"{export} is an Nsight Systems export, not a results database (give --db another file",
    )
    assert file_digest(export) == before


@pytest.mark.parametrize("args", [[], ["memory"], ["precision"]], ids=" ".join)
def test_a_group_without_a_command_prints_its_help_and_no_empty_error(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 2  # a usage error, as click has it
    assert "Usage:" in result.stdout and "Commands" in result.stdout
    assert result.stderr == ""  # before: "error:  (see `profkit --help`)"


def test_an_out_dir_that_is_a_file_is_one_line_before_any_work(tmp_path: Path) -> None:
    taken = tmp_path / "run.sqlite"
    taken.write_bytes(PROBE.read_bytes())
    before = file_digest(taken)
    for command in (["torch", "--size", "tiny", "--device", "cpu"], ["memory", "--size", "tiny"]):
        one_error(
            invoke(*command, "--out-dir", taken), f"--out-dir {taken} is a file, not a directory"
        )
        one_error(
            invoke(*command, "--out-dir", taken / "sub"),
            f"cannot create {taken / 'sub'}: its parent {taken} is a file, not a directory",
        )
    assert file_digest(taken) == before and sorted(tmp_path.iterdir()) == [taken]


RANK_TRACES = [DATA / f"torch-h200x2-small-ddp2-rank{r}.json.gz" for r in (0, 1)]


@pytest.mark.parametrize(
    ("plot", "message"),
    [
        ("rank0", "is the input"),  # a copy of the rank-0 trace
        ("ranks.gif", "ranks.gif: the picture must end in .png, .svg, .pdf"),  # was a traceback
        ("ranks.json.gz", "the picture must end in"),  # was matplotlib's ValueError
    ],
)
def test_kernels_plot_is_checked_as_an_output_before_reading(
    plot: str, message: str, tmp_path: Path
) -> None:
    copies = [tmp_path / p.name for p in RANK_TRACES]
    for source, copy in zip(RANK_TRACES, copies, strict=True):
        copy.write_bytes(source.read_bytes())
    target = copies[0] if plot == "rank0" else tmp_path / plot
    one_error(invoke("kernels", *copies, "--plot", target), message)
    assert file_digest(copies[0]) == file_digest(RANK_TRACES[0])


def test_kernels_plot_of_compared_traces_is_refused_not_ignored(tmp_path: Path) -> None:
    traces = [
        DATA / "torch-small-ctx128-forward.json.gz",
        DATA / "torch-small-ctx128-train.json.gz",
    ]
    picture = tmp_path / "ranks.png"
    one_error(
        invoke("kernels", *traces, "--plot", picture),
        "--plot draws the ranks of one multi-GPU run; these traces are compared side by side",
    )
    assert not picture.exists()


def test_help_paragraphs_are_one_line_each_so_the_terminal_wraps_them() -> None:
    """Typer kept the docstring's line breaks: at 80 columns, lines ended in fragments."""
    from typer.main import get_command

    group = get_command(app)
    for name in ("attention", "bench", "compare", "nsys", "report"):
        help_text = group.commands[name].help  # type: ignore[attr-defined]
        assert all("\n" not in p for p in help_text.split("\n\n")), name
    result = runner.invoke(app, ["attention", "--help"], env={"COLUMNS": "80"})
    assert " the device synchronised after each; " in result.stdout  # not "the" / "device..."
