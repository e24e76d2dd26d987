"""One load for every command: traces.job.load reads each file's columns on its own and
says how they go together; the analysis is handed the job (tests/test_golden.py holds the
reports of every kind; this checks the kinds themselves, and what the loader refuses)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from nsys_data import PID, Export, unpack
from typer.testing import CliRunner

import profkit.traces.load as load_module
from profkit import analysis
from profkit.analysis.report_types import RankedReport
from profkit.cli import app
from profkit.errors import BadInput
from profkit.traces.columns import START
from profkit.traces.job import load

DATA = Path(__file__).parent / "data"
RANKS = [DATA / f"torch-h200x2-small-ddp2-rank{r}.json.gz" for r in (0, 1)]
TRAIN = DATA / "torch-small-ctx128-train.json.gz"
FP32_XZ = DATA / "nsys-2025.3-h100-small-fp32.sqlite.xz"
OTHER = 200
OTHER_MAIN = (1 << 48) | (OTHER << 24) | OTHER
MAIN = (1 << 48) | (PID << 24) | PID


def test_each_set_is_what_its_files_make() -> None:
    one = load([TRAIN], cache=False)
    assert (one.kind, one.why_apart, len(one.files)) == ("trace", None, 1)
    ranks = load(RANKS, cache=False)
    assert ranks.kind == "ranks" and ranks.paths == RANKS
    assert load(RANKS, cache=False, side_by_side=True).kind == "side_by_side"
    mixed = load([FP32_XZ, TRAIN], cache=False)  # another format: compared, nothing said
    assert (mixed.kind, mixed.why_apart) == ("side_by_side", None)
    assert [p.kind for p in mixed.parts()] == ["trace", "trace"]
    assert [p.files[0] for p in mixed.parts()] == mixed.files


def test_several_exports_keep_their_starts_and_one_gpu_runs_need_no_reason(
    tmp_path: Path,
) -> None:
    """Two one-GPU exports: each read with its GPU starts (either could be a node), no
    NCCL kernels, so compared, and no reason printed (the CLI says why only for multi-GPU
    exports, as it did)."""
    plain = unpack("nsys-2025.3-h100-small-fp32", tmp_path)
    job = load([plain, FP32_XZ], cache=False)
    assert job.kind == "side_by_side" and job.why_apart is None
    assert all(START in c.arrays for c in job.files)
    assert [f.nccl for f in job.facts] == [False, False]
    assert START not in load([plain], cache=False).files[0].arrays  # alone: the plain read


def test_what_is_refused_before_any_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(BadInput, match="no trace given"):
        load([])

    def no_read(*_: object, **__: object) -> None:
        raise AssertionError("a file was read before every path was checked")

    monkeypatch.setattr(load_module, "load_columns", no_read)
    with pytest.raises(BadInput, match="no such file"):
        load([TRAIN, tmp_path / "none.json.gz"])


def test_ranks_of_two_runs_are_refused_by_the_loader(tmp_path: Path) -> None:
    """Traces naming distinct ranks of runs of different world sizes: one line, from the
    load, whatever the command."""
    paths = []
    for rank, source in enumerate(RANKS):
        doc = json.loads(gzip.decompress(source.read_bytes()))
        doc["distributedInfo"]["world_size"] = 2 + rank
        paths.append(tmp_path / f"run-rank{rank}.json.gz")
        paths[-1].write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    with pytest.raises(BadInput, match="runs of different world sizes"):
        load(paths, cache=False)
    result = CliRunner().invoke(app, ["kernels", *map(str, paths)])
    assert result.exit_code == 2 and "different world sizes (2, 3)" in result.stderr


def test_what_the_columns_cannot_tell_is_one_line_not_another_read(tmp_path: Path) -> None:
    """Two ranks spell their forward phase in two cases: --phase forward would pick a
    phase for one rank that the whole trace does not; the full tables once gave a report
    there, the columns say so in one line (RanksUntold), from the one read."""
    export = Export(tmp_path / "cases.sqlite")
    for thread, pid, device, name in ((MAIN, PID, 0, "forward"), (OTHER_MAIN, OTHER, 1, "Forward")):
        export.range(name, 0, 1_000, thread=thread)
        export.kernel("gemm", 100, 10, launch_at=10, thread=thread, pid=pid, device=device)
    path = export.save()
    job = load([path], cache=False)
    assert isinstance(analysis.kernel_report(job), RankedReport)  # without --phase: fine
    result = CliRunner().invoke(app, ["kernels", str(path), "--no-cache", "--phase", "forward"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --phase 'forward' is 'forward' in the trace but 'Forward' on rank 1: give the "
        "phase as it is spelled on every rank"
    ]
