"""Several nodes' Nsight Systems reports read as one job (profkit.analysis.nodes).

No multi-host capture exists here, so the nodes are made from the real 2-GPU export: each
rank's rows alone (``kernels_scale.one_process``, what nsys writes for a profile of that
process), one file per "node". Read together they must give exactly what the one export
gives; with one node's times shifted (its clock off by a known amount) the offset must be
found from the collectives and taken out. Expected offsets come from plain SQL.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_scripts import benchmark
from typer.testing import CliRunner

from profkit.analysis import analyze_any
from profkit.analysis.nodes import estimate_offset, is_node_set, merge_node_traces
from profkit.analysis.ranks import RankedReport
from profkit.cli import app
from profkit.traces import load_trace

DDP2 = "nsys-2025.3-h200x2-small-ddp2"
SHIFT_NS = 3_000_000  # node 1's clock 3 ms ahead
runner = CliRunner()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 2-rank export, and each of its ranks alone as a node's export (node1-ahead:
    rank 1 with every time 3 ms later)."""
    from nsys_data import unpack

    scale = benchmark("kernels_scale")
    folder = tmp_path_factory.mktemp("nodes")
    whole = unpack(DDP2, folder)
    made = {"whole": whole}
    for rank in (0, 1):
        path = folder / f"node{rank}.sqlite"
        shutil.copy(whole, path)
        with sqlite3.connect(path) as conn:
            scale.one_process(conn, scale.gpu_processes(conn)[rank])
        made[f"node{rank}"] = path
    ahead = folder / "node1-ahead.sqlite"
    shutil.copy(made["node1"], ahead)
    with sqlite3.connect(ahead) as conn:
        _shift_times(conn, SHIFT_NS)
    made["node1-ahead"] = ahead
    return made


def _shift_times(conn: sqlite3.Connection, ns: int) -> None:
    """Every start and end of every table moved by ``ns`` (the session start kept)."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        columns = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
        moved = [f'"{c}" = "{c}" + {ns}' for c in ("start", "end") if c in columns]
        if moved:
            conn.execute(f'UPDATE "{table}" SET {", ".join(moved)}')


def _sql_nccl_ends(path: Path, device: int) -> tuple[list[str], np.ndarray]:
    """One GPU's NCCL kernels in launch order (plain SQL): names and end times."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            'SELECT s.value, k."end" FROM CUPTI_ACTIVITY_KIND_KERNEL k '
            "JOIN StringIds s ON s.id = k.demangledName "
            "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
            "AND r.globalTid >> 24 = k.globalPid >> 24 "
            "WHERE s.value LIKE 'nccl%' AND k.deviceId = ? ORDER BY r.start, k.start",
            (device,),
        ).fetchall()
    return [r[0] for r in rows], np.array([r[1] for r in rows], dtype=np.int64)


def _report(paths: list[Path]) -> RankedReport:
    report = analyze_any(merge_node_traces([load_trace(p) for p in paths]))
    assert isinstance(report, RankedReport)
    return report


def _per_rank(report: RankedReport) -> list[dict[str, Any]]:
    return [entry.to_json() for entry in report.ranks]


def test_two_nodes_read_as_the_job_their_one_export_holds(nodes: dict[str, Path]) -> None:
    whole = analyze_any(load_trace(nodes["whole"]))
    assert isinstance(whole, RankedReport)
    merged = _report([nodes["node0"], nodes["node1"]])
    assert _per_rank(merged) == _per_rank(whole)  # rank, device, pid, host, tables, comm
    assert [e.info["host"] for e in merged.ranks] == ["vm", "vm"]
    assert [e.info["path"] for e in merged.ranks] == [str(nodes["node0"]), str(nodes["node1"])]
    assert merged.steps.equals(whole.steps)
    assert merged.to_json()["job"] == whole.to_json()["job"]
    assert merged.to_json()["phases"] == whole.to_json()["phases"]
    assert merged.world_size == 2
    # One host's clock: the offset the collectives show is the ranks' arrival skew at
    # their ends, too small to be taken out.
    names0, ends0 = _sql_nccl_ends(nodes["whole"], 0)
    names1, ends1 = _sql_nccl_ends(nodes["whole"], 1)
    assert names0 == names1 and len(ends0) == 57
    first, second = merged.nodes
    assert first["offset_ms"] is None and first["ranks"] == [0]
    assert second["offset_ms"] == int(np.median(ends1 - ends0)) / 1e6
    assert abs(second["offset_ms"]) < 0.05 and second["pairs"] == 57
    assert second["applied"] is False and second["ranks"] == [1]


