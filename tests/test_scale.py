"""Huge traces: the compact columns, the chunked analysis and the columnar cache.

The bounded-memory path (``read_nsys_columns`` + ``analyze_columns``, what
``profkit kernels`` runs) must read each export's activities as plain SQL reads them,
give the same report whatever its chunks, and exactly N times the numbers of an export
replicated N times (benchmarks/kernels_scale.py builds it, as for ×1000). The reports of
every fixture are frozen in tests/test_golden.py. Timings live in benchmarks/, never here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_scripts import benchmark
from nsys_data import (
    GRAPH_NODES,
    GRAPH_WHOLE,
    MAIN,
    SMALL_BF16,
    SMALL_FP32,
    TINY_COMPILE,
    WORKER,
    Export,
    unpack,
)
from report_checks import assert_columns_are_the_export, assert_same_report

from profkit.analysis import one_process
from profkit.analysis.engine import analyze_columns
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns
from profkit.traces.load import load_columns
from profkit.traces.nsys_columns import read_nsys_columns

DATA = Path(__file__).parent / "data"
NSYS = [SMALL_FP32, SMALL_BF16, TINY_COMPILE, GRAPH_NODES, GRAPH_WHOLE,
        "nsys-2025.3-h100-small-compiled", "nsys-2025.3-h100-user_train"]  # fmt: skip
CHROME = ["torch-small-ctx128-train.json.gz", "torch-small-ctx128-forward.json.gz"]
FILTERS = [{}, {"phase": "backward"}, {"range": "computing softmax"}, {"top": 0}]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scale")


@pytest.mark.parametrize("name", NSYS)
def test_streamed_columns_are_the_exports_rows(exports: Path, name: str) -> None:
    path = unpack(name, exports)
    streamed = read_nsys_columns(path)
    assert "shape" not in streamed.arrays  # read afterwards, by row id
    assert_columns_are_the_export(streamed, path)


def _old_columns_driver_calls_open_range(export: Export) -> None:
    export.range("forward", 0, 1_000)
    export.range("open at capture end", 2_000, None)
    export.kernel("gemm_kernel", 100, 50, launch_at=10)
    export.kernel("ampere_sgemm_128x64_tn", 300, 70, launch_at=20, api="cuLaunchKernel",
                  table="CUPTI_ACTIVITY_KIND_DRIVER")  # fmt: skip
    export.kernel("lost_kernel", 5_000, 30, launch_at=None)
    export.kernel("backwards_kernel", 6_000, -5, launch_at=30)  # ends before it starts


def _two_processes_one_correlation_id(export: Export) -> None:
    export.range("forward", 0, 1_000)
    export.kernel("a_kernel", 100, 10, launch_at=50, correlation=1)
    other = (1 << 48) | (200 << 24) | 200
    export.kernel("b_kernel", 100, 10, launch_at=70, correlation=1, thread=other, pid=200)


def _unusual_launch_names(export: Export) -> None:
    export.ranges([("forward", 0, 100), ("backward", 100, 200)])
    export.kernel("k", 100, 10, launch_at=40, api="cudaSomethingNew_v99000", thread=WORKER)
    export.kernel("j", 300, 10, launch_at=150, thread=WORKER)
    export.kernel("i", 400, 10, launch_at=160, thread=MAIN)


OTHER = (1 << 48) | (200 << 24) | 200
EDGE_CASES = {
    # build: launch starts, launch threads, ranges (name, start, end), and the report's
    # phases (phase, kernels, gpu ns) and kernels (phase, name); None: no one-process report
    _old_columns_driver_calls_open_range: (
        [10, 20, -1, 30], [MAIN, MAIN, -1, MAIN],
        [("forward", 0, 1_000), ("open at capture end", 2_000, 6_000)],  # ends with the capture
        [("forward", 3, 120), ("unattributed", 1, 30)],
        [("forward", "ampere_sgemm_128x64_tn"), ("forward", "gemm_kernel"),
         ("forward", "backwards_kernel"), ("unattributed", "lost_kernel")],
    ),
    _two_processes_one_correlation_id: (
        [50, 70], [MAIN, OTHER], [("forward", 0, 1_000)], None, None
    ),
    _unusual_launch_names: (
        [40, 150, 160], [WORKER, WORKER, MAIN], [("forward", 0, 100), ("backward", 100, 200)],
        [("forward", 1, 10), ("backward", 2, 20)],
        [("forward", "k"), ("backward", "i"), ("backward", "j")],  # a tie: by name
    ),
}  # fmt: skip


@pytest.mark.parametrize("build", list(EDGE_CASES), ids=lambda b: b.__name__.strip("_"))
def test_synthetic_edge_cases_give_their_columns_and_report(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    """Driver-table launches, 2022-era columns, open ranges, negative durations, two
    processes sharing a correlation id, launches found only in the second pass."""
    options = {"pid_column": False, "short_names": False, "text_ids": False,
               "meta_table": "EXPORT_META_DATA"} if "old" in build.__name__ else {}  # fmt: skip
    export = Export(tmp_path / "synthetic.sqlite", **options)
    build(export)
    path = export.save()
    starts, threads, ranges, phases, kernels = EDGE_CASES[build]
    streamed = read_nsys_columns(path)
    assert streamed.arrays["launch_start"].tolist() == starts
    assert streamed.launch_threads(streamed.arrays["launch_thread"]).tolist() == threads
    named = streamed.ranges[["name", "start", "end"]]
    assert list(named.itertuples(index=False, name=None)) == ranges
    if phases is None:
        # Two processes: the one-process analysis is not theirs (ranks are).
        assert not one_process(streamed)
        return
    report = analyze_columns(streamed)
    assert [(p["phase"], p["kernels"], round(p["gpu_time_ms"] * 1e6)) for p in report.to_json()["phases"]] == phases  # fmt: skip
    assert [(k["phase"], k["name"]) for k in report.to_json()["kernels"]] == kernels
    assert report.totals["kernels"] == len(starts)
    if build is _old_columns_driver_calls_open_range:
        # A range left open at the capture's end is a range, never a phase (issue 25).
        assert "open at capture end" in report.ranges["range"].tolist()
        assert any("still open when the capture ended" in note for note in report.notes)


@pytest.mark.parametrize("name", [*NSYS, *CHROME])
def test_a_phase_is_its_share_of_the_whole_trace_sums(
    exports: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--phase keeps one phase's share of the sums of every activity (each slot holds one
    phase's points); adding that phase's activities up again gives the same report."""
    from profkit.analysis import attribution, engine

    path = DATA / name if name in CHROME else unpack(name, exports)
    columns = load_columns(path, cache=False)
    plan = attribution.plan_of(columns)
    assert plan.slot_phase is not None
    seen = analyze_columns(columns).phases["phase"].tolist()
    phases = [p for p in plan.phase_names if p in seen]
    shares = {p: analyze_columns(columns, phase=p) for p in phases}

    def mixed_slots(
        cols: ActivityColumns, domain: str | None = None, mode: str = "auto", marks: Any = None
    ) -> object:
        found = attribution.plan_of(cols, domain, mode, marks)  # type: ignore[arg-type]
        found.slot_phase = None  # as where several processes share a slot
        return found

    monkeypatch.setattr(engine, "plan_of", mixed_slots)
    for phase in phases:
        added_up = analyze_columns(load_columns(path, cache=False), phase=phase)
        assert_same_report(shares[phase], added_up)


