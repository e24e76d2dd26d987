"""A trace with more phases than a person reads: every step names its own outermost range.

The terminal shows the phases and ranges with most GPU time and one row summing the rest;
markdown, csv and json keep every row (issue 26: 2,000 names took a terminal longer to
draw than the trace to read).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from nsys_data import named_steps
from synthetic import report
from typer.testing import CliRunner

from profkit.analysis.presentation import (
    TERMINAL_PHASE_COLUMNS,
    TERMINAL_ROWS,
    display_tables,
    rank_tables,
)
from profkit.analysis.report_types import RankedReport
from profkit.cli import app

STEPS = 30  # 32 phases: 20 shown, 12 summed
runner = CliRunner()


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return named_steps(tmp_path_factory.mktemp("names") / "steps.sqlite", STEPS)


# Step i's load kernel takes 1 + i % 7 µs. The 20 busiest phases: forward, backward, and
# the loads of 7, 6, 5, 4 µs (four each) and 3 µs (2 of 2, 9, 16, 23: the first two in
# table order); the rest: 16 and 23 (3 µs), five of 2 µs and five of 1 µs, 21 µs in all.
SHOWN_LOADS = [2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 17, 18, 19, 20, 24, 25, 26, 27]


def test_the_terminal_shows_the_busiest_phases_and_sums_the_rest(steps: Path) -> None:
    tables = dict(display_tables(report(steps), terminal=True))
    (title,) = [t for t in tables if t.startswith("Phases")]
    assert title.endswith(f"(the {TERMINAL_ROWS} with most GPU time; all 32 phases: "
                          "-f md/csv/json or --out)")  # fmt: skip
    phases = tables[title]
    loads = [f"load {i:04d}" for i in SHOWN_LOADS]
    assert phases["phase"].tolist() == ["forward", "backward", *loads, "12 more phases"]
    more = phases.iloc[-1]
    assert (more["instances"], more["kernels"]) == (12, 12)
    assert more["gpu_time_ms"] == pytest.approx(0.021)
    assert more["kernel_time_ms"] == pytest.approx(0.021)
    assert more["cpu_time_ms"] == pytest.approx(12 * 0.02)
    assert phases["gpu_time_ms"].sum() == pytest.approx(STEPS * 0.06 + 0.115)
    (ranges,) = [df for t, df in tables.items() if t.startswith("Ranges")]
    by_time = [f"load {i:04d}" for d in range(6, 1, -1) for i in range(d, STEPS, 7)][:18]
    assert sorted(by_time) == loads  # the ranges table comes sorted by GPU time
    assert ranges["range"].tolist() == ["backward", "forward", *by_time, "12 more ranges"]
    pivot = tables["GPU time by category (ms, kernels, memcpy and memset)"]
    shown = ["forward_ms", "backward_ms", "load 0006_ms", "load 0013_ms", "load 0020_ms"]
    shown += ["load 0027_ms", "26 more phases_ms"]
    assert len(shown) == TERMINAL_PHASE_COLUMNS + 1
    assert pivot.columns.tolist() == ["category", *shown, "total_ms", "share %"]
    assert pivot.at[0, "26 more phases_ms"] == pytest.approx(0.115 - 0.028)
    assert pivot.at[0, "total_ms"] == pytest.approx(1.915)


def test_markdown_csv_and_json_keep_every_phase(steps: Path, tmp_path: Path) -> None:
    full = dict(display_tables(report(steps)))
    (phases,) = [df for t, df in full.items() if t.startswith("Phases")]
    assert len(phases) == STEPS + 2
    out = tmp_path / "steps.md"
    assert (
        runner.invoke(app, ["kernels", str(steps), "--no-cache", "--out", str(out)]).exit_code == 0
    )
    text = out.read_text()
    assert all(text.count(f"| load {i:04d} ") == 2 for i in range(STEPS))  # phases, ranges
    assert "| 12 more" not in text and "more phases_ms" not in text
    result = runner.invoke(app, ["kernels", str(steps), "--no-cache", "-f", "json"])
    assert len(json.loads(result.stdout)["phases"]) == STEPS + 2
    result = runner.invoke(app, ["kernels", str(steps), "--no-cache", "-f", "csv"])
    assert all(f"load {i:04d}" in result.stdout for i in range(STEPS))
    assert "12 more" not in result.stdout and "more phases_ms" not in result.stdout


def test_the_terminal_table_says_how_many_more(steps: Path) -> None:
    result = runner.invoke(app, ["kernels", str(steps), "--no-cache"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert re.search(r"│ 12 more phases +│ +12 │ +12 │", result.stdout)
    assert "all 32 phases: -f md/csv/json or --out" in " ".join(result.stdout.split())
    assert "load 0000" not in result.stdout  # 1 µs: summed with the rest


def test_each_rank_shows_the_jobs_busiest_phases(tmp_path: Path) -> None:
    ranked = report(named_steps(tmp_path / "ranks.sqlite", STEPS, ranks=2))
    assert isinstance(ranked, RankedReport)
    tables = dict(rank_tables(ranked, terminal=True))
    per_rank = tables["Phases per rank"]
    loads = [f"load {i:04d}" for i in SHOWN_LOADS]
    for rank in (0, 1):
        rows = per_rank[per_rank["rank"] == rank]
        assert rows["phase"].tolist() == ["forward", "backward", *loads, "12 more phases"]
        assert rows["kernels"].iloc[-1] == 12
        assert rows["gpu_time_ms"].iloc[-1] == pytest.approx(0.021)
    assert len(dict(rank_tables(ranked))["Phases per rank"]) == 2 * (STEPS + 2)


def test_diff_in_the_terminal_shows_the_busiest_phases_then_the_rest_then_the_total(
    steps: Path, tmp_path: Path
) -> None:
    from profkit.analysis.diff import diff
    from profkit.traces.job import load

    result = diff(load([steps, steps], cache=False, side_by_side=True))
    (title, phases), *_ = result.display_tables(terminal=True)
    assert title.endswith("(the 20 with most GPU time; all 32 phases: -f md/csv/json or --out)")
    assert phases["phase"].tolist()[-2:] == ["12 more phases", "total"]
    assert len(phases) == TERMINAL_ROWS + 2
    rest = phases.iloc[-2]
    assert (rest["A kernels"], rest["B kernels"]) == (12, 12)  # each load runs once a capture
    assert rest["A ms"] == pytest.approx(0.021) and rest["Δ ms"] == 0 and rest["Δ %"] == 0
    assert phases.iloc[-1]["A ms"] == pytest.approx(0.06 + 0.115)  # forward, backward per step
    (_, every), *_ = result.display_tables()
    assert len(every) == STEPS + 3  # md: every phase and the total
    out = tmp_path / "diff.md"
    args = ["diff", str(steps), str(steps), "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    assert all(f"| load {i:04d} " in out.read_text() for i in range(STEPS))


def test_compare_in_the_terminal_shows_the_busiest_phases_then_the_rest_then_the_total(
    steps: Path, tmp_path: Path
) -> None:
    from profkit.analysis import side_by_side
    from profkit.traces.job import load

    fewer = named_steps(tmp_path / "fewer.sqlite", STEPS - 7)  # loads 0023-0029 missing
    compared = side_by_side(load([steps, fewer], cache=False, side_by_side=True), tolerance=5.0)
    table, cut = compared.terminal_table()
    assert cut and len(compared.table) == STEPS + 3
    assert table["phase"].tolist()[-2:] == ["12 more phases", "total"]
    rest = table.iloc[-2]
    # The 12 of A (21 µs) hold loads 0023, 0028 and 0029 (3, 1, 2 µs) that B lacks.
    assert (rest["nsys#1 kernels"], rest["nsys#2 kernels"]) == (12, 9)
    assert rest["nsys#1 gpu_time_ms"] == pytest.approx(0.021)
    assert rest["nsys#2 gpu_time_ms"] == pytest.approx(0.015)
    assert rest["nsys#2 vs nsys#1 %"] == pytest.approx(-600 / 21)
    assert not rest["nsys#2 within 5%"]
    assert table.iloc[-1].equals(compared.table.iloc[-1])  # the total as it was
