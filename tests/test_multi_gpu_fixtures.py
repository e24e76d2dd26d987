"""Real 2-GPU captures, checked rank by rank against plain SQL and plain JSON.

Fixtures come from ``benchmarks/multi_gpu_capture.sh`` on a 2-GPU machine (tests/data/
nsys-fixtures.md lists them): ``nsys-*-ddp2.sqlite.xz`` is one Nsight Systems export of
a whole ``torchrun`` tree, ``torch-*-ddp2-rank{0,1}.json.gz`` the per-rank torch.profiler
traces of one run. Every fixture of those names present is tested; the expected numbers
are computed here from the raw files, independently of profkit's readers.
"""

from __future__ import annotations

import gzip
import json
import lzma
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app

DATA = Path(__file__).parent / "data"
NSYS = sorted(DATA.glob("nsys-*-ddp2.sqlite.xz"))
TORCH = sorted(DATA.glob("torch-*-ddp2-rank0.json.gz"))
runner = CliRunner()


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _expected(rows: list[tuple[str, int, int]]) -> dict[str, object]:
    """Kernel rows (name, start, end) of one rank -> the numbers profkit must report."""
    nccl = [(s, e) for n, s, e in rows if n.lower().startswith("nccl")]
    compute = [(s, e) for n, s, e in rows if not n.lower().startswith("nccl")]
    union = _union(nccl)
    overlap = _intersection(union, _union(compute))
    return {
        "kernels": len(rows),
        "nccl_kernels": len(nccl),
        "nccl_ns": sum(e - s for s, e in nccl),
        "overlapped_ns": overlap,
        "exposed_ns": _length(union) - overlap,
    }


def _check(ranks: list[dict], expected: list[dict]) -> None:
    assert len(ranks) == len(expected) == 2
    for entry, want in zip(ranks, expected, strict=True):
        assert entry["kernels"] == want["kernels"]
        comm = entry["comm"]
        assert comm["kernels"] == want["nccl_kernels"] > 0
        assert comm["time_ms"] == want["nccl_ns"] / 1e6
        assert comm["overlapped_ms"] == want["overlapped_ns"] / 1e6
        assert comm["exposed_ms"] == want["exposed_ns"] / 1e6


@pytest.mark.parametrize("fixture", NSYS, ids=lambda p: p.name)
def test_two_rank_nsys_export_per_rank(fixture: Path, tmp_path: Path) -> None:
    sqlite_path = tmp_path / fixture.name.removesuffix(".xz")
    sqlite_path.write_bytes(lzma.decompress(fixture.read_bytes()))
    conn = sqlite3.connect(sqlite_path)
    rows = conn.execute(
        "SELECT (k.globalPid >> 24) & 16777215, k.deviceId, s.value, k.start, k.end "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
    ).fetchall()
    by_pid: dict[int, list[tuple[str, int, int]]] = {}
    device: dict[int, int] = {}
    for pid, dev, name, start, end in rows:
        by_pid.setdefault(pid, []).append((name, start, end))
        device[pid] = dev
    order = sorted(by_pid, key=lambda p: (device[p], p))  # ranks: by device, then pid
    result = runner.invoke(app, ["kernels", str(sqlite_path), "-f", "json"])
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.stdout)["ranks"]
    assert [(r["pid"], r["device"]) for r in ranks] == [(p, device[p]) for p in order]
    _check(ranks, [_expected(by_pid[p]) for p in order])


@pytest.mark.parametrize("rank0", TORCH, ids=lambda p: p.name)
def test_per_rank_torch_traces(rank0: Path) -> None:
    paths = [rank0, rank0.with_name(rank0.name.replace("-rank0", "-rank1"))]
    expected, infos = [], []
    for path in paths:
        doc = json.loads(gzip.decompress(path.read_bytes()))
        infos.append((doc["distributedInfo"]["rank"], doc["distributedInfo"]["world_size"]))
        rows = []
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel":
                start_ns = round(e["ts"] * 1000)
                rows.append((e["name"], start_ns, start_ns + round(e["dur"] * 1000)))
        expected.append(_expected(rows))
    assert infos == [(0, 2), (1, 2)]
    result = runner.invoke(app, ["kernels", *map(str, paths), "-f", "json"])
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.stdout)["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    _check(ranks, expected)


@pytest.mark.parametrize("fixture", NSYS, ids=lambda p: p.name)
def test_a_multi_process_export_is_read_as_columns_whatever_its_phases(
    fixture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Annotated or inferred phases: the export is read as compact columns (cached, with
    its starts and devices)."""
    from profkit import analysis
    from profkit.analysis.report_types import RankedReport
    from profkit.traces.job import load

    plain = tmp_path / fixture.name.removesuffix(".xz")
    plain.write_bytes(lzma.decompress(fixture.read_bytes()))
    single = tmp_path / "single.sqlite"
    single.write_bytes(
        lzma.decompress((DATA / "nsys-2025.3-h100-small-fp32.sqlite.xz").read_bytes())
    )
    cache = tmp_path / "cache"
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(cache))
    monkeypatch.setenv("PROFKIT_CACHE", "1")
    from profkit.traces.cache import ACTIVITIES

    assert isinstance(analysis.kernel_report(load([plain]), phases="inferred"), RankedReport)
    first = analysis.kernel_report(load([plain]))
    assert isinstance(first, RankedReport)
    assert len(list(cache.rglob(ACTIVITIES))) == 1
    again = analysis.kernel_report(load([plain]))  # from the cache: its starts and devices too
    assert again.to_json() == first.to_json()
    analysis.kernel_report(
        load([single])
    )  # one process: the streaming read, which caches its columns
    assert len(list(cache.rglob(ACTIVITIES))) == 2


@pytest.mark.skipif(not TORCH, reason="no per-rank torch.profiler fixtures")
def test_joined_ranks_say_each_warning_once_with_the_ranks_it_concerns() -> None:
    from profkit.analysis.joins import merge_rank_columns
    from profkit.traces.chrome import read_chrome_columns

    rank0 = TORCH[0]
    columns = [read_chrome_columns(rank0),
               read_chrome_columns(rank0.with_name(rank0.name.replace("rank0", "rank1")))]  # fmt: skip
    for cols in columns:
        cols.meta["warnings"] = ["said by both", "said by both"]
    columns[1].meta["warnings"].append("said by rank 1 alone")
    merged, _ = merge_rank_columns(columns)
    assert merged.meta["warnings"] == ["said by both", "rank 1: said by rank 1 alone"]
