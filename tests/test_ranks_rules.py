"""The rules that decide a multi-process export's ranks and their phases on the columns,
where the full tables once gave up and read the trace a second way (docs/MULTI_GPU.md,
"Which process is which rank"): ties of launch counts, a rank marking its phases in an NVTX
domain of its own. Each export is built row by row, so every count is known."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import benchmark
from nsys_data import PID, Export

from profkit import analysis
from profkit.analysis.report_types import RankedReport
from profkit.traces.job import load

DATA = Path(__file__).parent / "data"
OTHER = 200
OTHER_MAIN = (1 << 48) | (OTHER << 24) | OTHER
MAIN = (1 << 48) | (PID << 24) | PID


def _phases(report: RankedReport, rank: int) -> dict[str, int]:
    entry = report.ranks[rank]
    return dict(zip(entry.report.phases["phase"], entry.report.phases["kernels"], strict=True))


def test_a_tie_of_launches_gives_the_unlaunched_activity_to_the_lowest_pid(tmp_path: Path) -> None:
    """Both processes launched two kernels on GPU 0: a kernel whose launch was not traced
    goes to the lower pid (as does the device), not to whichever a hash met first."""
    export = Export(tmp_path / "tie.sqlite")
    for thread, pid in ((MAIN, PID), (OTHER_MAIN, OTHER)):
        export.range("forward", 0, 1_000, thread=thread)
        export.kernel("gemm_a", 100, 10, launch_at=10, thread=thread, pid=pid)
        export.kernel("gemm_b", 200, 10, launch_at=20, thread=thread, pid=pid)
    export.kernel("lost_kernel", 500, 10, launch_at=None, pid=OTHER)
    report = analysis.kernel_report(load([export.save()], cache=False))
    assert isinstance(report, RankedReport)
    assert [e.info["pid"] for e in report.ranks] == [PID, OTHER]
    assert [e.totals["kernels"] for e in report.ranks] == [3, 2]
    assert _phases(report, 0) == {"forward": 2, "unattributed": 1}


def test_a_rank_that_marks_phases_in_its_own_domain_keeps_them(tmp_path: Path) -> None:
    """Rank 1 marks forward/backward in a domain of its own only: its phases come from
    there (each process looks in its own default domain), and the whole trace's tables hold
    both ranks' phases."""
    export = Export(tmp_path / "domains.sqlite")
    export.ranges([("forward", 0, 100), ("backward", 100, 200)], thread=MAIN)
    export.domain(7, "mine", thread=OTHER_MAIN)
    export.range("forward", 0, 100, thread=OTHER_MAIN, domain=7)
    export.range("backward", 100, 200, thread=OTHER_MAIN, domain=7)
    for thread, pid, device in ((MAIN, PID, 0), (OTHER_MAIN, OTHER, 1)):
        export.kernel("fwd", 300, 10, launch_at=50, thread=thread, pid=pid, device=device)
        export.kernel("bwd", 400, 10, launch_at=150, thread=thread, pid=pid, device=device)
        export.kernel("bwd", 500, 10, launch_at=160, thread=thread, pid=pid, device=device)
    report = analysis.kernel_report(load([export.save()], cache=False))
    assert isinstance(report, RankedReport)
    assert _phases(report, 0) == {"forward": 1, "backward": 2}
    assert _phases(report, 1) == {"forward": 1, "backward": 2}
    whole = dict(zip(report.phases["phase"], report.phases["kernels"], strict=True))
    assert whole == {"forward": 2, "backward": 4}


@pytest.mark.parametrize("kind", ["whole", "node"])
def test_ranks_with_cuda_graphs_add_up(tmp_path: Path, kind: str) -> None:
    """Two ranks made of a CUDA-graph capture (whole graphs as one activity each, or their
    nodes; the builder copies the graph table for the first rank only): rank 0 reports the
    capture's own counts, graphs included, and the whole trace its ranks' sums."""
    fixture = DATA / f"nsys-2025.3-h100-cudagraph-{kind}.sqlite.xz"
    export = tmp_path / "graphs.sqlite"
    benchmark("kernels_scale").build(fixture, 2, export, world=2)
    one = analysis.kernel_report(load([fixture], cache=False)).to_json()["totals"]
    report = analysis.kernel_report(load([export], cache=False))
    assert isinstance(report, RankedReport)
    ranks = [entry.report.to_json()["totals"] for entry in report.ranks]
    assert ranks[0] == pytest.approx(one)
    whole = report.to_json()["totals"]
    for count in ("kernels", "memcpy", "memset", "graphs"):
        assert whole.get(count, 0) == sum(r.get(count, 0) for r in ranks)
    assert whole.get("graphs", 0) == (3 if kind == "whole" else 0)
