"""The chunked passes of the analysis of columns on several threads (analysis/chunked.py).

Threads must change nothing: results come back in chunk order, an error in a chunk is
the caller's, and a report computed on four threads in small chunks is the one computed
on one thread, to the bit (the sums are integers; the float sums are added in chunk order).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from nsys_data import SMALL_FP32, unpack

from profkit import cores
from profkit.analysis import chunked, kernel_stats
from profkit.analysis.engine import analyze_columns
from profkit.analysis.selection import Selection
from profkit.formats import dumps
from profkit.traces.nsys_columns import read_nsys_columns


@pytest.fixture
def four_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunked, "MAX_THREADS", 4)
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 4)


def test_results_come_back_in_chunk_order(four_threads: None) -> None:
    def chunk(lo: int, hi: int) -> tuple[int, int]:
        time.sleep(0.002 * ((lo // 7) % 3))  # later chunks often finish first
        return lo, hi

    assert chunked.threads() == 4
    got = list(chunked.map_chunks(chunk, 100, 7))
    assert got == [(lo, min(lo + 7, 100)) for lo in range(0, 100, 7)]
    assert list(chunked.map_chunks(chunk, 0, 7)) == []


def test_an_error_in_a_chunk_reaches_the_caller(four_threads: None) -> None:
    def chunk(lo: int, hi: int) -> int:
        if lo == 21:
            raise ValueError("chunk 3")
        return lo

    with pytest.raises(ValueError, match="chunk 3"):
        list(chunked.map_chunks(chunk, 100, 7))


@pytest.mark.parametrize("name", [SMALL_FP32, "nsys-2025.3-h100-user_train"])
@pytest.mark.parametrize("options", [{}, {"phase": "backward"}, {"range": "forward"}])
def test_four_threads_give_the_one_thread_report_to_the_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, options: dict
) -> None:
    """Small chunks (1,000 activities), so every pass has many chunks in flight."""
    path = unpack(name, tmp_path)
    monkeypatch.setattr(chunked, "CHUNK", 1000)
    reports = {}
    for threads in (1, 4):
        monkeypatch.setattr(chunked, "MAX_THREADS", threads)
        monkeypatch.setattr(cores.os, "cpu_count", lambda: 4)
        reports[threads] = analyze_columns(read_nsys_columns(path), top=0, **options)
    assert dumps(reports[4].to_json()) == dumps(reports[1].to_json())
    for table in ("kernels", "overall"):
        one, four = (getattr(reports[n], table)["std_us"].to_numpy() for n in (1, 4))
        np.testing.assert_array_equal(one, four)


@pytest.mark.parametrize("options", [{}, {"phase": "backward"}])
def test_statistics_in_batches_of_names_are_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict
) -> None:
    """Batches of at most 500 activities (a name with more is a batch alone): every
    statistic as when all names are sorted at once."""
    path = unpack(SMALL_FP32, tmp_path)
    whole = analyze_columns(read_nsys_columns(path), top=0, **options)
    cols = read_nsys_columns(path)
    monkeypatch.setattr(kernel_stats, "BATCH", 500)
    att = {"phase": np.zeros(len(cols), dtype=np.int16)}
    groups = kernel_stats.Groups(cols, att, None, 1, 1, Selection())
    assert len(kernel_stats._name_batches(groups)) >= 8
    batched = analyze_columns(cols, top=0, **options)
    assert dumps(batched.to_json()) == dumps(whole.to_json())
    for table in ("kernels", "overall"):
        one, other = (getattr(r, table)["std_us"].to_numpy() for r in (whole, batched))
        np.testing.assert_array_equal(one, other)
