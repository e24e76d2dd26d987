"""Huge traces: the compact columns, the chunked analysis and the columnar cache.

The bounded-memory path (``read_nsys_columns`` + ``analyze_columns``, what
``profkit kernels`` runs) must give the same report as the in-memory one
(``load_trace`` + ``analyze``) on every real fixture, and exactly N times the numbers of
an export replicated N times (benchmarks/kernels_scale.py builds it, as for ×1000).
Timings live in benchmarks/, never here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
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

from profkit.analysis import _streamable, analyze
from profkit.analysis import kernels as kernel_report
from profkit.analysis.streaming import analyze_columns
from profkit.traces import cache, load_trace
from profkit.traces.columns import ActivityColumns, from_trace
from profkit.traces.load import load_columns
from profkit.traces.nsys_stream import read_nsys_columns

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]
NSYS = [SMALL_FP32, SMALL_BF16, TINY_COMPILE, GRAPH_NODES, GRAPH_WHOLE,
        "nsys-2025.3-h100-small-compiled", "nsys-2025.3-h100-user_train"]  # fmt: skip
CHROME = ["torch-small-ctx128-train.json.gz", "torch-small-ctx128-forward.json.gz"]
FILTERS = [{}, {"phase": "backward"}, {"range": "computing softmax"}, {"top": 0}]
TABLES = ("phases", "ranges", "kernels", "overall", "categories")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scale")


def assert_same_report(a, b) -> None:  # type: ignore[no-untyped-def]
    for table in TABLES:
        # std is summed in another order (sorted, not row order): equal to the last ulps.
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), rtol=1e-12)
    assert a.totals == b.totals
    assert a.notes == b.notes
    assert a.source == b.source


@pytest.mark.parametrize("name", NSYS)
def test_streamed_columns_are_the_tables_columns(exports: Path, name: str) -> None:
    path = unpack(name, exports)
    streamed, tables = read_nsys_columns(path), from_trace(load_trace(path))
    assert (streamed.names, streamed.kinds) == (tables.names, tables.kinds)
    for field in ("name", "duration", "launch_start"):
        np.testing.assert_array_equal(streamed.arrays[field], tables.arrays[field])
    for cols in (streamed, tables):
        cols.decoded = [cols.shapes[s] for s in cols.arrays["shape"]]  # type: ignore[attr-defined]
        cols.thread_ids = cols.launch_threads(cols.arrays["launch_thread"])  # type: ignore[attr-defined]
    assert streamed.decoded == tables.decoded  # type: ignore[attr-defined]
    np.testing.assert_array_equal(streamed.thread_ids, tables.thread_ids)  # type: ignore[attr-defined]
    pd.testing.assert_frame_equal(streamed.ranges, tables.ranges)


@pytest.mark.parametrize("name", NSYS)
@pytest.mark.parametrize("options", FILTERS, ids=lambda o: ",".join(o) or "all")
def test_chunked_report_equals_in_memory_report(exports: Path, name: str, options: dict) -> None:
    path = unpack(name, exports)
    trace = load_trace(path)
    try:
        expected = analyze(trace, **options)
    except Exception as exc:
        with pytest.raises(type(exc), match=str(exc)[:40].replace("(", r"\(")):
            analyze_columns(read_nsys_columns(path), **options)
        return
    assert_same_report(analyze_columns(read_nsys_columns(path), **options), expected)


@pytest.mark.parametrize("name", CHROME)
def test_chrome_columns_give_the_same_report(name: str) -> None:
    trace = load_trace(DATA / name)
    assert_same_report(analyze_columns(from_trace(trace)), analyze(trace))


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


@pytest.mark.parametrize(
    "build",
    [
        _old_columns_driver_calls_open_range,
        _two_processes_one_correlation_id,
        _unusual_launch_names,
    ],
)
def test_synthetic_edge_cases_give_the_same_columns_and_report(tmp_path: Path, build) -> None:  # type: ignore[no-untyped-def]
    """Driver-table launches, 2022-era columns, open ranges, negative durations, two
    processes sharing a correlation id, launches found only in the second pass."""
    options = {"pid_column": False, "short_names": False, "text_ids": False,
               "meta_table": "EXPORT_META_DATA"} if "old" in build.__name__ else {}  # fmt: skip
    export = Export(tmp_path / "synthetic.sqlite", **options)
    build(export)
    path = export.save()
    streamed, tables = read_nsys_columns(path), from_trace(load_trace(path))
    np.testing.assert_array_equal(streamed.arrays["launch_start"], tables.arrays["launch_start"])
    np.testing.assert_array_equal(
        streamed.launch_threads(streamed.arrays["launch_thread"]),
        tables.launch_threads(tables.arrays["launch_thread"]),
    )
    pd.testing.assert_frame_equal(streamed.ranges, tables.ranges)
    if build is _two_processes_one_correlation_id:
        # Process 200 marked no phase: the full tables infer its phases, which the streaming
        # analysis cannot, so profkit kernels never streams a trace of several processes.
        assert not _streamable(streamed, None, "auto")
        return
    assert_same_report(analyze_columns(streamed), analyze(load_trace(path)))


def test_small_chunks_give_the_same_report(exports: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk seams (reader and analysis) change nothing: 1,000-row chunks on 4,028 rows."""
    from profkit.analysis import streaming
    from profkit.traces import _sqlite

    path = unpack(SMALL_FP32, exports)
    expected = analyze(load_trace(path), range="forward")
    monkeypatch.setattr(_sqlite, "CHUNK_ROWS", 1000)
    monkeypatch.setattr(streaming, "CHUNK", 1000)
    assert_same_report(analyze_columns(read_nsys_columns(path), range="forward"), expected)