def test_a_slot_holding_several_phases_is_seen(exports: Path) -> None:
    from profkit.analysis.attribution import attributed, plan_of
    from profkit.analysis.selection import Selection
    from profkit.analysis.sums import add_up

    columns = read_nsys_columns(unpack(SMALL_FP32, exports))
    plan = plan_of(columns)
    assert add_up(columns, plan, attributed(columns, plan), Selection()).slot_phase is not None
    assert plan.slot_phase is not None
    plan.slot_phase = np.zeros_like(plan.slot_phase)  # wrong for every phase but the first
    assert add_up(columns, plan, attributed(columns, plan), Selection()).slot_phase is None


@pytest.mark.parametrize(
    ("cell", "said"),
    [("start = 'soon'", "start holds text ('soon')"), ("\"end\" = X'00ff'", "end holds a blob")],
)
def test_a_time_that_is_not_an_integer_is_one_line(tmp_path: Path, cell: str, said: str) -> None:
    """Text reads as 0 in SQLite's arithmetic: the scan's per-chunk max() must see it."""
    import sqlite3

    from profkit.errors import BadInput

    path = unpack(SMALL_FP32, tmp_path)
    with sqlite3.connect(path) as db:
        db.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET {cell} WHERE rowid = 2000")
    with pytest.raises(BadInput, match=re.escape(f"CUPTI_ACTIVITY_KIND_KERNEL.{said}")):
        read_nsys_columns(path)


