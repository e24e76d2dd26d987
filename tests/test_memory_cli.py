"""``profkit memory`` through the CLI: help, capture's guards, summarize, plot, bad input.

Snapshots here are synthetic (see tests/memory_synth.py): no CUDA on the CI machine.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
import torch
from memory_synth import transformer_step
from typer.testing import CliRunner

from profkit.cli import app
from profkit.memory.capture import capture_tables, peak_table, phase_table
from profkit.run.recorder import dump_snapshot
from profkit.run.results import record
from profkit.sidecar import sidecar_path

runner = CliRunner()
NO_CUDA = not torch.cuda.is_available()


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args))


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    builder = transformer_step(layers=4, steps=2)
    path = tmp_path / "run.pickle"
    dump_snapshot(builder.snapshot(), path)
    sidecar = {
        "config": {"size": "small", "ctx": 128, "batch": 4, "mode": "train", "dtype": "fp32"},
        "phase_marks": builder.marks,
        "capture": {"max_memory_allocated_bytes": max(builder.truth), "device_name": "test GPU"},
    }
    sidecar_path(path).write_text(json.dumps(sidecar))
    return path


@pytest.mark.parametrize(
    "args",
    [["memory", "--help"], ["memory", "capture", "--help"], ["memory", "summarize", "--help"],
     ["memory", "plot", "--help"]],
)  # fmt: skip
def test_help(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_memory_without_arguments_shows_help() -> None:
    result = invoke("memory")
    assert "capture" in result.output and "summarize" in result.output and "plot" in result.output


@pytest.mark.skipif(not NO_CUDA, reason="checks the message on a machine without CUDA")
def test_capture_without_cuda_says_so(tmp_path: Path) -> None:
    # Options go to `capture` without naming it, lists included.
    result = invoke("memory", "--size", "tiny", "--ctx", "16", "32", "--out-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "need a CUDA device" in result.output
    assert "summarize" in result.output  # and says what does work here
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stacks", "cpp"], "unknown --stacks"),
        (["--max-entries", "0"], "--max-entries"),
        (["--device", "cpu"], "CUDA caching allocator"),
        (["--size", "huge"], "unknown size"),
        (["--mode", "sideways"], "unknown --mode"),
    ],
)
def test_capture_rejects_bad_options_before_running(args: list[str], message: str) -> None:
    result = invoke("memory", *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_summarize_table(snapshot: Path) -> None:
    result = invoke("memory", "summarize", str(snapshot))
    assert result.exit_code == 0, result.output
    assert "peak allocated" in result.output
    assert "profkit/workload.py:133 _optimizer_step" in result.output
    assert "residual-stream" in result.output  # the sidecar names the model: 4 x 128 x 768 x 4 B
    assert "1.5 MiB" in result.output
    assert "+0.00% vs reconstructed" in result.output


def test_summarize_json_is_only_json(snapshot: Path) -> None:
    result = runner.invoke(
        app, ["memory", "summarize", str(snapshot), "--format", "json", "--top", "2"]
    )
    assert result.exit_code == 0
    value = json.loads(result.stdout)
    assert {"peak_allocated_bytes", "allocated_at_start_bytes", "reserved_bytes"} <= value.keys()
    assert len(value["top_allocations"]) == 2
    assert value["peak_phase"] in ("forward", "backward", "optimizer")


def test_summarize_markdown_to_file(snapshot: Path, tmp_path: Path) -> None:
    out = tmp_path / "summary.md"
    result = invoke("memory", "summarize", str(snapshot), "--format", "md", "--out", str(out))
    assert result.exit_code == 0
    text = out.read_text()
    assert "### Largest live allocations at the peak, by call site" in text
    assert "| site |" in text


def test_plot_png_in_reports_and_html(
    snapshot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --out the picture goes to reports/ (where every command's pictures go),
    never beside the snapshot, which may sit among committed files."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    beside = set(snapshot.parent.iterdir())
    result = invoke("memory", "plot", str(snapshot), "--html")
    assert result.exit_code == 0, result.output
    png = tmp_path / "work" / "reports" / snapshot.with_suffix(".png").name
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(snapshot.parent.iterdir()) == beside
    html = png.with_suffix(".html").read_text()
    assert "MemoryViz.js" in html  # torch's viewer, which loads its script from a CDN
    assert "CDN" in result.output


def test_plot_svg_json(snapshot: Path, tmp_path: Path) -> None:
    out = tmp_path / "pics" / "timeline.svg"
    result = invoke("memory", "plot", str(snapshot), "-o", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    value = json.loads(result.stdout)
    assert value["image"] == str(out) and value["html"] is None
    assert "<svg" in out.read_text()


def _evil(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [Evil()]}, protocol=4))
    return path, marker


@pytest.mark.parametrize("command", ["summarize", "plot"])
def test_bad_files_one_line_exit_2(tmp_path: Path, command: str) -> None:
    evil, marker = _evil(tmp_path)
    (tmp_path / "text.pickle").write_text("not a pickle")
    (tmp_path / "list.pickle").write_bytes(pickle.dumps([1, 2], protocol=4))
    good = pickle.dumps(transformer_step().snapshot(), protocol=4)
    (tmp_path / "cut.pickle").write_bytes(good[:1000])
    for name in ("evil.pickle", "text.pickle", "list.pickle", "cut.pickle", "missing.pickle"):
        result = invoke("memory", command, str(tmp_path / name))
        assert result.exit_code == 2, (name, result.output)
        assert result.output.startswith("error:") and result.output.count("\n") == 1, result.output
    assert not marker.exists()
    assert evil.exists()


def test_plot_rejects_a_jpeg_before_reading(snapshot: Path) -> None:
    result = invoke("memory", "plot", str(snapshot), "-o", "x.jpg")
    assert result.exit_code == 2
    assert ".png" in result.output


# --- capture's tables and results rows ----------------------------------------------------

GIB = 1024**3


def _row(
    ctx: int, mode: str, dtype: str, status: str = "ok", peak: float | None = 1.0
) -> dict[str, Any]:
    return {
        "size": "2.7B", "ctx": ctx, "batch": 4, "mode": mode, "dtype": dtype, "compile": False,
        "attention": "naive", "warmup": 1, "steps": 1, "device": "cuda", "status": status,
        "error": None if status == "ok" else "CUDA out of memory",
        "model_bytes": int(12.7 * GIB), "after_forward_bytes": int(20 * GIB),
        "after_backward_bytes": None if mode == "forward" else int(25 * GIB),
        "after_optimizer_bytes": None if mode == "forward" else int(50 * GIB),
        "peak_allocated_bytes": None if peak is None else int(peak * GIB),
        "peak_reserved_bytes": None if peak is None else int(peak * GIB * 1.1),
        "snapshot": f"profiles/memory-{ctx}.pickle",
    }  # fmt: skip


def test_peak_table_is_the_seed_style_pivot() -> None:
    rows = [
        _row(128, "forward", "fp32", peak=20.5),
        _row(128, "train", "fp32", peak=60.25),
        _row(512, "forward", "fp32", peak=30.0),
        _row(512, "train", "fp32", status="oom", peak=None),
        _row(128, "forward", "bf16", peak=18.0),
    ]
    table = peak_table(rows)
    assert table is not None
    assert list(table.columns) == ["size", "ctx", "forward fp32", "train fp32", "forward bf16"]
    assert table.to_dict("records") == [
        {"size": "2.7B", "ctx": 128, "forward fp32": "20.50", "train fp32": "60.25", "forward bf16": "18.00"},
        {"size": "2.7B", "ctx": 512, "forward fp32": "30.00", "train fp32": "OOM", "forward bf16": "—"},
    ]  # fmt: skip
    assert peak_table(rows[:1]) is None  # one config: no pivot


def test_phase_table_in_gib() -> None:
    table = phase_table([_row(256, "train", "bf16", peak=52.0)])
    record = table.to_dict("records")[0]
    assert record["config"] == "2.7B-ctx256-train-bf16"
    assert record["after model creation (GiB)"] == pytest.approx(12.7)
    assert record["peak allocated (GiB)"] == pytest.approx(52.0)
    assert [title for title, _ in capture_tables([_row(256, "train", "bf16")])] == [
        "Memory by phase (GiB = 1024^3 bytes; allocated after the last timed step's phases)"
    ]


def test_results_go_to_a_real_sqlite_table(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    # An oom row first (its peak null) must not make the peak column TEXT for later rows.
    record(db, "memory", _row(256, "train", "fp32", status="oom", peak=None))
    record(db, "memory", _row(128, "train", "fp32"))
    rows = list(sqlite_utils.Database(db)["memory"].rows)
    assert [(r["ctx"], r["status"]) for r in rows] == [(256, "oom"), (128, "ok")]
    peak_columns = [c for c in rows[1] if c.startswith("peak") and rows[1][c] is not None]
    assert peak_columns and all(isinstance(rows[1][c], int | float) for c in peak_columns)


def test_plot_takes_out_like_every_command_and_refuses_a_meaningless_format(
    snapshot: Path, tmp_path: Path
) -> None:
    out = tmp_path / "timeline.pdf"
    result = invoke("memory", "plot", str(snapshot), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:5] == b"%PDF-"
    assert result.output == f"wrote {out}\n"
    result = invoke("memory", "plot", str(snapshot), "--out", str(out), "--format", "csv")
    assert result.exit_code == 2
    assert result.output == "error: unknown --format 'csv'; choose one of: table, json\n"


def test_the_residual_stream_row_names_its_d_model(data_dir: Path) -> None:
    snapshot = data_dir / "memory-2.7B-ctx512-train-fp32.pickle.xz"
    result = invoke("memory", "summarize", str(snapshot), "--format", "md")
    assert result.exit_code == 0, result.output
    # 2.7B: d_model 2560; 4 x 512 x 2560 x 4 B = 20.0 MiB.
    assert "20.0 MiB (batch 4 x ctx 512 x d_model 2560 x 4 B, fp32)" in result.stdout
