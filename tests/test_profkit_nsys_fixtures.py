"""Golden numbers on exports captured on an H100 by `profkit nsys` itself.

- ``nsys-2025.3-h100-user_train``: `profkit nsys -- python examples/user_train.py --steps 3
  --warmup 2` — a user's own loop (not the built-in model) marked with ``profkit.phase``;
  whole program captured (no capture range), so setup kernels are ``unattributed``.
- ``nsys-2025.3-h100-small-compiled``: `profkit nsys --size small --ctx 128 --warmup 2
  --steps 2 --compile yes` — Inductor's Triton kernels.

Totals are checked against plain SQL over the export, independent of profkit's reader.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nsys_data import sql_activity_totals, sql_counts, unpack
from synthetic import report

USER = "nsys-2025.3-h100-user_train"
COMPILED = "nsys-2025.3-h100-small-compiled"


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profkit-nsys")


def phases(report_json: dict) -> dict[str, tuple[int, float]]:
    return {p["phase"]: (p["kernels"], round(p["gpu_time_ms"], 6)) for p in report_json["phases"]}


def test_user_program_phases_and_backward_from_autograd(exports: Path) -> None:
    path = unpack(USER, exports)
    user = report(path)
    data = user.to_json()
    activities, ns = sql_activity_totals(path)
    assert activities == 952
    assert data["totals"]["kernels"] == sql_counts(path)["kernels"][0] == 845
    assert data["totals"]["gpu_time_ms"] == pytest.approx(ns / 1e6) == 5.891927
    assert phases(data) == {
        "forward": (210, 1.554289),
        "backward": (540, 3.387163),  # and 30 memcpy, 45 memset
        "optimizer": (94, 0.750122),
        "unattributed": (1, 0.200353),  # setup before the first phase (and 32 memcpy)
    }
    assert [(r["range"], r["instances"]) for r in data["ranges"]] == [
        ("backward", 5),
        ("forward", 5),
        ("optimizer", 5),
    ]
    # 610 of backward's kernels came from autograd's thread; nsys's own rule would give 5.
    assert any("610 of its 615" in note and "would give it 5" in note for note in user.notes)


def test_compiled_run_has_triton_kernels_in_every_phase_it_compiles(exports: Path) -> None:
    path = unpack(COMPILED, exports)
    data = report(path).to_json()
    activities, ns = sql_activity_totals(path)
    assert activities == 1728 and data["totals"]["memset"] == 72
    assert data["totals"]["kernels"] == sql_counts(path)["kernels"][0] == 1656
    assert data["totals"]["gpu_time_ms"] == pytest.approx(ns / 1e6)
    assert phases(data) == {
        "forward": (580, 8.321447),
        "backward": (964, 16.084036),  # and 72 memset
        "optimizer": (112, 7.680735),
    }
    triton = {c["phase"] for c in data["categories"] if c["category"] == "triton"}
    assert {"forward", "backward"} <= triton
    # Inside a compiled region the attention sub-ranges are skipped (they would break the graph).
    assert "computing softmax" not in {r["range"] for r in data["ranges"]}


def test_shipped_example_profile_reads(tmp_path: Path) -> None:
    example = Path(__file__).parents[1] / "profiles" / "examples" / "small-ctx128-train-fp32.sqlite"
    data = report(example).to_json()
    assert data["totals"]["kernels"] == sql_counts(example)["kernels"][0] == 3858
    assert sql_activity_totals(example)[0] == 3858 + 98 + 72
    assert {p["phase"] for p in data["phases"]} == {"forward", "backward", "optimizer"}
    ranges = {r["range"]: r["kernels"] for r in data["ranges"]}
    assert ranges["computing softmax"] > 0 and ranges["computing attention scores"] > 0
