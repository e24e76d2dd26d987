"""A job of many ranks in the terminal and in pictures (profkit.analysis.job_view,
profkit.report.rank_plots.job_figure): distributions across ranks, the slowest, median and
fastest ranks, stragglers and the nodes' clocks, while md, csv and json keep every rank.

The job: 8 nodes (16 ranks) made from the committed 2-GPU DDP export
(benchmarks/job_view_scale.py's ``node_set``):
node k's clock k × 100 µs ahead and a pause of its own in the last step, node 3's the
longest (1.75 ms) and node 0's none, so node 3's local rank 0 (rank 6; local rank 0 is the
export's slower) is the slowest rank and node 0's local rank 1 (rank 1) the fastest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_scripts import benchmark
from typer.testing import CliRunner

from profkit import analysis
from profkit.analysis.clocks import clock_notes
from profkit.analysis.job_view import (
    MANY_RANKS,
    PERCENTILES,
    distribution,
    job_tables,
    lane_ranks,
    nodes_summary,
    picks,
    rank_numbers,
    step_matrix,
    stragglers,
)
from profkit.analysis.report_types import RankedReport
from profkit.analysis.steps import job_summary
from profkit.cli import app
from profkit.report.rank_plots import job_figure
from profkit.traces.job import load

runner = CliRunner()
benchmark("kernels_scale")  # what job_view_scale imports
scale = benchmark("job_view_scale")
NODES = 8
TERMINAL_LINES = 200
"""The terminal output of the 16-rank job stays under this (today's rank tables: 313)."""


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return scale.node_set(tmp_path_factory.mktemp("nodes"), NODES)


@pytest.fixture(scope="module")
def report(paths: list[Path]) -> RankedReport:
    found = analysis.kernel_report(load(paths))
    assert isinstance(found, RankedReport)
    return found


def kernels(*args: str) -> str:
    result = runner.invoke(app, ["kernels", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def as_json(paths: list[Path]) -> dict[str, Any]:
    return json.loads(kernels(*map(str, paths), "--format", "json"))


@pytest.fixture(scope="module")
def terminal(paths: list[Path]) -> str:
    return kernels(*map(str, paths))


def by_step(as_json: dict[str, Any]) -> list[int]:
    """The JSON's ranks by mean step time, slowest first (the lower rank among equals)."""
    ranks = as_json["job"]["ranks"]
    return [r["rank"] for r in sorted(ranks, key=lambda r: (-r["mean_step_ms"], r["rank"]))]


def row(text: str, first_cell: str) -> list[str]:
    """The cells of the terminal table row that starts with ``first_cell``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r}")


def test_the_terminal_shows_the_job_in_a_bounded_number_of_lines(terminal: str) -> None:
    lines = terminal.splitlines()
    assert len(lines) < TERMINAL_LINES
    assert "16 ranks, shown as one job. Every rank's tables: --format md, csv or json; " \
        "one rank's: --rank N" in lines  # fmt: skip
    for per_rank in ("Ranks — world size", "Phases per rank", "Steps across ranks",
                     "NCCL kernels by collective, per rank"):  # fmt: skip
        assert per_rank not in terminal
    assert "The job across its 16 ranks (8 hosts, 3 steps): percentiles" in terminal
    # The job-wide tables stay.
    assert "Top 20 by GPU time (kernels, memcpy, memset), all phases" in terminal


def test_percentiles_are_numpy_percentiles_of_the_json(
    report: RankedReport, as_json: dict[str, Any], terminal: str
) -> None:
    table = distribution(report, rank_numbers(report)).set_index("per rank")
    ranks = as_json["ranks"]
    of_json = {
        "mean_step_ms": [r["mean_step_ms"] for r in as_json["job"]["ranks"]],
        "nccl_wait_ms": [r["nccl_wait_ms"] for r in as_json["job"]["ranks"]],
        "gpu_time_ms": [r["gpu_time_ms"] for r in ranks],
        "nccl_ms": [r["comm"]["time_ms"] for r in ranks],
        "nccl_exposed_ms": [r["comm"]["exposed_ms"] for r in ranks],
    }
    for quantity, values in of_json.items():
        assert len(values) == 2 * NODES
        expected = np.percentile(values, list(PERCENTILES.values()))
        assert table.loc[quantity, list(PERCENTILES)].tolist() == expected.tolist(), quantity
        shown = row(terminal, quantity)[1:6]
        assert shown == [f"{v:,.2f}" for v in expected], quantity
    steps = as_json["job"]["steps"]
    each = table.loc["step_ms (each step)"]
    assert each["p0"] == min(s["fastest_ms"] for s in steps)
    assert each["max"] == max(s["slowest_ms"] for s in steps)
    assert table.loc["mean_step_ms", "max at"] == "rank 6"
    worst = max(steps, key=lambda s: s["slowest_ms"])
    assert each["max at"] == f"rank {worst['slowest_rank']}, step {worst['step']}"


def test_the_slowest_median_and_fastest_ranks(
    report: RankedReport, as_json: dict[str, Any], terminal: str
) -> None:
    order = by_step(as_json)
    assert max(range(NODES), key=lambda n: scale.pause_ns(n, NODES)) == 3
    assert order[0] == 6  # node 3's local rank 0
    assert order[-1] == 1  # node 0's local rank 1
    expected = [*order[:3], order[len(order) // 2], *order[-3:]]
    assert [rank for _, rank in picks(rank_numbers(report))] == expected
    labels = ["slowest #1", "slowest #2", "slowest #3", "median",
              "fastest #3", "fastest #2", "fastest #1"]  # fmt: skip
    hosts = {r["rank"]: r["host"] for r in as_json["ranks"]}
    means = {r["rank"]: r["mean_step_ms"] for r in as_json["job"]["ranks"]}
    for label, rank in zip(labels, expected, strict=True):
        cells = row(terminal, label)
        assert cells[1:3] == [str(rank), hosts[rank]]
        assert cells[5] == f"{means[rank]:,.2f}"
    assert row(terminal, "slowest #1")[2] == "node3"
    assert lane_ranks(report) == [order[0], order[len(order) // 2], order[-1]]


def test_stragglers_are_the_last_to_join_each_step(
    report: RankedReport, as_json: dict[str, Any], terminal: str
) -> None:
    """Per step, the rank that waited least in the collectives (the JSON's waits) is the
    one the others waited for: ranks 0 and 1 of the export in steps 0 and 1 (every node
    the same there), node 3's rank 6 in the last step, where its pause is longest."""
    lasts = []
    for step in as_json["job"]["steps"]:
        waits = {int(r): w for r, w in step["nccl_wait_ms"].items()}
        lasts.append(min(waits, key=lambda r: (waits[r], r)))
    assert lasts == [1, 0, 6]
    table = stragglers(report, rank_numbers(report), job_summary(report.steps, 16))
    assert table is not None
    assert sorted(table["rank"]) == sorted(lasts)
    assert set(table["last in"]) == {"1 of 3 steps"}
    assert row(terminal, "6")[1:3] == ["node3", "1 of 3 steps"]


def test_nodes_and_their_clocks_summarized(report: RankedReport, as_json: dict[str, Any]) -> None:
    offsets_us = [n["offset_ms"] * 1000 for n in as_json["nodes"][1:]]
    assert offsets_us == pytest.approx([100.0 * k for k in range(1, NODES)], abs=1e-6)
    (title, table), *_ = nodes_summary(report)  # 8 nodes: the table as it is
    assert len(table) == NODES
    (title, summary), (_, largest) = nodes_summary(report, many=4)
    assert title.endswith("offsets (µs) of the 7 others")
    expected = np.percentile(offsets_us, list(PERCENTILES.values()))
    assert summary[list(PERCENTILES)].iloc[0].tolist() == expected.tolist()
    assert summary[["nodes", "hosts", "taken_out", "ambiguous", "unknown"]].iloc[0].tolist() == [
        8, 8, 7, 0, 0,
    ]  # fmt: skip
    assert largest["node"].tolist() == ["node7.sqlite", "node6.sqlite", "node5.sqlite"]


def test_clock_notes_of_many_nodes_are_one(report: RankedReport) -> None:
    each = clock_notes(report.nodes)
    assert len(each) == NODES - 1
    assert each[0].startswith("node1.sqlite: its clock ran +0.100 ms from node0.sqlite's")
    (one,) = clock_notes(report.nodes, noted=4)
    assert one == (
        "7 nodes (node1.sqlite, node2.sqlite, node3.sqlite, ...): their clocks ran +0.100 to "
        "+0.700 ms from node0.sqlite's (median +0.400 ms, from their paired collectives' "
        "ends): taken out; each node's is in the Nodes table (JSON: nodes)"
    )


def test_one_rank_of_many(paths: list[Path], as_json: dict[str, Any]) -> None:
    """``--rank 5``: that rank's rows, its steps alone (not every rank's)."""
    text = kernels(*map(str, paths), "--rank", "5")
    assert len(text.splitlines()) < TERMINAL_LINES
    steps = text[text.index("Steps across ranks") :]
    rows = [line for line in steps.splitlines() if re.match(r"│\s+\d+ │\s+\d+ │", line)]
    assert [row.split("│")[2].strip() for row in rows[:3]] == ["5", "5", "5"]
    assert [row.split("│")[1].strip() for row in rows[:3]] == ["0", "1", "2"]
    assert row(text, "5")[1:3] == ["1", "200,767"]  # the Ranks table: rank 5's row alone


def test_files_keep_every_rank(paths: list[Path], as_json: dict[str, Any]) -> None:
    assert len(as_json["ranks"]) == 2 * NODES
    md = kernels(*map(str, paths), "--format", "md")
    phases = md[md.index("## Phases per rank") :].split("\n## ")[0]
    assert len([line for line in phases.splitlines() if line.startswith("| ")]) == 1 + 3 * 16
    assert "## Steps across ranks" in md


def test_small_jobs_show_every_rank(paths: list[Path]) -> None:
    text = kernels(*map(str, paths[:2]))
    assert MANY_RANKS >= 4
    assert "Ranks — world size 4" in text
    assert "Phases per rank" in text
    assert "shown as one job" not in text


def test_the_pictures_of_many_ranks(report: RankedReport, as_json: dict[str, Any]) -> None:
    """The heatmap's data is every rank's step times (the JSON's per-step slowest and
    fastest, its ranks' means); the bars are the JSON's exposed NCCL time; the lanes the
    slowest, a median and the fastest rank."""
    fig = job_figure(report, 1)
    try:
        lanes, bars, heat, exposed = fig.axes[:4]
        drawn = np.asarray(heat.images[0].get_array())
        matrix = step_matrix(report)
        assert drawn.tolist() == matrix.to_numpy().tolist()
        assert matrix.index.tolist() == list(range(16))
        for step in as_json["job"]["steps"]:
            column = matrix[step["step"]]
            assert column.max() == step["slowest_ms"]
            assert column.min() == step["fastest_ms"]
            assert int(column.idxmax()) == step["slowest_rank"]
        means = [r["mean_step_ms"] for r in as_json["job"]["ranks"]]
        assert matrix.mean(axis=1).tolist() == pytest.approx(means, rel=1e-12)
        heights = [p.get_height() for p in exposed.patches]
        assert heights == [r["comm"]["exposed_ms"] for r in as_json["ranks"]]
        order = by_step(as_json)
        picked = sorted([order[0], order[len(order) // 2], order[-1]])
        assert [t.get_text() for t in lanes.get_yticklabels()] == [f"rank {r}" for r in picked]
        assert [t.get_text() for t in bars.get_yticklabels()] == [f"rank {r}" for r in picked]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_plot_of_many_ranks_writes_one_png(paths: list[Path], tmp_path: Path) -> None:
    png = tmp_path / "job.png"
    result = runner.invoke(app, ["kernels", *map(str, paths), "--plot", str(png), "-f", "json"])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_job_tables_of_the_report(report: RankedReport) -> None:
    titles = [title for title, _ in job_tables(report)]
    assert titles == [
        "The job across its 16 ranks (8 hosts, 3 steps): percentiles",
        "Slowest, median and fastest ranks by mean step (GPU span)",
        "Stragglers: last to join a step's collectives",
        "Nodes — each report's clock against the first's",
    ]
