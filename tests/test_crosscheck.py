"""compare_phases: one backend's phase times beside another's, with differences."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from profkit.analysis.crosscheck import compare_phases
from profkit.errors import BadInput


def phases(rows: list[tuple[str, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["phase", "kernels", "gpu_time_ms"])


NSYS = phases([("forward", 100, 10.0), ("backward", 200, 20.0), ("optimizer", 50, 5.0),
               ("unattributed", 3, 0.1)])  # fmt: skip
TORCH = phases([("backward", 200, 20.5), ("my-loss", 4, 0.5), ("forward", 100, 10.1),
                ("optimizer", 50, 4.0)])  # fmt: skip


def test_side_by_side_with_differences() -> None:
    df = compare_phases([("nsys", NSYS), ("torch", TORCH)])
    assert df["phase"].tolist() == [
        "forward",
        "backward",
        "optimizer",
        "my-loss",
        "unattributed",
        "total",
    ]
    assert list(df.columns) == [
        "phase", "nsys kernels", "nsys gpu_time_ms", "torch kernels", "torch gpu_time_ms",
        "torch − nsys gpu_time_ms", "torch vs nsys %", "torch within 5%",
    ]  # fmt: skip
    row = df.set_index("phase")
    assert row.loc["forward", "torch − nsys gpu_time_ms"] == pytest.approx(0.1)
    assert row.loc["backward", "torch vs nsys %"] == pytest.approx(2.5)
    assert row.loc["optimizer", "torch vs nsys %"] == pytest.approx(-20.0)
    assert row.loc["unattributed", "torch kernels"] == 0  # absent: nothing attributed there
    assert math.isnan(row.loc["my-loss", "torch vs nsys %"])  # reference is 0
    assert not row.loc["my-loss", "torch within 5%"]
    assert row.loc["total", "nsys kernels"] == 353 and row.loc["total", "torch kernels"] == 354
    assert row.loc["total", "torch gpu_time_ms"] == pytest.approx(35.1)
    assert row.loc["total", "torch within 5%"]
    assert row["torch within 5%"].tolist() == [True, True, False, False, False, True]
    assert df["nsys kernels"].dtype == "int64"


def test_three_reports_tolerance_and_duplicate_labels() -> None:
    df = compare_phases([("run", NSYS), ("run", TORCH), ("x", NSYS)], tolerance_pct=1)
    assert "run#2 vs run %" in df.columns and "x vs run %" in df.columns
    assert df["x within 1%"].all()
    assert df["run#2 within 1%"].tolist()[:2] == [True, False]


def test_extra_columns_ignored_and_bad_tables_rejected() -> None:
    with_share = NSYS.assign(share=0.5)
    assert compare_phases([("a", with_share), ("b", NSYS)])["b vs a %"].fillna(0).eq(0).all()
    with pytest.raises(BadInput, match="at least two"):
        compare_phases([("a", NSYS)])
    with pytest.raises(BadInput, match="b: the phases table lacks gpu_time_ms"):
        compare_phases([("a", NSYS), ("b", NSYS.drop(columns="gpu_time_ms"))])
