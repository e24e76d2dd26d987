"""Several nodes' multi-GPU exports read as one job from their compact columns
(profkit.analysis.joins), in bounded memory, as the full tables read them once.

No multi-host capture exists here, so a second node is made from the real 2-GPU export
(``kernels_scale.another_node``): the same rows with every process id moved by 100,000
(another host's processes), and in one variant every time 3 ms later (a clock ahead). Read as a 2-node, 4-rank job, the
streamed report must equal the full tables' (the nodes' tables merged, frozen before
that engine was deleted: tests/frozen.py) everywhere, with every option and phase mode; the CLI
reads every set of exports as columns (a node of one GPU too: tests/test_nodes.py), and
compares those that are not one job.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_scripts import benchmark
from frozen import assert_shows_the_numbers, frozen, normalised
from nsys_data import SMALL_FP32, unpack
from report_checks import close_json, option_id
from typer.testing import CliRunner

from profkit.analysis.joins import analyze_node_columns
from profkit.cli import app
from profkit.errors import BadInput
from profkit.traces.columns import START
from profkit.traces.job import load, node_facts, why_not_one_job
from profkit.traces.load import load_columns, load_columns_of
from profkit.traces.nsys_columns import keeps_start_times

DDP2 = "nsys-2025.3-h200x2-small-ddp2"
PID_STEP = 100_000  # kernels_scale.PID_STEP: another node's processes
SHIFT_NS = 3_000_000
OPTIONS = [
    {},
    {"phase": "backward"},
    {"range_": "computing softmax"},
    {"top": 0},
    {"rank": 3},
    {"rank": 2, "phase": "optimizer"},
    {"phases": "inferred"},
    {"phases": "inferred", "rank": 1, "phase": "backward"},
]
runner = CliRunner()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    scale = benchmark("kernels_scale")
    folder = tmp_path_factory.mktemp("nodes-streaming")
    node0 = unpack(DDP2, folder).rename(folder / "node0.sqlite")
    return {
        "node0": node0,
        "node1": scale.another_node(node0, folder / "node1.sqlite"),
        "node1-ahead": scale.another_node(node0, folder / "node1-ahead.sqlite", shift_ns=SHIFT_NS),
    }


def _full(case: str) -> dict[str, Any]:
    """The full tables' report of a case (the nodes' tables merged, then analysed), frozen."""
    return frozen("nodes_streaming", case)


def _streamed(paths: list[Path], options: dict[str, Any]) -> dict[str, Any]:
    columns = [load_columns(p, cache=False) for p in paths]
    report = analyze_node_columns(columns, **options)
    return json.loads(json.dumps(report.to_json(), default=str))


@pytest.mark.parametrize("second", ["node1", "node1-ahead"])
@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_the_columns_give_the_full_tables_report(
    nodes: dict[str, Path], second: str, options: dict[str, Any]
) -> None:
    """(goldens kernels--node0+node1-ahead* and kernels--node0+node1 hold the CLI's JSON
    for some of these, on the same files)"""
    paths = [nodes["node0"], nodes[second]]
    got = normalised(_streamed(paths, options), folder=nodes["node0"].parent)
    close_json(got, _full(f"{second}/{option_id(options)}"))


def test_four_ranks_two_hosts_pids_and_the_clock(nodes: dict[str, Path]) -> None:
    """Ranks numbered node by node, each with its real pid and GPU; node 1's 3 ms found
    from its 57 collectives and taken out, so its ranks' numbers are node 0's."""
    got = _streamed([nodes["node0"], nodes["node1-ahead"]], {})
    with sqlite3.connect(nodes["node0"]) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT processId FROM TARGET_INFO_CUDA_CONTEXT_INFO ORDER BY deviceId")]  # fmt: skip
    assert [(r["rank"], r["pid"], r["device"]) for r in got["ranks"]] == [
        (0, pids[0], 0), (1, pids[1], 1), (2, pids[0] + PID_STEP, 0), (3, pids[1] + PID_STEP, 1)
    ]  # fmt: skip
    second = got["nodes"][1]
    assert (second["ranks"], second["pairs"], second["agreeing"]) == ([2, 3], 57, 57)
    assert second["offset_ms"] == pytest.approx(SHIFT_NS / 1e6) and second["applied"]
    for entry in got["ranks"][2:]:
        twin = got["ranks"][entry["rank"] - 2]
        assert {k: v for k, v in entry.items() if k not in ("rank", "pid")} == {
            k: v for k, v in twin.items() if k not in ("rank", "pid")
        }


def test_the_cli_streams_node_sets_and_prints_what_the_full_tables_printed(
    nodes: dict[str, Path], tmp_path: Path
) -> None:
    """The CLI gives every format: the JSON matches the full tables' report (floats to
    1e-12), the markdown shows its numbers."""
    paths = [str(nodes["node0"]), str(nodes["node1-ahead"])]
    folder = nodes["node0"].parent
    printed = {}
    for fmt in ("json", "md", "csv"):
        result = runner.invoke(app, ["kernels", *paths, "--no-cache", "--format", fmt])
        assert result.exit_code == 0, result.output
        printed[fmt] = result.stdout
    close_json(normalised(json.loads(printed["json"]), folder=folder), _full("cli/json"))
    assert_shows_the_numbers(printed["md"], _full("cli/json"))
    assert printed["csv"].count("\n") > 20 and "clock_offset_us" in printed["csv"]
    picture = tmp_path / "lanes.png"
    drawn = runner.invoke(app, ["kernels", *paths, "--no-cache", "--plot", str(picture)])
    assert drawn.exit_code == 0, drawn.output
    assert picture.read_bytes().startswith(b"\x89PNG")
    bad = runner.invoke(app, ["kernels", *paths, "--no-cache", "--rank", "4"])
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines() == ["error: no rank 4 in this trace; ranks: 0, 1, 2, 3"]


def test_exports_read_together_keep_their_starts_and_say_why_they_are_apart(
    nodes: dict[str, Path], tmp_path: Path
) -> None:
    """A one-GPU export alone keeps no start times in its columns; read with others it
    does (each could be a node), through a cache entry of its own. The same file twice is
    not one job: the CLI compares them and says why."""
    single = unpack(SMALL_FP32, tmp_path)
    assert keeps_start_times(nodes["node0"]) and not keeps_start_times(single)
    assert not keeps_start_times(tmp_path / "none.sqlite")
    assert START not in load_columns(single).arrays
    both = load([single, nodes["node0"]])
    assert both.kind == "side_by_side" and both.why_apart is None  # one of them has no NCCL
    assert all(START in c.arrays for c in both.files)
    assert START not in load_columns(single).arrays  # its own entry stayed as it was
    twice = [nodes["node0"], nodes["node0"]]
    facts = [node_facts(c) for c in load_columns_of(twice, cache=False)]
    assert why_not_one_job(facts) == f"{nodes['node0']} is given twice"
    assert load(twice, cache=False).why_apart == why_not_one_job(facts)
    result = runner.invoke(app, ["kernels", *map(str, twice), "--no-cache"])
    assert result.exit_code == 0, result.output
    assert "not read as one job: " + f"{nodes['node0']} is given twice" in result.stderr


def test_several_exports_share_one_progress_in_bytes(nodes: dict[str, Path]) -> None:
    heard: list[tuple[int, int, str]] = []
    paths = [nodes["node0"], nodes["node1"]]
    load_columns_of(paths, cache=False, progress=lambda d, t, u="rows": heard.append((d, t, u)))
    total = sum(p.stat().st_size for p in paths)
    assert {t for _, t, _ in heard} == {total} and {u for _, _, u in heard} == {"bytes"}
    done = [d for d, _, _ in heard]
    assert done == sorted(done) and done[-1] == total
    assert paths[0].stat().st_size in done  # the first file ends where the second starts
    assert any(0 < d < paths[0].stat().st_size for d in done)  # rows heard within a file


def test_a_missing_node_file_is_one_line(nodes: dict[str, Path], tmp_path: Path) -> None:
    result = runner.invoke(app, ["kernels", str(nodes["node0"]), str(tmp_path / "node9.sqlite")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: no such file: {tmp_path / 'node9.sqlite'}"
    ]
    with pytest.raises(BadInput):
        load_columns_of([nodes["node0"], tmp_path / "node9.sqlite"], cache=False)


def test_the_nodes_scale_script_times_the_read_and_checks_the_report(tmp_path: Path) -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "nodes_scale.py"
    argv = [sys.executable, str(script), "--copies", "1", "--runs", "1", "--workdir", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 nodes x 12,360 kernels (2 ranks each)" in done.stdout
    assert re.search(r"profkit kernels wall +\d+\.\d\d s .*peak RSS \d+\.\d\d GiB", done.stdout)
    assert "clock found 3 ms ahead: True" in done.stdout
    written = json.loads((tmp_path / "nodes_scale.json").read_text())
    assert all(written["checks"].values()) and written["kernels"] == 24_720


def test_a_node_that_began_before_the_first_keeps_its_launches(
    nodes: dict[str, Path], tmp_path: Path
) -> None:
    """The first node's capture began 20 ms after the second's (its first 20 ms of rows
    are not in it): the second node's times come before the first's session start, and
    must not read as unknown launches. Its ranks are the same in either order of files."""
    scale = benchmark("kernels_scale")
    late = scale.another_node(nodes["node0"], tmp_path / "late.sqlite", 2 * PID_STEP, -20_000_000)
    with sqlite3.connect(late) as conn:
        for table in ("KERNEL", "MEMCPY", "MEMSET", "RUNTIME"):
            conn.execute(f"DELETE FROM CUPTI_ACTIVITY_KIND_{table} WHERE start < 0")
        conn.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + 20000000")
    first, second = [late, nodes["node1"]], [nodes["node1"], late]
    got = _streamed(first, {})
    same = normalised(normalised(got, folder=tmp_path), folder=nodes["node0"].parent)
    close_json(same, _full("late"))
    other = _streamed(second, {})
    assert got["nodes"][1]["base_ms"] == pytest.approx(-20.0)
    for mine, theirs in zip(got["ranks"][2:], other["ranks"][:2], strict=True):
        keep = ("kernels", "kernel_time_ms", "gpu_time_ms", "phases", "comm")
        assert {k: mine[k] for k in keep} == {k: theirs[k] for k in keep}
    phases = {p["phase"]: p["kernels"] for p in got["ranks"][2]["phases"]}
    assert "unattributed" not in phases or phases["unattributed"] == 0


def test_consumed_nodes_give_the_same_report_and_their_arrays_up(nodes: dict[str, Path]) -> None:
    paths = [nodes["node0"], nodes["node1"]]
    kept = [load_columns(p, cache=False) for p in paths]
    first = analyze_node_columns(kept)
    assert all(len(c) for c in kept)  # not consumed: still whole
    again = analyze_node_columns(kept)
    assert again.to_json() == first.to_json()
    given = [load_columns(p, cache=False) for p in paths]
    consumed = analyze_node_columns(given, consume=True)
    assert consumed.to_json() == first.to_json()
    assert all("name" not in c.arrays for c in given)


def test_a_fifo_among_the_nodes_is_one_line(nodes: dict[str, Path], tmp_path: Path) -> None:
    fifo = tmp_path / "node1.sqlite"
    os.mkfifo(fifo)
    result = runner.invoke(app, ["kernels", str(nodes["node0"]), str(fifo)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: {fifo} is a FIFO, not a regular file"]
