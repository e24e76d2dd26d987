"""Several nodes' Nsight Systems reports read as one job (profkit.analysis.joins, profkit.analysis.clocks).

No multi-host capture exists here, so the nodes are made from the real 2-GPU export: each
rank's rows alone (``kernels_scale.one_process``, what nsys writes for a profile of that
process), one file per "node". Read together they must give exactly what the one export
gives; with one node's times shifted (its clock off by a known amount) the offset must be
found from the collectives and taken out. Expected offsets come from plain SQL; the
reports of the one-GPU nodes with every option are those the full tables' engine gave
(tests/frozen.py).
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_scripts import benchmark
from frozen import frozen, normalised
from report_checks import close_json, option_id
from synthetic import report
from typer.testing import CliRunner

from profkit.analysis import kernel_report
from profkit.analysis.clocks import estimate_offset, node_clock
from profkit.analysis.report_types import RankedReport
from profkit.cli import app
from profkit.traces.columns import START, ActivityColumns
from profkit.traces.job import load, node_facts, together, why_not_one_job
from profkit.traces.load import load_columns_of
from profkit.traces.nsys_columns import keeps_start_times, read_nsys_columns

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


def _agreeing_median(diff: np.ndarray) -> int:
    """The rule in plain numpy: the median of the end differences within 50 µs of their
    median (a Broadcast's root ends early: one pair of 57 in the fixture)."""
    middle = int(np.median(diff))
    return int(np.median(diff[np.abs(diff - middle) <= 50_000]))


def _report(paths: list[Path]) -> RankedReport:
    got = report(list(paths))
    assert isinstance(got, RankedReport)
    return got


def _per_rank(report: RankedReport) -> list[dict[str, Any]]:
    return [entry.to_json() for entry in report.ranks]


def test_two_nodes_read_as_the_job_their_one_export_holds(nodes: dict[str, Path]) -> None:
    whole = _report([nodes["whole"]])
    merged = _report([nodes["node0"], nodes["node1"]])
    assert _per_rank(merged) == _per_rank(whole)  # rank, device, pid, host, tables, comm
    assert [e.info["host"] for e in merged.ranks] == ["vm", "vm"]
    # Each rank's file: the columns' rank infos keep no "path" (the full tables' kept the
    # file's path there, read by nothing); the nodes say which file holds which ranks.
    assert [(n["path"], n["ranks"]) for n in merged.nodes] == [
        (nodes["node0"].name, [0]),
        (nodes["node1"].name, [1]),
    ]
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
    assert second["offset_ms"] == _agreeing_median(ends1 - ends0) / 1e6
    assert abs(second["offset_ms"]) < 0.05
    assert (second["pairs"], second["agreeing"]) == (57, 56)
    assert second["applied"] is False and second["ambiguous"] is False
    assert second["ranks"] == [1]


def test_a_node_clock_ahead_is_found_and_taken_out(nodes: dict[str, Path]) -> None:
    same_clock = _report([nodes["node0"], nodes["node1"]])
    merged = _report([nodes["node0"], nodes["node1-ahead"]])
    _, ends0 = _sql_nccl_ends(nodes["whole"], 0)
    _, ends1 = _sql_nccl_ends(nodes["node1-ahead"], 1)
    clock = merged.nodes[1]
    assert clock["offset_ms"] == _agreeing_median(ends1 - ends0) / 1e6
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
    found = estimate_offset(reference, later)
    assert found is not None and not found.ambiguous
    assert (found.pairs, found.agreeing) == (52, 52)
    assert found.ns == _agreeing_median(ends1[5:] - ends0[5:])
    assert found.spread < 50_000
    other_names = (np.array(["ncclOther"] * 10, dtype=object), ends1[:10])
    assert estimate_offset(reference, other_names) is None  # nothing pairs by name
    assert estimate_offset(reference, (later[0][:7], later[1][:7])) is None  # too few


def _steps_of_collectives(step_gap_ns: int, rng: np.random.Generator) -> np.ndarray:
    """End times of 30 steps of 18 all-reduces 1 ms apart (±10 µs), the steps ``step_gap_ns``
    apart: a DDP backward's buckets of equal layers, evenly spaced within a step."""
    ends, t = [], 0
    for _ in range(30):
        t += step_gap_ns
        for _ in range(18):
            t += 1_000_000 + int(rng.integers(-10_000, 10_000))
            ends.append(t)
    return np.array(ends, dtype=np.int64)


def test_evenly_spaced_collectives_are_paired_where_the_spacing_breaks() -> None:
    """Pairings off by a few collectives fit every gap within a step; only the true one
    also fits the gaps between steps, which a median alone would never notice."""
    rng = np.random.default_rng(1)
    ends = _steps_of_collectives(40_000_000, rng)
    names = np.array(["ncclDevKernel_AllReduce"] * len(ends), dtype=object)
    for true in (700_000, 2_300_000):
        other = ends + true + rng.integers(-10_000, 10_000, len(ends))
        found = estimate_offset((names, ends), (names, other))
        assert found is not None and not found.ambiguous
        assert abs(found.ns - true) < 10_000 and found.agreeing == found.pairs == len(ends)


def test_collectives_that_pair_as_well_at_two_offsets_are_ambiguous() -> None:
    """Steps exactly 19 gaps long repeat the same spacing everywhere: a pairing one step
    off agrees as well, so no offset is taken out and none is shown."""
    ends = np.arange(1, 541, dtype=np.int64) * 1_000_000
    names = np.array(["ncclDevKernel_AllReduce"] * len(ends), dtype=object)
    found = estimate_offset((names, ends), (names, ends + 300_000))
    assert found is not None and found.ambiguous
    trace_a = {"session_start_utc_ns": 0}
    clock, shift = node_clock("b.sqlite", trace_a, trace_a, (names, ends), (names, ends + 300_000),
                          [1], False)  # fmt: skip
    assert clock.ambiguous and clock.offset_ms is None and not clock.applied and shift == 0


def _read(*paths: Path) -> list[ActivityColumns]:
    """Exports' columns as a job of several reads them: with their GPU starts."""
    return load_columns_of(list(paths), cache=False, timed=True)


def _one_job(files: list[ActivityColumns]) -> bool:
    return together([Path(c.meta["path"]) for c in files], files).kind == "nodes"


def _why(files: list[ActivityColumns]) -> str | None:
    return why_not_one_job([node_facts(c) for c in files])


def test_what_is_not_one_job_is_compared(
    nodes: dict[str, Path], data_dir: Path, tmp_path: Path
) -> None:
    node0, node1 = _read(nodes["node0"], nodes["node1"])
    assert _one_job([node0, node1])
    assert not _one_job([node0])
    (again,) = _read(nodes["node0"])
    assert not _one_job([node0, again])  # one file twice
    assert _why([node0, again]) == f"{nodes['node0']} is given twice"
    copy = tmp_path / "copy.sqlite"  # one capture under two names
    shutil.copy(nodes["node0"], copy)
    reason = _why([node0, *_read(copy)])
    assert reason is not None and reason.startswith(f"{nodes['node0'].name} and copy.sqlite hold")
    (later,) = _read(nodes["node1"])
    later.meta["session_start_utc_ns"] += 3600 * 10**9  # an hour later: another run
    assert not _one_job([node0, later])
    (unknown,) = _read(nodes["node1"])
    del unknown.meta["session_start_utc_ns"]
    assert not _one_job([node0, unknown])
    (one_gpu,) = _read(data_dir / "nsys-2025.3-h100-small-fp32.sqlite.xz")  # no NCCL
    assert not _one_job([node0, one_gpu])
    assert _why([node0, one_gpu]) == "nsys-2025.3-h100-small-fp32.sqlite.xz has no NCCL kernels"
    # Without its launch calls a node's activities belong to no process it could name.
    unlaunched = tmp_path / "unlaunched.sqlite"
    shutil.copy(nodes["node1"], unlaunched)
    with sqlite3.connect(unlaunched) as conn:
        conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    reason = _why([node0, *_read(unlaunched)])
    assert reason == "unlaunched.sqlite has no GPU activity with a traced launch call"


def test_files_of_one_name_are_told_apart_by_their_folders(
    nodes: dict[str, Path], tmp_path: Path
) -> None:
    """One report per node folder, as SLURM jobs often leave them: d0/report.sqlite, ..."""
    for rank in (0, 1):
        (tmp_path / f"d{rank}").mkdir()
        shutil.copy(nodes[f"node{rank}"], tmp_path / f"d{rank}" / "report.sqlite")
    paths = [tmp_path / "d0" / "report.sqlite", tmp_path / "d1" / "report.sqlite"]
    report = _report(paths)
    assert [n["path"] for n in report.nodes] == ["d0/report.sqlite", "d1/report.sqlite"]


def test_exports_of_two_times_are_compared_and_the_cli_says_why(
    nodes: dict[str, Path], tmp_path: Path
) -> None:
    later = tmp_path / "later.sqlite"
    shutil.copy(nodes["node1"], later)
    with sqlite3.connect(later) as conn:
        conn.execute(
            "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + 3600000000000"
        )
    result = runner.invoke(app, ["kernels", str(nodes["node0"]), str(later)])
    assert result.exit_code == 0, result.output
    assert "nsys#2" in result.stdout  # the comparison
    assert "not read as one job: their captures do not overlap in time" in result.stderr


ONE_GPU_OPTIONS = [
    {},
    {"phase": "backward"},
    {"range": "computing softmax"},
    {"top": 0},
    {"rank": 1},
    {"rank": 0, "phase": "optimizer"},
    {"phases": "inferred"},
    {"phases": "annotated", "rank": 1},
]


@pytest.mark.parametrize("second", ["node1", "node1-ahead"])
@pytest.mark.parametrize("options", ONE_GPU_OPTIONS, ids=option_id)
def test_nodes_of_one_gpu_are_read_as_columns_with_their_starts(
    nodes: dict[str, Path], second: str, options: dict[str, Any]
) -> None:
    """Each node's export holds one process, whose columns alone keep no GPU starts: read
    together they keep them, are one job, and give the report the full tables gave (which
    they once needed) with every option and phase mode."""
    paths = [nodes["node0"], nodes[second]]
    want = frozen("nodes", f"{second}/{option_id(options)}")
    assert not any(keeps_start_times(p) for p in paths)
    job = load(paths, cache=False)
    assert job.kind == "nodes" and all(START in c.arrays for c in job.files)
    got = normalised(_json(kernel_report(job, **options)), folder=nodes["whole"].parent)
    close_json(got, want)


def _json(report: Any) -> dict[str, Any]:
    return json.loads(json.dumps(report.to_json(), default=str))


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
    markdown = runner.invoke(app, [*args, "--format", "md"])
    assert markdown.stdout.startswith("# Kernels of node0.sqlite, node1-ahead.sqlite")


def test_an_nsys_export_says_its_host_and_session_start(nodes: dict[str, Path]) -> None:
    with sqlite3.connect(nodes["whole"]) as conn:
        start = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        host = conn.execute(
            "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'"
        ).fetchone()
    meta = read_nsys_columns(nodes["whole"]).meta
    assert meta["session_start_utc_ns"] == start[0] and meta["host"] == host[0] == "vm"


def _chrome_nccl_ends(path: Path) -> np.ndarray:
    """A rank's NCCL kernel ends (ns) from its raw Chrome trace, in GPU order."""
    with gzip.open(path) as f:
        trace = json.load(f)
    base = trace["baseTimeNanoseconds"]
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    nccl = sorted((e for e in kernels if e["name"].startswith("nccl")), key=lambda e: e["ts"])
    return np.array([base + round((e["ts"] + e["dur"]) * 1000) for e in nccl], dtype=np.int64)


def test_per_rank_torch_traces_of_two_hosts_are_put_on_one_clock(
    data_dir: Path, tmp_path: Path
) -> None:
    """The real per-rank torch traces, rank 1 said to be another host whose clock runs
    3 ms ahead: the offset its NCCL ends show is taken out; one host is merged as it is."""
    paths = [data_dir / f"torch-h200x2-small-ddp2-rank{r}.json.gz" for r in (0, 1)]
    one_host = _report(paths)
    assert one_host.nodes == []
    moved = []
    for rank, path in enumerate(paths):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        if rank == 1:  # every time of the trace 3 ms later, on a host of its own
            doc["profkit"] = {**doc["profkit"], "host": "node1"}
            doc["baseTimeNanoseconds"] += SHIFT_NS
        moved.append(tmp_path / path.name)
        moved[-1].write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    got = _report(moved)
    first, second = got.nodes
    assert (first["host"], second["host"]) == ("vm", "node1")
    expected = _agreeing_median(
        _chrome_nccl_ends(paths[1]) + SHIFT_NS - _chrome_nccl_ends(paths[0])
    )
    assert second["offset_ms"] == pytest.approx(expected / 1e6, abs=1e-5)
    assert (second["pairs"], second["agreeing"], second["applied"]) == (19, 19, True)
    mine = [{k: v for k, v in e.to_json().items() if k != "host"} for e in got.ranks]
    theirs = [{k: v for k, v in e.to_json().items() if k != "host"} for e in one_host.ranks]
    assert mine == theirs
    assert got.steps["step_ms"].tolist() == one_host.steps["step_ms"].tolist()
