"""``profkit doctor`` and ``profkit demo`` (the README's main job) on this machine."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from profkit.cli import app
from profkit.report import demo as demo_lib
from profkit.run import bench as bench_lib

runner = CliRunner()


COMMANDS = [
    "sizes", "bench", "nsys", "torch", "kernels", "memory",
    "attention", "precision", "compare", "diff", "report", "demo",
]  # fmt: skip


def test_doctor_reports_components_and_commands() -> None:
    result = runner.invoke(app, ["doctor", "--format", "json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    components = {c["name"]: c for c in found["components"]}
    assert components["torch"]["detail"] == torch.__version__
    assert components["CUDA"]["found"] == torch.cuda.is_available()
    has_nsys = bool(shutil.which("nsys"))
    assert components["nsys"]["found"] == has_nsys or "PROFKIT_NSYS" in str(components["nsys"])
    for name in ("nvtx", "sqlite-utils", "matplotlib"):
        assert components[name]["found"]
    commands = {c["command"]: c for c in found["commands"]}
    assert list(commands) == COMMANDS
    assert all(c["status"] in ("ready", "partial", "missing") for c in commands.values())
    assert commands["kernels"]["status"] in ("ready", "partial")  # works without a GPU
    if not torch.cuda.is_available():
        assert commands["nsys"]["status"] == "missing" and "CUDA" in commands["nsys"]["note"]
        assert commands["memory"]["status"] == "partial"

    dask = importlib.util.find_spec("distributed") is not None
    assert components["dask"]["found"] == dask
    assert ("--workers/--scheduler need Dask" in commands["kernels"]["note"]) == (not dask)

    table = runner.invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert table.exit_code == 0
    assert "What runs here" in table.stdout and "sqlite-utils" in table.stdout


def test_demo_steps_are_extensible(tmp_path: Path) -> None:
    def extra(ctx: demo_lib.DemoContext) -> str:
        return f"ran on {ctx.device}"

    steps = [demo_lib.STEPS[0], demo_lib.DemoStep("extra", "An appended pipeline", extra)]
    result = demo_lib.demo(tmp_path / "profiles", tmp_path / "demo.md", "cpu", steps=steps)
    text = result.report_path.read_text()
    assert text.startswith("# profkit demo")
    assert "## Model sizes" in text and "| small | 768 |" in text
    assert "## An appended pipeline\n\nran on cpu" in text


@pytest.mark.slow
def test_demo_runs_on_cpu(tmp_path: Path) -> None:
    report = tmp_path / "reports" / "demo.md"
    profiles = tmp_path / "profiles" / "demo"
    result = runner.invoke(
        app, ["demo", "--device", "cpu", "--profiles", str(profiles), "--report", str(report)]
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {report}" in result.stdout
    rows = bench_lib.load(profiles / "results.db")
    assert [(r["size"], r["mode"], r["dtype"], r["status"]) for r in rows] == [
        ("tiny", "forward", "fp32", "ok"),
        ("tiny", "forward", "bf16", "ok"),
        ("tiny", "train", "fp32", "ok"),
        ("tiny", "train", "bf16", "ok"),
    ]
    text = report.read_text()
    assert "## Benchmark" in text and "| tiny | 128 | train | bf16 |" in text
    # The terminal shows each step's tables, not only its heading, and a picture is drawn.
    out = result.stdout
    for shown in ("Model sizes", "fwd ms", "bwd ms", "opt ms", "Phases of small-ctx128",
                  "Top 10 kernels by GPU time", "torch.profiler: Full step", "aten::mm"):  # fmt: skip
        assert shown in out, shown
    assert out.index("fwd ms") < out.index("Top 10 kernels") < out.index("aten::mm")
    picture = report.with_name("demo-step.png")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {picture}" in out
    assert "![Training step time by phase](demo-step.png)" in text
    # The shipped H100 export: golden phase totals, and the attention sub-ranges.
    assert "| forward | 1,436 | 24 | 0 | 10.21 | 10.25 | 27.33 | 31.76 |" in text
    assert "| backward | 2,310 | 74 | 72 | 19.39 | 19.59 | 52.21 | 51.50 |" in text
    assert "| computing softmax | 24 | 24 | 0 | 0 | 0.10 | 0.10 |" in text
    # torch.profiler on the CPU: a key_averages table and its Chrome traces.
    assert "## torch.profiler" in text and "| aten::mm |" in text
    assert (profiles / "demo-torch-tiny-train.json.gz").exists()


def test_demo_rejects_an_unwritable_report(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = runner.invoke(app, ["demo", "--report", str(blocker / "demo.md")])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: cannot write")


def test_doctor_says_how_to_add_dask() -> None:
    """Without Dask (its import blocked here), doctor names the extra and what it is for,
    and ``kernels`` runs in one process only."""
    code = (
        "import sys; sys.modules['distributed'] = None\n"
        "from profkit.__main__ import main; sys.argv = ['profkit', 'doctor', '-f', 'json']\n"
        "main()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    (dask,) = [c for c in found["components"] if c["name"] == "dask"]
    assert dask == {
        "name": "dask",
        "found": False,
        "detail": "not installed (--workers/--scheduler): pip install 'profkit[dask]'",
    }
    (kernels,) = [c for c in found["commands"] if c["command"] == "kernels"]
    assert kernels["status"] == "partial"
    assert "in one process only (--workers/--scheduler need Dask)" in kernels["note"]
