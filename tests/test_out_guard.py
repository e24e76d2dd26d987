"""``--out`` (and every other output) can never destroy an input, the results DB or data.

Each command that writes is run for real with its output aimed at what it reads, at the
results DB, or at an existing database, trace or snapshot: one line, exit status 2, and
the file is byte for byte what it was. Refused before any work, so no child runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_run import profkit as run_profkit

from profkit.errors import BadInput
from profkit.files import check_output, file_kind

DATA = Path(__file__).parent / "data"
RESULTS_DB = DATA / "results-h100.db"
PROBE_SQLITE = DATA / "nsys-2025.3-probe.sqlite"
TRACE = DATA / "torch-small-ctx128-forward.json.gz"
SNAPSHOT_XZ = DATA / "memory-tiny-ctx64-train-fp32.pickle.xz"
TINY = ["--size", "tiny", "--ctx", "16", "--steps", "2", "--warmup", "0", "--device", "cpu"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def profkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_profkit(*args, cwd=cwd, drop=("PROFKIT_DB",))


def refused(result: subprocess.CompletedProcess[str], words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def work(tmp_path: Path) -> Path:
    shutil.copy(RESULTS_DB, tmp_path / "r.db")
    shutil.copy(PROBE_SQLITE, tmp_path / "T.sqlite")
    shutil.copy(TRACE, tmp_path / "trace.json.gz")
    shutil.copy(SNAPSHOT_XZ, tmp_path / "snap.pickle.xz")
    return tmp_path


# (command line, the file --out names, what the message says): one per command that writes.
CASES = [
    (["bench", *TINY, "--db", "r.db", "--out", "r.db"], "r.db", "is the input r.db"),
    (["compare", "dtype", "--db", "r.db", "--out", "r.db"], "r.db", "is the input r.db"),
    (["report", "--db", "r.db", "--out", "r.db"], "r.db", "is the input r.db"),
    (
        ["report", "--run", "--plan", "minimal", "--profiles", "p", "--out", "p/results.db"],
        "p/results.db",
        "is the input p/results.db",
    ),  # the default DB, not there yet
    (["kernels", "T.sqlite", "--out", "T.sqlite"], "T.sqlite", "is the input T.sqlite"),
    (["kernels", "trace.json.gz", "--out", "./trace.json.gz"], "trace.json.gz", "is the input"),
    (["kernels", "run.nsys-rep", "--out", "run.sqlite"], "run.sqlite", "is the input run.sqlite"),
    (["diff", "T.sqlite", "trace.json.gz", "-o", "T.sqlite"], "T.sqlite", "is the input"),
    (["memory", "summarize", "snap.pickle.xz", "-o", "snap.pickle.xz"], "snap.pickle.xz", "input"),
    (["memory", "plot", "snap.pickle.xz", "-o", "snap.pickle.xz"], "snap.pickle.xz", "--out"),
    (["memory", "capture", *TINY, "--db", "r.db", "--out", "r.db"], "r.db", "is the input r.db"),
    (
        ["attention", "--seq", "8", "--d-head", "4", "--db", "r.db", "--out", "r.db"],
        "r.db",
        "input",
    ),
    (["torch", *TINY, "--out", "trace.json.gz"], "trace.json.gz", "is a compressed file"),
    (["sizes", "--out", "T.sqlite"], "T.sqlite", "is an SQLite database"),
    (["doctor", "--out", "r.db"], "r.db", "is an SQLite database"),
    (["precision", "accumulate", "--out", "snap.pickle.xz"], "snap.pickle.xz", "compressed"),
    (["demo", "--device", "cpu", "--report", "T.sqlite"], "T.sqlite", "is an SQLite database"),
]


@pytest.mark.parametrize(
    ("argv", "target", "words"), CASES, ids=[" ".join(c[0][:2]) for c in CASES]
)
def test_output_aimed_at_data_is_refused_before_work(
    work: Path, argv: list[str], target: str, words: str
) -> None:
    if target == "run.sqlite":  # an nsys report whose export is what --out names
        (work / "run.nsys-rep").write_bytes(b"not really a report")
        shutil.copy(PROBE_SQLITE, work / "run.sqlite")
    existed = (work / target).exists()
    before = digest(work / target) if existed else None
    result = profkit(*argv, cwd=work)
    refused(result, words)
    after = digest(work / target) if (work / target).exists() else None
    assert after == before
    assert not (work / "profiles").exists()  # nothing measured, nothing written


def test_symlink_and_hard_link_to_the_db_are_the_db(work: Path) -> None:
    (work / "link.db").symlink_to(work / "r.db")
    os.link(work / "r.db", work / "hard.db")
    before = digest(work / "r.db")
    for out in ("link.db", "hard.db", "sub/../r.db"):
        (work / "sub").mkdir(exist_ok=True)
        refused(profkit("compare", "dtype", "--db", "r.db", "--out", out, cwd=work), "is the input")
    assert digest(work / "r.db") == before


def test_the_sidecar_an_input_is_read_with_is_not_overwritten(tmp_path: Path) -> None:
    """``kernels`` and ``diff`` read ``NAME.profkit.json`` beside each input: an --out
    naming it, or a symlink to it, is refused and the sidecar stays as it was."""
    export = DATA / "nsys-2025.3-h100-small-fp32.sqlite.xz"
    sidecar = DATA / "nsys-2025.3-h100-small-fp32.profkit.json"
    shutil.copy(export, tmp_path / export.name)
    shutil.copy(sidecar, tmp_path / sidecar.name)
    (tmp_path / "link.md").symlink_to(tmp_path / sidecar.name)
    for out in (sidecar.name, "link.md"):
        result = profkit("kernels", export.name, "-f", "md", "--out", out, cwd=tmp_path)
        refused(result, "is a profkit sidecar")
    result = profkit("diff", export.name, export.name, "-o", sidecar.name, cwd=tmp_path)
    refused(result, "is a profkit sidecar")
    assert digest(tmp_path / sidecar.name) == digest(sidecar)


def test_kinds_told_by_content_and_text_outputs_rewritable(tmp_path: Path) -> None:
    (tmp_path / "old.md").write_text("| a |\n")
    (tmp_path / "old.json").write_text('[{"size": "tiny"}]')
    (tmp_path / "trace.json").write_text('{"schemaVersion": 1, "traceEvents": []}')
    (tmp_path / "snap.pickle").write_bytes(b"\x80\x04K\x01.")
    assert file_kind(tmp_path / "old.md") is None
    assert file_kind(tmp_path / "old.json") is None
    assert file_kind(tmp_path / "trace.json") == "a Chrome trace"
    assert file_kind(tmp_path / "snap.pickle") == "a pickle"
    assert file_kind(RESULTS_DB) == "an SQLite database"
    assert file_kind(SNAPSHOT_XZ) == "a compressed file"
    check_output(tmp_path / "old.md")  # an earlier output may be replaced
    check_output(tmp_path / "old.json", inputs=[tmp_path / "in.json"])
    with pytest.raises(BadInput, match="is a Chrome trace"):
        check_output(tmp_path / "trace.json")
    with pytest.raises(BadInput, match="is a pickle"):
        check_output(tmp_path / "snap.pickle")


def test_out_naming_a_file_the_run_writes_is_refused_before_work(tmp_path: Path) -> None:
    """`torch --out` onto the trace it is about to write replaced the trace with its
    markdown (the file did not exist yet, so no other check saw it). Refused, before any
    work; the paths the check uses are the ones a real run writes."""
    from profkit.torchprof.profile import written_paths
    from profkit.workload.config import WorkloadConfig

    run = ["torch", "--size", "tiny", "--ctx", "16", "--device", "cpu", "--steps", "1",
           "--warmup", "0", "--out-dir", "t"]  # fmt: skip
    refused(
        profkit(*run, "--out", "t/torch-tiny-ctx16-train.json.gz", cwd=tmp_path), "this run writes"
    )
    refused(profkit(*run, "--out", "./t/torch-tiny-ctx16.md", cwd=tmp_path), "this run writes")
    assert not (tmp_path / "t").exists()
    done = profkit(*run, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    config = WorkloadConfig(size="tiny", ctx=16, device="cpu", steps=1, warmup=0)
    planned = written_paths(config, None, Path("t"))
    assert sorted(str(p) for p in planned) == sorted(
        str(p.relative_to(tmp_path)) for p in (tmp_path / "t").iterdir()
    )
    refused(profkit("memory", "capture", "--size", "tiny", "--out",
                    "profiles/memory-tiny-ctx16-train-fp32.pickle", "--ctx", "16",
                    cwd=tmp_path), "this run writes")  # fmt: skip


def test_a_several_rank_capture_writes_one_snapshot_per_rank() -> None:
    from profkit.memory.capture import written_paths
    from profkit.workload.config import WorkloadConfig

    config = WorkloadConfig(size="tiny", ctx=16, nproc=2)
    names = [p.name for p in written_paths([config], Path("p"), None)]
    assert names == [
        "memory-tiny-ctx16-train-fp32-ddp2-rank0.pickle",
        "memory-tiny-ctx16-train-fp32-ddp2-rank0.profkit.json",
        "memory-tiny-ctx16-train-fp32-ddp2-rank1.pickle",
        "memory-tiny-ctx16-train-fp32-ddp2-rank1.profkit.json",
    ]


def test_two_outputs_into_one_file_are_refused_before_work(tmp_path: Path) -> None:
    """``kernels --plot o.png --out o.png`` drew the picture, then wrote the markdown over it."""
    from nsys_data import unpack

    export = unpack("nsys-2025.3-h200x2-small-ddp2", tmp_path)
    result = profkit("kernels", str(export), "--plot", "o.png", "--out", "./sub/../o.png",
                     cwd=tmp_path)  # fmt: skip
    refused(result, "--plot o.png is where --out writes too (sub/../o.png)")
    assert not (tmp_path / "o.png").exists()
