"""A real training loop that never marked its phases, captured on an H200 by both backends.

``benchmarks/capture_unannotated.py`` (a two-layer ``nn.TransformerEncoder`` LM, AdamW,
gradient clipping, no ``profkit.phase`` and no NVTX range) under Nsight Systems (3 steps)
and torch.profiler (2 steps). profkit infers forward / backward / optimizer; the expected
numbers are computed here from the raw files where a rule says what they must be.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest
from nsys_data import DATA, unpack
from typer.testing import CliRunner

from profkit.cli import app

NSYS = "nsys-2025.3-h200-unannotated-train"
TORCH = DATA / "torch-h200-unannotated-train.json.gz"
runner = CliRunner()


def _kernels(path: Path) -> dict:
    result = runner.invoke(app, ["kernels", str(path), "--format", "json", "--top", "0"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def nsys_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(NSYS, tmp_path_factory.mktemp("unannotated"))


def _sql(path: Path, query: str) -> tuple:
    with sqlite3.connect(path) as db:
        return db.execute(query).fetchone()


AUTOGRAD_KERNELS = """
    select count(*), sum(k.end - k.start) from CUPTI_ACTIVITY_KIND_KERNEL k
    join CUPTI_ACTIVITY_KIND_RUNTIME r on r.correlationId = k.correlationId
    join ThreadNames t on t.globalTid = r.globalTid join StringIds s on s.id = t.nameId
    where s.value like 'pt_autograd%'"""


def test_nsys_phases_are_inferred_from_the_autograd_thread(nsys_export: Path) -> None:
    report = _kernels(nsys_export)
    assert report["source"]["phase_source"] == "inferred"
    phases = {p["phase"]: p for p in report["phases"]}
    assert list(phases) == ["forward", "backward", "optimizer"]  # nothing unattributed
    assert (
        report["totals"]["kernels"]
        == _sql(nsys_export, "select count(*) from CUPTI_ACTIVITY_KIND_KERNEL")[0]
        == 504
    )
    # backward = every kernel launched from autograd's worker thread, plus the one seed fill
    # (ones_like of the loss) launched on the main thread right before each of the 3 passes.
    autograd, _ = _sql(nsys_export, AUTOGRAD_KERNELS)
    assert (autograd, phases["backward"]["kernels"]) == (321, 321 + 3)
    # optimizer = the main thread's launches after the backward up to the last optimizer
    # kernel: clip_grad_norm_'s norms and AdamW's foreach kernels (30 multi_tensor_apply).
    foreach = _sql(
        nsys_export,
        "select count(*) from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s on s.id = k.shortName"
        " where s.value = 'multi_tensor_apply_kernel'",
    )[0]
    assert (foreach, phases["optimizer"]["kernels"]) == (30, 54)
    assert phases["forward"]["kernels"] == 504 - 324 - 54


def test_both_backends_infer_the_same_step() -> None:
    """torch.profiler (2 steps) and nsys (3 steps) of the same loop: equal per step."""
    with gzip.open(TORCH) as f:
        events = json.load(f)["traceEvents"]
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    report = _kernels(TORCH)
    assert report["source"]["phase_source"] == "inferred"
    assert report["totals"]["kernels"] == kernels == 336
    torch_steps = {p["phase"]: p["kernels"] / 2 for p in report["phases"]}
    assert torch_steps == {"forward": 42, "backward": 108, "optimizer": 18}


def test_nsys_per_step_matches_torch(nsys_export: Path) -> None:
    report = _kernels(nsys_export)
    assert {p["phase"]: p["kernels"] / 3 for p in report["phases"]} == {
        "forward": 42,
        "backward": 108,
        "optimizer": 18,
    }
