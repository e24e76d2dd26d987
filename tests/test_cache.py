"""The columnar cache: a repeated query reads what the first read kept, and says the same.

A cache hit must give exactly the report of a cold read, for every kind of repeated query
(another ``--phase``, ``--range``, ``--top``, ``profkit diff``, ``profkit report``); an
entry that is stale, damaged or half-written is never trusted. Timings live in
benchmarks/kernels_scale.py, never here.
"""

from __future__ import annotations

import lzma
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from nsys_data import SMALL_BF16, SMALL_FP32, unpack
from report_checks import assert_columns_are_the_export, assert_same_report

from profkit import analysis
from profkit.analysis.engine import analyze_columns
from profkit.analysis.report_types import KernelReport
from profkit.traces import cache
from profkit.traces.columns import ActivityColumns
from profkit.traces.job import load
from profkit.traces.load import load_columns
from profkit.traces.nsys_columns import read_nsys_columns

DATA = Path(__file__).parent / "data"
QUERIES = [{}, {"phase": "backward"}, {"phase": "Forward"}, {"range": "computing softmax"},
           {"range": "forward"}, {"top": 0}, {"top": 3},
           {"phase": "optimizer", "range": "optimizer"}]  # fmt: skip


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PROFKIT_CACHE", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return unpack(SMALL_FP32, tmp_path)


def kernel_report(path: Path, cache: bool | None = None, **options: Any) -> KernelReport:
    """``profkit kernels PATH``'s report: the trace loaded (through the cache), analysed."""
    return analysis.kernel_report(load([path], cache=cache), **options)


def _entry(export: Path) -> ActivityColumns | None:
    return cache.load(cache.entry_dir(export), cache.identity(export))


def test_first_read_builds_the_cache_and_the_second_reads_it(cache_dir: Path, export: Path) -> None:
    assert _entry(export) is None  # miss
    fresh = kernel_report(export, phase="forward")
    entry = _entry(export)
    assert entry is not None and len(entry) == 4_028
    assert_same_report(kernel_report(export, phase="forward"), fresh)
    hit = analyze_columns(load_columns(export), range="backward")
    assert_same_report(hit, kernel_report(export, cache=False, range="backward"))


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


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: ",".join(f"{k}={v}" for k, v in q.items()))
def test_a_cache_hit_says_what_a_cold_read_says(
    cache_dir: Path, tmp_path: Path, query: dict
) -> None:
    path = unpack(SMALL_BF16 if "top" in query else SMALL_FP32, tmp_path)
    cold = kernel_report(path, cache=False, **query)
    assert_same_report(kernel_report(path, **query), cold)  # the first read, writing
    assert_same_report(kernel_report(path, **query), cold)  # a hit


def test_a_hit_without_range_reads_no_per_activity_array(cache_dir: Path, export: Path) -> None:
    """Another --phase or --top is answered from the kept sums: nothing per activity is read."""
    kernel_report(export)
    columns = load_columns(export)
    assert set(columns.derived) == {"attribution", "inference_check", "sums"}
    for query in ({}, {"phase": "backward"}, {"top": 0}):
        analyze_columns(columns, **query)
    assert columns.arrays.loaded == []  # type: ignore[attr-defined]
    assert columns.derived["attribution"].arrays.loaded == []  # type: ignore[attr-defined]
    analyze_columns(columns, range="computing softmax")  # a range walks the activities
    assert "duration" in columns.arrays.loaded  # type: ignore[attr-defined]


