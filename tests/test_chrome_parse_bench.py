"""benchmarks/chrome_parse.py kept working: its copies read as copies, and a tiny run.

The figures come from runs on hundreds of MB (docs/PERFORMANCE.md); here the generator's
copies are checked (each a shifted copy with its own ids, so every launch still matches)
and the script runs on 2 copies of the unannotated fixture only to keep it from rotting.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import benchmark

from profkit.traces.chrome import read_chrome_columns

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "chrome_parse.py"
SOURCE = ROOT / "tests" / "data" / "torch-h200-unannotated-train.json.gz"


def test_copies_read_as_that_many_copies(tmp_path: Path) -> None:
    bench = benchmark("chrome_parse")
    one = read_chrome_columns(SOURCE)
    path = tmp_path / "x3.json"
    with path.open("wb") as out:
        info = bench.write_replicated(bench.load(SOURCE), 0, [out], "kineto", copies=3)
    three = read_chrome_columns(path)
    assert info["copies"] == 3 and three.meta["events"] == info["events"]
    assert len(three) == 3 * len(one) and set(three.names) == set(one.names)
    unlaunched = (one.arrays["launch_start"] < 0).sum()
    assert (three.arrays["launch_start"] < 0).sum() == 3 * unlaunched  # ids stay apart
    span = one.arrays["launch_start"].max() - one.arrays["launch_start"].min()
    assert three.arrays["launch_start"].max() - three.arrays["launch_start"].min() > 2 * span


@pytest.mark.slow  # 3 fresh processes reading 2 copies: ~10 s on 2 busy cores
def test_a_tiny_run_times_each_mode_and_another_checkout(tmp_path: Path) -> None:
    argv = [sys.executable, str(SCRIPT), "--source", str(SOURCE), "--copies", "2",
            "--modes", "columns", "stream", "--tree", str(ROOT), "--repeats", "1"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for mode in ("columns", "stream", f"columns@{ROOT}"):
        assert re.search(
            rf"\| trace-x2-compact\.json \| {re.escape(mode)} \| 9,\d\d\d \|", done.stdout
        )
