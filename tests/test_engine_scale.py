"""benchmarks/engine_scale.py kept working: a ×1 run of one round, and its A/B arithmetic.

The figures themselves come from big runs on a GPU host (docs/PERFORMANCE.md); here the
script runs at ×1 (61 copies of the unannotated fixture, 8 of the annotated one) only to
keep it from rotting.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import benchmark

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "engine_scale.py"


@pytest.mark.slow  # ~9 s on 2 idle cores: 4 short processes and a small build
def test_one_round_at_x1_times_checks_and_writes_the_figures(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    # The unannotated export alone: the annotated one takes the same code (and is built
    # in the test below).
    argv = [sys.executable, str(SCRIPT), "--times", "1", "--rounds", "1", "--export",
            "unannotated", "--work", str(tmp_path / "work"), "--json", str(figures)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unannotated ×1: nsys-2025.3-h200-unannotated-train.sqlite.xz x61 copies, " \
        "30,744 kernels, 63,257 runtime rows" in done.stdout  # fmt: skip
    number = r" +\d+\.\d\d"
    assert re.search(rf"unannotated +A{number * 5} +\d+\.\d\dx +\d+%  exact", done.stdout)
    result = json.loads(figures.read_text())
    exports = result["scales"][0]["exports"]
    assert list(exports) == ["unannotated"]
    assert exports["unannotated"]["expected_phases"] == {
        "source": "inferred",
        "kernels": {"forward": 61 * 126, "backward": 61 * 324, "optimizer": 61 * 54},
    }
    for entry in exports.values():
        row = entry["summary"]["A"]
        assert row["phases_exact"] and row["repeat_same_output"]
        assert row["first_over_scan"] == row["first"]["wall_s"] / row["scan"]["wall_s"]
        assert "WHERE nameId IN (" in entry["scan_sql"]
    assert result["checkouts"][0]["profkit"].startswith(str(ROOT))


def test_rounds_0_builds_and_times_nothing(tmp_path: Path) -> None:
    argv = [sys.executable, str(SCRIPT), "--times", "1", "--rounds", "0", "--export",
            "annotated", "--work", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "annotated ×1: nsys-2025.3-h100-small-fp32.sqlite.xz x8 copies, 30,864 kernels, " \
        "55,472 runtime rows, 5 MB, built in" in done.stdout  # fmt: skip
    assert "(a) bare scan" not in done.stdout
    assert (tmp_path / "annotated-x1.sqlite").exists()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert "5 MB, reused" in again.stdout  # the build is kept and reused
    scale = json.loads((tmp_path / "engine_scale.json").read_text())["scales"][0]
    assert scale["rounds_done"] == 0 and scale["exports"]["annotated"]["build_s"] is None


def test_a_checkout_that_imports_another_profkit_is_refused(tmp_path: Path) -> None:
    argv = [sys.executable, str(SCRIPT), "--checkout", str(tmp_path), "--work", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    # This interpreter finds the installed profkit wherever it runs: not the one asked for.
    assert re.search(rf"A: .* imports profkit from .*, not from {tmp_path}\n", done.stderr)
    assert not list(tmp_path.iterdir())  # refused before anything was built


def test_medians_and_ratios_of_two_checkouts(capsys) -> None:  # type: ignore[no-untyped-def]
    benchmark("kernels_scale")  # engine_scale imports it by name
    engine = benchmark("engine_scale")

    def run(wall: float, gib: float) -> dict[str, float]:
        return {"wall_s": wall, "cpu_s": wall, "peak_rss_gib": gib, "phases_exact": True}

    checkouts = [{"label": "A", "python": "py"}, {"label": "B", "python": "py"}]
    runs = {
        "scan": {"py": [run(1.0, 0.1), run(3.0, 0.1), run(2.0, 0.1)]},
        "A": {"first": [run(8, 2.0), run(6, 2.0), run(7, 2.0)],
              "repeat": [run(1, 0.5)] * 3, "repeat_same_output": [True] * 3},
        "B": {"first": [run(4, 1.0), run(3, 1.0), run(5, 1.0)],
              "repeat": [run(0.5, 0.5)] * 3, "repeat_same_output": [True] * 3},
    }  # fmt: skip
    entry = {"runs": runs}
    entry["summary"] = summary = engine.summarize(entry, checkouts)
    assert summary["A"]["first_over_scan"] == 7 / 2
    assert summary["B"]["first_over_scan"] == 4 / 2
    assert summary["B"]["repeat_over_first"] == 0.5 / 4
    assert summary["B"]["vs_first_checkout"] == {
        "first_wall_s": 4 / 7, "first_peak_rss_gib": 0.5,
        "repeat_wall_s": 0.5, "repeat_peak_rss_gib": 1.0,
    }  # fmt: skip
    engine.show({"times": 1000, "rounds_done": 3, "exports": {"annotated": entry}}, checkouts)
    shown = capsys.readouterr().out
    assert re.search(r"annotated +B +2\.00 +4\.00 +1\.00 +0\.50 +0\.50 +2\.00x +12%  exact", shown)
    assert "annotated: B/A: (b) wall 0.57x, peak 0.50x; (c) wall 0.50x, peak 1.00x" in shown
