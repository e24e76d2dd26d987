"""Chrome traces read straight into compact columns: what the events say, however read.

``read_chrome_columns`` parses a trace once and gathers its GPU activities as arrays,
batch by batch. On every committed fixture (``tests/data/torch-*.json.gz``: one process,
and the two ranks of a DDP run, which keep GPU starts and devices) the columns hold each
GPU event of the raw JSON (counted here with the stdlib ``json`` module) and are the same
streamed in small batches or parsed whole (the reports of each fixture are frozen in
tests/test_golden.py); SYNTHETIC traces cover what the fixtures lack: damaged fields of
every kind, launches sharing a correlation id at the same instant on other threads,
activities without a launch, a layout the stream hands back after some batches.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from column_checks import assert_same_columns

from profkit.errors import BadInput
from profkit.traces.chrome import read_chrome_columns
from profkit.traces.columns import DEVICE, START
from profkit.traces.load import load_columns

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("torch-*.json.gz"))
RANKS = [p for p in FIXTURES if "rank" in p.name]
FORWARD = DATA / "torch-small-ctx128-forward.json.gz"
GPU = ("kernel", "gpu_memcpy", "gpu_memset")
SPAN = (
    "its timestamps span {days} days (from {low} to {high} ns): a damaged timestamp, not a capture"
)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_columns_hold_every_gpu_event_however_read(path: Path) -> None:
    columns = read_chrome_columns(path)
    assert_same_columns(read_chrome_columns(path, chunk_bytes=None), columns)
    assert_same_columns(read_chrome_columns(path, chunk_bytes=64 << 10), columns)
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    gpu = [e for e in events if e.get("cat") in GPU]
    assert len(columns) == len(gpu) > 100 and len(columns.names) > 10
    durations = sorted(round(e["dur"] * 1000) for e in gpu)  # Kineto's µs with 3 decimals
    assert sorted(columns.arrays["duration"].tolist()) == durations
    timed = {START, DEVICE} <= set(columns.arrays)
    assert timed == (path in RANKS)  # a trace that names its rank keeps GPU starts
    if timed:
        base = json.loads(gzip.decompress(path.read_bytes()))["baseTimeNanoseconds"]
        starts = sorted(base + round(e["ts"] * 1000) for e in gpu)
        assert columns.arrays[START].tolist() == starts  # in GPU order
        assert set(columns.arrays[DEVICE].tolist()) == {e["args"]["device"] for e in gpu}


def test_load_columns_reads_chrome_traces_as_their_reader_does() -> None:
    assert_same_columns(load_columns(FORWARD, cache=False), read_chrome_columns(FORWARD))
    for rank in RANKS:  # through the cache (conftest's folder) too: written, then read
        fresh = read_chrome_columns(rank)
        for columns in (load_columns(rank, cache=True), load_columns(rank, cache=True)):
            assert {START, DEVICE} <= set(columns.arrays)
            for name, values in fresh.arrays.items():
                np.testing.assert_array_equal(np.asarray(columns.arrays[name]), values)


def damaged(doc: dict[str, Any], seed: int) -> dict[str, Any]:
    """``doc`` with odd values in random fields, repeated launches and orphan kernels."""
    rng = random.Random(seed)
    doc = copy.deepcopy(doc)
    events = doc["traceEvents"]
    odd = [None, "abc", "12.5", "inf", "nan", -5.0, 1e300, 2**64 + 5, 2**63, -(2**63) - 1,
           [1, 2], {"a": 1}, True, 0, 3.7, "", [1.0, 2, True], ["3", 4, 5], [1.5, 2, 3]]  # fmt: skip
    fields = ["ts", "dur", "tid", "pid", "name", "cat", "args"]
    fields += [f"args.{k}" for k in ("device", "correlation", "grid", "block", "stream")]
    for ev in rng.sample(events, 80):
        field, value = rng.choice(fields), rng.choice(odd)
        if field.startswith("args.") and isinstance(ev.get("args"), dict):
            ev["args"][field[5:]] = value
        elif not field.startswith("args."):
            ev[field] = value
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and "args" in e]
    for ev in rng.sample(launches, 30):  # the same id again, on another thread: ties
        again = {**copy.deepcopy(ev), "tid": rng.randint(1, 9)}
        if isinstance(ev.get("ts"), float | int):
            again["ts"] = ev["ts"] - rng.choice([0, 0, 0.001, 5])
        events.append(again)
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    for ev in rng.sample(gpu, 20):  # launched by nobody, or by the same call twice
        again = copy.deepcopy(ev)
        if isinstance(again.get("args"), dict):
            again["args"]["correlation"] = rng.choice(
                [-1, 99_999_999, ev["args"].get("correlation")]
            )
        events.append(again)
    rng.shuffle(events)
    return doc


# What each damaged trace reads as (the full tables' reader gave the same columns, and
# refused the same spans): activities, distinct names, warnings; or the span refused.
DAMAGED: dict[int, tuple[int, int, list[str]] | tuple[int, int, int]] = {
    0: (747, 27, ["21 of 747 GPU activities have no matching runtime/driver launch "
                  "(correlation id); they stay unattributed", "skipped 9 malformed events",
                  "1 events with a non-finite or out-of-range time"]),
    1: (51, 1_790_857_026_000_001_000, 1_795_236_285_026_643_925),
    2: (51, 1_000, 4_379_259_026_643_925),
    3: (740, 28, ["16 of 740 GPU activities have no matching runtime/driver launch "
                  "(correlation id); they stay unattributed", "skipped 14 malformed events"]),
    4: (51, 1_790_857_026_000_001_000, 1_795_236_285_026_643_925),
    5: (748, 30, ["17 of 748 GPU activities have no matching runtime/driver launch "
                  "(correlation id); they stay unattributed", "skipped 8 malformed events"]),
}  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_damaged_traces_read_the_same_streamed_or_whole(tmp_path: Path, seed: int) -> None:
    doc = damaged(json.loads(gzip.decompress(FORWARD.read_bytes())), seed)
    if seed == 1:
        doc["distributedInfo"] = {"rank": 1, "world_size": 2}
    if seed == 2:
        doc["baseTimeNanoseconds"] = 2**63  # out of range: read as 0, one warning
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(doc if seed != 3 else doc["traceEvents"]))  # 3: an array
    want = DAMAGED[seed]
    if isinstance(want[2], int):  # a damaged time spans years: refused, one line
        for chunk_bytes in (None, 4096):
            with pytest.raises(BadInput) as info:
                read_chrome_columns(path, chunk_bytes=chunk_bytes)
            days, low, high = want
            assert str(info.value) == f"{path}: " + SPAN.format(
                days=days, low=f"{low:,}", high=f"{high:,}"
            )
        return
    whole = read_chrome_columns(path, chunk_bytes=None)
    assert (len(whole), len(whole.names), whole.meta["warnings"]) == want
    assert_same_columns(read_chrome_columns(path, chunk_bytes=4096), whole)


def test_a_stream_handed_back_after_batches_keeps_none_of_them(tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress(FORWARD.read_bytes()))
    text = json.dumps(doc)[:-1] + ', "traceEvents": []}'  # the second array wins
    path = tmp_path / "twice.json"
    path.write_text(text)
    columns = read_chrome_columns(path, chunk_bytes=4096)
    assert len(columns) == 0 and columns.ranges.empty
    assert_same_columns(columns, read_chrome_columns(path, chunk_bytes=None))


def test_a_kernel_years_away_is_refused(tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress(FORWARD.read_bytes()))
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["ts"] += 86_400e6 * 365  # a year later; its launch stays where it was
    path = tmp_path / "far.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput) as columns:
        load_columns(path, cache=False)
    assert str(columns.value) == f"{path}: " + SPAN.format(
        days=365, low="1,795,236,285,007,138,483", high="1,826,772,285,007,243,602"
    )