def test_a_node_clock_ahead_is_found_and_taken_out(nodes: dict[str, Path]) -> None:
    same_clock = _report([nodes["node0"], nodes["node1"]])
    merged = _report([nodes["node0"], nodes["node1-ahead"]])
    _, ends0 = _sql_nccl_ends(nodes["whole"], 0)
    _, ends1 = _sql_nccl_ends(nodes["node1-ahead"], 1)
    clock = merged.nodes[1]
    assert clock["offset_ms"] == int(np.median(ends1 - ends0)) / 1e6
    assert clock["applied"] is True and clock["base_ms"] == 0.0
    assert clock["offset_ms"] == pytest.approx(SHIFT_NS / 1e6, abs=0.05)
    # A rank's own numbers do not depend on where its node's clock stands.
    assert _per_rank(merged) == _per_rank(same_clock)
    assert merged.steps["step_ms"].tolist() == same_clock.steps["step_ms"].tolist()
    assert any("its clock ran +2.99" in w for w in merged.notes)


def test_the_offset_pairs_captures_that_start_at_different_collectives(
    nodes: dict[str, Path],
) -> None:
    """Node 1's capture begins 5 collectives later: the shift is found, not the collectives
    a whole step away (the same names repeat every step)."""
    names0, ends0 = _sql_nccl_ends(nodes["whole"], 0)
    names1, ends1 = _sql_nccl_ends(nodes["node1-ahead"], 1)
    reference = (np.array(names0, dtype=object), ends0)
    later = (np.array(names1[5:], dtype=object), ends1[5:])
    offset, spread, pairs = estimate_offset(reference, later)
    assert pairs == 52
    assert offset == int(np.median(ends1[5:] - ends0[5:]))
    assert spread is not None and spread < 50_000
    none = estimate_offset(reference, (np.array(["ncclOther"] * 10, dtype=object), ends1[:10]))
    assert none == (None, None, 0)


def test_what_is_not_one_job_is_compared(nodes: dict[str, Path], data_dir: Path) -> None:
    node0, node1 = load_trace(nodes["node0"]), load_trace(nodes["node1"])
    assert is_node_set([node0, node1])
    assert not is_node_set([node0])
    assert not is_node_set([node0, load_trace(nodes["node0"])])  # one capture twice
    later = load_trace(nodes["node1"])
    later.meta["session_start_utc_ns"] += 3600 * 10**9  # an hour later: another run
    assert not is_node_set([node0, later])
    unknown = load_trace(nodes["node1"])
    del unknown.meta["session_start_utc_ns"]
    assert not is_node_set([node0, unknown])
    one_gpu = load_trace(data_dir / "nsys-2025.3-h100-small-fp32.sqlite.xz")  # no NCCL
    assert not is_node_set([node0, one_gpu])


def test_the_cli_reads_node_files_as_one_job(nodes: dict[str, Path]) -> None:
    args = ["kernels", str(nodes["node0"]), str(nodes["node1-ahead"])]
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert [r["pid"] for r in report["ranks"]] == [766, 767]
    assert [n["path"] for n in report["nodes"]] == ["node0.sqlite", "node1-ahead.sqlite"]
    assert report["nodes"][1]["applied"] is True
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "Nodes" in table.stdout and "node1-ahead.sqlite" in table.stdout
    compared = runner.invoke(app, [*args, "--compare"])
    assert compared.exit_code == 0 and "nsys#2" in compared.stdout


def test_an_nsys_export_says_its_host_and_session_start(nodes: dict[str, Path]) -> None:
    with sqlite3.connect(nodes["whole"]) as conn:
        start = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        host = conn.execute(
            "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'"
        ).fetchone()
    meta = load_trace(nodes["whole"]).meta
    assert meta["session_start_utc_ns"] == start[0] and meta["host"] == host[0] == "vm"