def _kernels_scale():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "kernels_scale", ROOT / "benchmarks" / "kernels_scale.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels_scale"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_replicated_ten_times_is_exactly_ten_times(exports: Path) -> None:
    scale = _kernels_scale()
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


# The cache -----------------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PROFKIT_CACHE", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return unpack(SMALL_FP32, tmp_path)


def _entry(export: Path) -> ActivityColumns | None:
    return cache.load(cache.entry_dir(export), cache.identity(export))


def test_first_read_builds_the_cache_and_the_second_reads_it(cache_dir: Path, export: Path) -> None:
    assert _entry(export) is None  # miss
    fresh = kernel_report(export, phase="forward")
    entry = _entry(export)
    assert entry is not None and len(entry) == 4_028
    assert_same_report(kernel_report(export, phase="forward"), fresh)
    hit = analyze_columns(load_columns(export), range="backward")
    assert_same_report(hit, analyze(load_trace(export), range="backward"))


def test_tables_from_the_cache_equal_a_fresh_read(cache_dir: Path, export: Path) -> None:
    fresh = read_nsys_columns(export)
    kernel_report(export)
    cached = _entry(export)
    assert cached is not None
    for name, array in fresh.arrays.items():
        np.testing.assert_array_equal(cached.arrays[name], array)
        assert cached.arrays[name].dtype == array.dtype
    assert (cached.names, cached.kinds, cached.shapes) == (fresh.names, fresh.kinds, fresh.shapes)
    pd.testing.assert_frame_equal(cached.ranges, fresh.ranges)
    fresh.meta.pop("sidecar")
    assert cached.meta == fresh.meta


def test_a_changed_export_is_read_again(cache_dir: Path, export: Path) -> None:
    kernel_report(export)
    stat = export.stat()
    os.utime(export, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # stale
    assert _entry(export) is None
    kernel_report(export)
    assert _entry(export) is not None  # rebuilt for the new identity


@pytest.mark.parametrize("damage", ["truncate", "garbage", "index", "remove"])
def test_a_damaged_cache_is_rebuilt_silently(cache_dir: Path, export: Path, damage: str) -> None:
    expected = kernel_report(export, cache=False)
    entry = cache.entry_dir(export)
    kernel_report(export)
    target = entry / (cache.INDEX if damage == "index" else cache.ACTIVITIES)
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif damage in ("garbage", "index"):
        target.write_bytes(b"\x00not what was written" * 10)
    else:
        target.unlink()
    assert _entry(export) is None
    assert_same_report(kernel_report(export), expected)
    assert _entry(export) is not None


def test_the_cache_can_be_turned_off(
    cache_dir: Path, export: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel_report(export, cache=False)
    monkeypatch.setenv("PROFKIT_CACHE", "0")
    load_columns(export)
    assert not cache_dir.exists()


def test_an_unwritable_cache_folder_is_skipped(
    tmp_path: Path, export: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(blocker))
    assert kernel_report(export).totals["kernels"] == 3_858  # launches; +170 copies, memsets


def test_cli_no_cache_writes_nothing(cache_dir: Path, export: Path) -> None:
    from typer.testing import CliRunner

    from profkit.cli import app

    result = CliRunner().invoke(app, ["kernels", str(export), "--no-cache", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert not cache_dir.exists()
    result = CliRunner().invoke(app, ["kernels", str(export), "--format", "json"])
    assert result.exit_code == 0
    assert _entry(export) is not None


def test_progress_counts_every_row_once(exports: Path) -> None:
    """rows read / total: rising, and ending at the total (the rows of the tables read)."""
    seen: list[tuple[int, int]] = []
    read_nsys_columns(unpack(SMALL_FP32, exports), lambda done, total: seen.append((done, total)))
    done = [d for d, _ in seen]
    assert done == sorted(done)
    assert seen[-1] == (6_934 + 4_028, 6_934 + 4_028)  # runtime rows + GPU activities
