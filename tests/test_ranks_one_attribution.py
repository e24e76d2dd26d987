"""A multi-rank trace is attributed once: its tables must be what attributing again gives.

``analyze_ranks`` builds the whole trace's tables and every rank's from one attribution
(``profkit.analysis.by_process``). Checked here against the plain way, on the real 2-GPU
fixtures: the whole-trace tables against ``analyze()`` of the same trace, and each rank's
tables against ``analyze()`` of that rank's rows alone — chosen here by the process bits of
the launching thread (and of each range's thread), independently of profkit's rank code.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profkit.analysis import analyze, ranks
from profkit.analysis.attribution import attribute
from profkit.analysis.ranks import analyze_ranks
from profkit.analysis.report import KernelReport
from profkit.traces import load_trace
from profkit.traces.ranks import merge_rank_traces
from profkit.traces.schema import Trace

DATA = Path(__file__).parent / "data"
NSYS = DATA / "nsys-2025.3-h200x2-small-ddp2.sqlite.xz"
TORCH = [DATA / f"torch-h200x2-small-ddp2-rank{r}.json.gz" for r in (0, 1)]
TABLES = ("phases", "ranges", "kernels", "overall", "categories")
PID_MASK = (1 << 24) - 1


@pytest.fixture(scope="module")
def nsys_trace(tmp_path_factory: pytest.TempPathFactory) -> Trace:
    plain = tmp_path_factory.mktemp("ranks") / NSYS.name.removesuffix(".xz")
    plain.write_bytes(lzma.decompress(NSYS.read_bytes()))
    return load_trace(plain)


@pytest.fixture(scope="module")
def torch_trace() -> Trace:
    return merge_rank_traces([load_trace(p) for p in TORCH])


def _same(got: KernelReport, want: KernelReport) -> None:
    for table in TABLES:
        pd.testing.assert_frame_equal(getattr(got, table), getattr(want, table), check_exact=True)
    assert got.totals == want.totals
    assert got.notes == want.notes
    assert got.source["phase_source"] == want.source["phase_source"]


def _alone(trace: Trace, pid: int) -> Trace:
    """The rows of one process: activities by their launching thread, ranges by theirs."""
    launcher = trace.kernels["launch_thread"].to_numpy(np.int64, na_value=-1)
    assert (launcher >= 0).all()  # every activity of these fixtures has its launch call
    kernels = trace.kernels[((launcher >> 24) & PID_MASK) == pid]
    threads = trace.ranges["thread"].to_numpy(np.int64)
    ranges = trace.ranges[((threads >> 24) & PID_MASK) == pid]
    return Trace(kernels.reset_index(drop=True), ranges.reset_index(drop=True), trace.meta)


OPTIONS = [
    {},
    {"phases": "inferred"},
    {"phase": "backward"},
    {"range": "computing softmax"},
]


def _check(trace: Trace, options: dict[str, str], attributions: int = 1) -> None:
    """The tables match; ``attributions``: how many times the activities are attributed."""
    calls = []

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return attribute(*args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ranks, "attribute", counted)
        report = analyze_ranks(trace, **options)  # type: ignore[arg-type]
    assert len(calls) == attributions
    _same(report, analyze(trace, **options))  # type: ignore[arg-type]
    assert len(report.ranks) == 2
    for entry in report.ranks:
        _same(entry.report, analyze(_alone(trace, entry.info["pid"]), **options))  # type: ignore[arg-type]


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_nsys_export_whole_and_per_rank_tables(nsys_trace: Trace, options: dict[str, str]) -> None:
    _check(nsys_trace, options)


@pytest.mark.parametrize("options", OPTIONS[:3], ids=str)
def test_torch_traces_whole_and_per_rank_tables(
    torch_trace: Trace, options: dict[str, str]
) -> None:
    _check(torch_trace, options)


def test_one_rank_annotated_the_other_inferred(nsys_trace: Trace) -> None:
    """Rank 1 without its phase ranges: its phases are inferred (and numbered as its own)."""
    threads = nsys_trace.ranges["thread"].to_numpy(np.int64)
    last = ((threads >> 24) & PID_MASK).max()
    names = nsys_trace.ranges["name"]
    dropped = (((threads >> 24) & PID_MASK) == last) & names.isin(
        ["forward", "backward", "optimizer"]
    )
    trace = Trace(nsys_trace.kernels, nsys_trace.ranges[~dropped].reset_index(drop=True),
                  nsys_trace.meta)  # fmt: skip
    report = analyze_ranks(trace)
    assert report.source["phase_source"] == "mixed"
    assert [e.report.source["phase_source"] for e in report.ranks] == ["annotated", "inferred"]
    _check(trace, {})


def test_a_rank_with_its_ranges_in_another_domain(nsys_trace: Trace) -> None:
    """A rank that would look for its phases in another NVTX domain is attributed anew."""
    threads = nsys_trace.ranges["thread"].to_numpy(np.int64)
    ranges = nsys_trace.ranges.copy()
    last = ((threads >> 24) & PID_MASK) == ((threads >> 24) & PID_MASK).max()
    ranges.loc[last, "domain"] = "lib"
    trace = Trace(nsys_trace.kernels, ranges, nsys_trace.meta)
    report = analyze_ranks(trace)
    assert report.ranks[1].report.phases["phase"].tolist()[:3] == [
        "forward",
        "backward",
        "optimizer",
    ]
    _check(trace, {}, attributions=2)  # the whole trace, then rank 1 anew
