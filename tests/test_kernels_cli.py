"""``profkit kernels``: every format, the filters, and bad input as a user types it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest
from nsys_data import OLD_NO_KERNELS, PROBE, SMALL_FP32, unpack
from typer.testing import CliRunner

from profkit.cli import app

runner = CliRunner()


@pytest.fixture(scope="session")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(SMALL_FP32, tmp_path_factory.mktemp("nsys"))


def kernels(*args: str | Path) -> object:
    return runner.invoke(app, ["kernels", *map(str, args)])


def test_help() -> None:
    result = kernels("--help")
    assert result.exit_code == 0
    for option in ("--phase", "--range", "--top", "--format", "--out", "--nsys", "--phases"):
        assert option in result.output


def test_table_shows_phases_kernels_ranges_and_categories(small: Path) -> None:
    result = kernels(small, "--top", "5")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for title in ("Phases — 3,858 kernels, 98 memcpy, 72 memset: 37.58 ms of GPU time",
                  "Top 5 by GPU time (kernels, memcpy, memset), all phases",
                  "Top 5 by GPU time (kernels, memcpy, memset) in backward", "Ranges",
                  "GPU time by category (ms, kernels, memcpy and memset)"):  # fmt: skip
        assert title in out
    assert "computing softmax" in out and "multi_tensor_apply_kernel" in out
    assert "pt_autograd_0" in out  # the note on cross-thread attribution


def test_json_is_the_contract_and_nothing_else_on_stdout(small: Path) -> None:
    result = kernels(small, "--format", "json", "--top", "3")
    assert result.exit_code == 0, result.output
    value = json.loads(result.stdout)
    assert value["totals"]["kernels"] == 3858  # 4,028 activities: 98 of them memcpy, 72 memset
    assert [p["phase"] for p in value["phases"]] == ["forward", "backward", "optimizer"]
    assert [p["kernels"] for p in value["phases"]] == [1436, 2310, 112]
    assert [p["memcpy"] + p["memset"] for p in value["phases"]] == [24, 146, 0]
    assert len(value["kernels"]) == 9 and value["source"]["top"] == 3


def test_markdown_and_csv_and_out_file(small: Path, tmp_path: Path) -> None:
    md = kernels(small, "--format", "md")
    assert md.exit_code == 0 and md.stdout.startswith(f"# Kernels of {small.name}")
    assert "mode train, dtype fp32, compile no, attention naive" in md.stdout  # not False
    csv = kernels(small, "--format", "csv")
    assert csv.exit_code == 0 and csv.stdout.startswith(
        "table,phase,instances,kernels,memcpy,memset,kernel_time_ms,gpu_time_ms"
    )
    # One table that read_csv reads whole: each row names its table; the top kernels carry
    # their phase and full name (the short one is cut where names are long).
    rows = pd.read_csv(io.StringIO(csv.stdout))
    top = rows[rows["table"] == "top_kernels"]
    assert top.groupby("phase").size().max() == 20  # --top 20, per phase and for all
    assert set(top["phase"]) == {"all", "forward", "backward", "optimizer"}
    report = json.loads(kernels(small, "-f", "json").stdout)
    full = {(k["phase"], k["name"]) for k in report["kernels"]}
    assert {(p, n) for p, n in zip(top["phase"], top["name"], strict=True) if p != "all"} <= full
    assert top["name"].str.len().max() > top["short_name"].str.len().max()
    target = tmp_path / "reports" / "small.md"
    written = kernels(small, "--out", target)
    assert written.exit_code == 0 and "## Ranges" in target.read_text()
    as_json = tmp_path / "small.json"
    assert kernels(small, "-f", "json", "-o", as_json).exit_code == 0
    assert json.loads(as_json.read_text())["totals"]["kernels"] == 3858


def test_phase_and_range_filters(small: Path) -> None:
    backward = json.loads(kernels(small, "--phase", "backward", "-f", "json").stdout)
    assert backward["totals"]["kernels"] == 2310 and backward["source"]["phase"] == "backward"
    softmax = json.loads(kernels(small, "--range", "computing softmax", "-f", "json").stdout)
    assert softmax["totals"]["kernels"] == 24
    assert {c["category"] for c in softmax["categories"]} == {"softmax"}
    md = kernels(small, "--phase", "backward", "--top", "2", "-f", "md").stdout
    assert "## Top 2 by GPU time (kernels, memcpy, memset), phase backward" in md
    assert "all phases" not in md


def test_probe_export() -> None:
    value = json.loads(kernels(PROBE, "-f", "json").stdout)
    phases = {p["phase"]: p["kernels"] for p in value["phases"]}
    assert phases == {"forward": 6, "backward": 17, "unattributed": 2}  # and 6 memsets in backward


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "xml"], "unknown --format 'xml'"),
        (["--top", "-1"], "--top must be 0 (all) or more"),
        (["--phase", "warmup"], "no phase 'warmup'"),
        (["--range", "attention"], "no range named 'attention'"),
        (["--phases", "guess"], "--phases must be one of auto, annotated, inferred, got 'guess'"),
    ],
)
def test_bad_options_exit_2_with_one_line(small: Path, args: list[str], message: str) -> None:
    result = kernels(small, *args)
    assert result.exit_code == 2
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_bad_files_exit_2_with_one_line(tmp_path: Path) -> None:
    truncated = tmp_path / "cut.sqlite"
    truncated.write_bytes(PROBE.read_bytes()[: 4096 * 5])
    text = tmp_path / "run.sqlite"
    text.write_text("not a database")
    cases = {
        tmp_path / "missing.sqlite": "no such file",
        truncated: "is truncated",
        text: "is not an SQLite database",
        unpack(OLD_NO_KERNELS, tmp_path): "no CUDA kernels were traced",
        tmp_path / "x.nsys-rep": "needs Nsight Systems to export it to SQLite",
    }
    (tmp_path / "x.nsys-rep").write_bytes(b"report")
    for path, message in cases.items():
        result = runner.invoke(app, ["kernels", str(path), "--nsys", str(tmp_path / "no-nsys")])
        assert result.exit_code == 2, (path, result.output)
        assert message in " ".join(result.stderr.split()), (path, result.stderr)
        assert "Traceback" not in result.output


def test_compare_two_traces_per_step(tmp_path: Path) -> None:
    example = Path(__file__).parents[1] / "profiles" / "examples" / "small-ctx128-train-fp32.sqlite"
    copy = tmp_path / "again.sqlite"
    copy.write_bytes(example.read_bytes())
    result = runner.invoke(app, ["kernels", str(example), str(copy), "--compare", "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["phase"]: r for r in json.loads(result.stdout)}
    # Two captured steps: per-step values are half the run's totals (1,436 forward kernels).
    assert rows["forward"]["nsys#1 kernels"] == 718 and rows["total"]["nsys#2 kernels"] == 1929
    assert all(r["nsys#2 within 5%"] and r["nsys#2 vs nsys#1 %"] == 0 for r in rows.values())
    assert "nsys#1 = " in result.stderr


def test_compare_needs_two_traces() -> None:
    example = Path(__file__).parents[1] / "profiles" / "examples" / "small-ctx128-train-fp32.sqlite"
    result = runner.invoke(app, ["kernels", str(example), "--compare"])
    assert result.exit_code == 2
    assert (
        result.stderr.strip()
        == "error: --compare needs two or more traces (e.g. run.sqlite run.json.gz)"
    )


def test_nsys_and_torch_profiler_agree_on_the_same_config() -> None:
    """Two real H100 captures of small/ctx128/fp32/train: `profkit nsys` (2 steps) and
    `profkit torch` (1 step). Per step, every phase has the same kernels and times within 0.5%."""
    data = Path(__file__).parent / "data"
    example = Path(__file__).parents[1] / "profiles" / "examples" / "small-ctx128-train-fp32.sqlite"
    torch_trace = data / "torch-small-ctx128-train.json.gz"
    result = runner.invoke(app, ["kernels", str(example), str(torch_trace), "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["phase"]: r for r in json.loads(result.stdout)}
    assert [(p, rows[p]["nsys kernels"], rows[p]["torch kernels"]) for p in rows] == [
        ("forward", 718, 718),
        ("backward", 1155, 1155),
        ("optimizer", 56, 56),
        ("total", 1929, 1929),
    ]
    assert all(abs(r["torch vs nsys %"]) < 0.5 for r in rows.values())


def test_phases_forced_inferred_say_so(small: Path) -> None:
    value = json.loads(kernels(small, "--phases", "inferred", "-f", "json").stdout)
    assert value["source"]["phase_source"] == "inferred"
    annotated = json.loads(kernels(small, "-f", "json").stdout)
    assert annotated["source"]["phase_source"] == "annotated"

    # On this export inference finds exactly what the phase ranges say.
    # (the phases' wall time, cpu_time_ms, is their ranges' or the inferred spans')
    def counted(phases: list[dict]) -> list[dict]:
        return [{k: v for k, v in p.items() if k != "cpu_time_ms"} for p in phases]

    assert counted(value["phases"]) == counted(annotated["phases"])
    assert value["totals"] == annotated["totals"]
    assert [p["phase"] for p in value["phases"]] == ["forward", "backward", "optimizer"]
    table = kernels(small, "--phases", "inferred", "--top", "3")
    assert "Phases (inferred) — " in table.stdout
    assert "Top 3 by GPU time (kernels, memcpy, memset) in backward (inferred)" in table.stdout