@pytest.mark.parametrize("name", NSYS)
@pytest.mark.parametrize("options", FILTERS, ids=lambda o: ",".join(o) or "all")
def test_every_export_gives_the_same_report_in_small_chunks(
    exports: Path, name: str, options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk seams (reader and analysis) change no report and no refusal, on every export."""
    from profkit.analysis import chunked
    from profkit.traces import nsys_columns

    path = unpack(name, exports)
    try:
        expected = analyze_columns(read_nsys_columns(path), **options)
    except BadInput as exc:
        monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", 1000)
        monkeypatch.setattr(chunked, "CHUNK", 1000)
        with pytest.raises(BadInput, match=re.escape(str(exc))):
            analyze_columns(read_nsys_columns(path), **options)
        return
    monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", 1000)
    monkeypatch.setattr(chunked, "CHUNK", 1000)
    assert_same_report(analyze_columns(read_nsys_columns(path), **options), expected)


def test_small_chunks_give_the_same_report(exports: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk seams (reader and analysis) change nothing: 1,000-row chunks on 4,028 rows."""
    from profkit.analysis import chunked
    from profkit.traces import nsys_columns

    path = unpack(SMALL_FP32, exports)
    expected = analyze_columns(read_nsys_columns(path), range="forward")
    monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", 1000)
    monkeypatch.setattr(chunked, "CHUNK", 1000)
    assert_same_report(analyze_columns(read_nsys_columns(path), range="forward"), expected)


@pytest.mark.slow
def test_replicated_ten_times_is_exactly_ten_times(exports: Path) -> None:
    scale = benchmark("kernels_scale")
    one = unpack(SMALL_FP32, exports)
    big = exports / "x10.sqlite"
    scale.build(DATA / f"{SMALL_FP32}.sqlite.xz", 10, big)
    a, b = (analyze_columns(read_nsys_columns(p), top=0) for p in (one, big))
    assert b.totals["kernels"] == 10 * a.totals["kernels"] == 38_580
    for count in ("memcpy", "memset"):
        assert b.totals[count] == 10 * a.totals[count]
    for time in ("kernel_time_ms", "gpu_time_ms"):
        assert round(b.totals[time] * 1e6) == 10 * round(a.totals[time] * 1e6)
    for table, key in (("phases", "phase"), ("ranges", "range"), ("overall", "name")):
        x, y = getattr(a, table).set_index(key), getattr(b, table).set_index(key)
        y = y.loc[x.index]
        np.testing.assert_array_equal(y["kernels" if table != "overall" else "instances"],
                                      10 * x["kernels" if table != "overall" else "instances"])  # fmt: skip
        total = "total_ms" if table == "overall" else "gpu_time_ms"
        np.testing.assert_allclose(y[total], 10 * x[total], rtol=1e-12)
    x, y = a.overall.set_index("name"), b.overall.set_index("name").loc[a.overall["name"]]
    for column in ("avg_us", "med_us", "min_us", "max_us", "grid", "block"):
        assert (y[column].to_numpy() == x[column].to_numpy()).all() or np.allclose(
            y[column].astype(float), x[column].astype(float), rtol=1e-12
        ), column


def test_progress_counts_every_row_once(exports: Path) -> None:
    """rows read / total: rising, and ending at the total (the rows of the tables read)."""
    seen: list[tuple[int, int]] = []
    read_nsys_columns(unpack(SMALL_FP32, exports), lambda done, total: seen.append((done, total)))
    done = [d for d, _ in seen]
    assert done == sorted(done)
    assert seen[-1] == (6_934 + 4_028, 6_934 + 4_028)  # runtime rows + GPU activities
