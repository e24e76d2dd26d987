"""The framework and planted-problem captures (tests/data/frameworks/): real Nsight Systems
exports and torch.profiler traces of PyTorch Lightning and Hugging Face Trainer programs and
of examples/plants.py, taken on an H100 and two H200s by benchmarks/gpu_frameworks.sh. The
programs mark the truth of their phases themselves (examples/frameworks/README.md); these
tests check what every later test on them rests on: each capture is listed in its manifest,
and profkit reads every kernel the file holds, counted here with plain SQL and plain JSON."""

from __future__ import annotations

import gzip
import json
import lzma
import sqlite3
from pathlib import Path

import pytest

from profkit import analysis
from profkit.traces.job import load

FRAMEWORKS = Path(__file__).parent / "data" / "frameworks"
NSYS = sorted(FRAMEWORKS.glob("nsys-*.sqlite.xz"))
TORCH = sorted(FRAMEWORKS.glob("torch-*.json.gz"))


def test_every_capture_is_in_a_manifest() -> None:
    """Each file comes with the command that made it and what the program printed."""
    listed = set()
    for manifest in FRAMEWORKS.glob("manifest-*.json"):
        for capture in json.loads(manifest.read_text()):
            if capture["rc"] == 0:  # -1: skipped when the script's time budget ran out
                listed.update(capture["files"])
    assert {p.name for p in NSYS + TORCH} <= listed
    assert len(NSYS) == 17 and len(TORCH) == 25


@pytest.mark.parametrize("export", NSYS, ids=lambda p: p.name.removesuffix(".sqlite.xz"))
def test_every_kernel_of_an_export_is_read(export: Path, tmp_path: Path) -> None:
    plain = tmp_path / "export.sqlite"
    plain.write_bytes(lzma.decompress(export.read_bytes()))
    with sqlite3.connect(plain) as db:
        (kernels,) = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    report = analysis.kernel_report(load([plain], cache=False)).to_json()
    assert report["totals"]["kernels"] == kernels
    if "h200x2" in export.name:
        assert len(report["ranks"]) == 2


@pytest.mark.parametrize("trace", TORCH, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_every_kernel_of_a_torch_trace_is_read(trace: Path) -> None:
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    kernels = sum(1 for e in events if e.get("cat") == "kernel" and e.get("ph") == "X")
    report = analysis.kernel_report(load([trace], cache=False)).to_json()
    assert report["totals"]["kernels"] == kernels