def test_threads_asking_for_a_column_at_once_load_it_once(cache_dir: Path, export: Path) -> None:
    """The analysis' chunks run on threads that may all ask for an unread column at once:
    each must get the one array (loaded once), not a copy of its own."""
    import threading

    kernel_report(export)
    columns = load_columns(export)
    start = threading.Barrier(8)
    got: list[np.ndarray] = []

    def ask() -> None:
        start.wait()
        got.append(columns.arrays["duration"])

    workers = [threading.Thread(target=ask) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(got) == 8 and all(array is got[0] for array in got)
    assert columns.arrays.loaded == ["duration"]  # type: ignore[attr-defined]
    columns.load(["name", "duration", "launch_thread", "no such column"])  # read together
    assert sorted(columns.arrays.loaded) == ["duration", "launch_thread", "name"]  # type: ignore[attr-defined]
    fresh = read_nsys_columns(export)
    for name in ("name", "duration", "launch_thread"):
        np.testing.assert_array_equal(columns.arrays[name], fresh.arrays[name])


def test_diff_and_report_read_the_cache(
    cache_dir: Path, export: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from profkit.analysis.diff import diff
    from profkit.report.sections import Pictures
    from profkit.report.traces import _trace_part, trace_stem
    from profkit.traces import load as loader

    chrome = DATA / "torch-small-ctx128-train.json.gz"
    expected = diff(load([export, export], side_by_side=True), top=5)
    kernel_report(export)
    kernel_report(chrome)

    def no_read(*args: object, **kwargs: object) -> None:
        raise AssertionError("read the trace again instead of the cache")

    hits = loader.cached_columns  # every read of a trace's columns goes through the cache

    def cached_only(source: Path, read: object, *args: object) -> ActivityColumns:
        return hits(source, no_read, *args)

    monkeypatch.setattr(loader, "read_nsys_columns", no_read)
    monkeypatch.setattr(loader, "cached_columns", cached_only)
    assert diff(load([export, export], side_by_side=True), top=5).to_json() == expected.to_json()
    part = _trace_part(trace_stem(chrome), [chrome], cache_dir, Pictures())
    assert "computing softmax" in part


def test_kept_sums_damaged_or_from_other_inputs_are_computed_again(
    cache_dir: Path, export: Path
) -> None:
    from profkit.traces.columns import Derived

    expected = kernel_report(export, cache=False, phase="backward")
    kernel_report(export)
    kept = cache.entry_dir(export) / cache.DERIVED.format("sums")
    kept.write_bytes(b"\x00garbage" * 20)
    assert_same_report(kernel_report(export, phase="backward"), expected)  # and rewritten
    columns = load_columns(export)
    assert "sums" in columns.derived
    columns.derived["sums"] = Derived(arrays={}, meta={"identity": {"version": -1}})
    assert_same_report(analyze_columns(columns, phase="backward"), expected)


def test_a_column_damaged_inside_is_found_on_opening_and_rebuilt_in_the_same_run(
    cache_dir: Path, export: Path
) -> None:
    """Its seal no longer matches: the entry is read from the export again, never trusted."""
    expected = kernel_report(export, cache=False, range="forward")
    kernel_report(export)
    target = cache.entry_dir(export) / cache.ACTIVITIES
    data = bytearray(target.read_bytes())
    footer = int.from_bytes(data[-30:-26], "little") + 30  # footer, its length, "ARROW1", seal
    data[8 : len(data) - footer] = b"\xff" * (len(data) - footer - 8)  # every column's bytes
    target.write_bytes(bytes(data))
    assert _entry(export) is None
    assert_same_report(kernel_report(export, range="forward"), expected)
    assert _entry(export) is not None and target.read_bytes() != bytes(data)  # rebuilt


def test_shapes_are_read_by_row_id_even_where_rows_were_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from profkit.traces import nsys_columns

    path = unpack(SMALL_FP32, tmp_path)
    with sqlite3.connect(path) as db:  # gaps: every 7th kernel row, and a run at the end
        db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 7 = 3 OR rowid > 3800")
    monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", 1000)  # several chunks, each with gaps
    streamed = read_nsys_columns(path)
    assert streamed.kernel_rows is not None and len(streamed.kernel_rows.starts) > 400
    assert_columns_are_the_export(streamed, path)
    (tmp_path / "packed").mkdir()  # the same rows and sidecar, shapes kept in the columns
    packed = tmp_path / "packed" / f"{SMALL_FP32}.sqlite.xz"
    packed.write_bytes(lzma.compress(path.read_bytes()))
    shutil.copy(DATA / f"{SMALL_FP32}.profkit.json", packed.parent)
    kept = read_nsys_columns(packed)
    assert "shape" in kept.arrays
    a, b = analyze_columns(streamed, top=0), analyze_columns(kept, top=0)
    for table in ("phases", "ranges", "kernels", "overall", "categories"):
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table))


def test_a_compressed_export_keeps_its_shapes_in_the_columns(tmp_path: Path) -> None:
    """Its plain copy is gone after the read: no row id to read a shape by afterwards."""
    packed = tmp_path / f"{SMALL_FP32}.sqlite.xz"
    shutil.copy(DATA / packed.name, packed)
    streamed = read_nsys_columns(packed)
    assert "shape" in streamed.arrays and streamed.kernel_rows is None
    assert_columns_are_the_export(streamed, unpack(SMALL_FP32, tmp_path))


DDP2 = "nsys-2025.3-h200x2-small-ddp2"
RANK_QUERIES = [{}, {"rank": 1}, {"phase": "backward"}, {"range": "computing softmax"},
                {"top": 0}]  # fmt: skip


@pytest.mark.parametrize("query", RANK_QUERIES, ids=lambda q: ",".join(map(str, q)) or "all")
def test_a_ranked_cache_hit_says_what_a_cold_read_says(
    cache_dir: Path, tmp_path: Path, query: dict
) -> None:
    """The sums of every rank are kept too: read back, they give the cold read's report."""
    from profkit.formats import dumps

    path = unpack(DDP2, tmp_path)
    cold = kernel_report(path, cache=False, **query)
    kernel_report(path)  # the columns and the kept sums
    assert "sums" in load_columns(path).derived
    hit = kernel_report(path, **query)
    assert dumps(hit.to_json()) == dumps(cold.to_json())


def test_a_ranked_hit_without_range_or_phase_reads_no_attribution(
    cache_dir: Path, tmp_path: Path
) -> None:
    from profkit.analysis.rank_layout import ranks_of

    path = unpack(DDP2, tmp_path)
    kernel_report(path)
    columns = load_columns(path)
    analyze_columns(columns, layout=ranks_of(columns), rank=0)
    assert columns.derived["attribution"].arrays.loaded == []  # type: ignore[attr-defined]
