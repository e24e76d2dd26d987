"""``profkit compare nproc``: scaling against one GPU, on real rows from two H200s.

``tests/data/bench-h200x2-small-nproc.json`` is the ``--format json`` output of
``profkit bench --nproc 1 2 --parallel ddp fsdp --size small --ctx 128 --warmup 3 --steps 5``
on the nvidia-h200-x2 machine (benchmarks/multi_gpu_capture.sh). The one-GPU row is the
baseline of DDP and of FSDP2 alike; efficiency is the one-GPU step time over the N-rank one
(each rank keeps the one-GPU batch, so the ideal step time is the same).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from profkit.analysis import compare as compare_lib
from profkit.errors import BadInput

ROWS = json.loads((Path(__file__).parent / "data" / "bench-h200x2-small-nproc.json").read_text())


def _mean(label: str) -> float:
    row = next(r for r in ROWS if r["label"] == label)
    return statistics.fmean(row["step_times_ms"])


def test_each_parallelism_is_compared_with_the_one_gpu_row() -> None:
    comparison = compare_lib.compare(ROWS, "nproc")
    assert comparison.variants == [1, 2] and comparison.unpaired == []
    step = {b.fixed["parallel"]: b.cells for b in comparison.blocks if b.phase == "step"}
    assert sorted(step) == ["ddp", "fsdp"]
    one = _mean("small-ctx128-train-fp32")
    for kind, label in (
        ("ddp", "small-ctx128-train-fp32-ddp2"),
        ("fsdp", "small-ctx128-train-fp32-fsdp2"),
    ):
        base, two = step[kind]
        assert base["mean_ms"] == pytest.approx(one) and two["mean_ms"] == pytest.approx(
            _mean(label)
        )
        assert two["efficiency"] == pytest.approx(one / _mean(label))
    # What the rows say: DDP keeps 81% of one GPU's step time, FSDP2 on this small model 45%.
    assert round(step["ddp"][1]["efficiency"], 2) == 0.81
    assert round(step["fsdp"][1]["efficiency"], 2) == 0.45


def test_the_table_has_an_efficiency_column() -> None:
    frame = compare_lib.table(compare_lib.compare(ROWS, "nproc"))
    steps = frame[frame["phase"] == "step"]
    assert list(steps["efficiency"].round(2)) == [0.81, 0.45]


def test_the_table_names_the_parallelism_even_when_there_is_one() -> None:
    """With DDP rows alone the parallelism no longer varies, but a scaling figure means
    nothing without it (one-process rows hold parallel null since 2026-11-23)."""
    rows = [r for r in ROWS if r["parallel"] == "ddp" or r["nproc"] == 1]
    rows = [{**r, "parallel": None} if r["nproc"] == 1 else r for r in rows]
    frame = compare_lib.table(compare_lib.compare(rows, "nproc"))
    steps = frame[frame["phase"] == "step"]
    assert list(steps["parallel"]) == ["ddp"] and list(steps["efficiency"].round(2)) == [0.81]


def test_one_gpu_rows_alone_have_nothing_to_compare() -> None:
    single = [r for r in ROWS if r["nproc"] == 1]
    with pytest.raises(BadInput, match=r"run two, e\.g\. profkit bench --nproc 1 2"):
        compare_lib.compare(single, "nproc")


def test_a_db_from_before_nproc_reads_as_one_process_rows() -> None:
    """The committed H100 DB predates --nproc (no such column): its rows ran one process
    each, so `compare nproc` says there is nothing to compare instead of failing."""
    from profkit.run import bench as bench_lib

    db = Path(__file__).parent / "data" / "results-h100.db"
    rows = bench_lib.load(db)
    assert rows and {r["nproc"] for r in rows} == {1}
    with pytest.raises(BadInput, match=r"every bench row has the same nproc \(1\)"):
        compare_lib.compare(rows, "nproc")
