"""Chrome traces read straight into compact columns give what their tables gave.

``read_chrome_columns`` parses a trace once and gathers its GPU activities as arrays,
batch by batch; ``columns.from_trace(read_chrome_trace(p))`` is what ``load_columns`` read
before (the per-activity kernels table, then factorized). Both must agree element for
element, on every committed fixture (``tests/data/torch-*.json.gz``: one process, and the
two ranks of a DDP run, which keep GPU starts and devices), streamed in small batches or
parsed whole, and on SYNTHETIC traces with what the fixtures lack: damaged fields of
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
import pandas as pd
import pytest

from profkit.errors import BadInput
from profkit.traces import chrome
from profkit.traces.chrome import read_chrome_columns, read_chrome_trace
from profkit.traces.columns import DEVICE, START, ActivityColumns, from_trace
from profkit.traces.load import load_columns, load_trace
from profkit.traces.ranks import rank_of_meta

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("torch-*.json.gz"))
RANKS = [p for p in FIXTURES if "rank" in p.name]
FORWARD = DATA / "torch-small-ctx128-forward.json.gz"


def tables_columns(path: Path, chunk_bytes: int | None = 4 << 20) -> ActivityColumns:
    """What ``load_columns`` gave before: the full tables, then ``from_trace``."""
    trace = read_chrome_trace(path, chunk_bytes=chunk_bytes)
    return from_trace(trace, timed=rank_of_meta(trace.meta) is not None)


def assert_same_columns(a: ActivityColumns, b: ActivityColumns) -> None:
    assert list(a.arrays) == list(b.arrays)
    for name, values in b.arrays.items():
        assert a.arrays[name].dtype == values.dtype, name
        np.testing.assert_array_equal(a.arrays[name], values, err_msg=name)
    assert (a.names, a.kinds, a.shapes) == (b.names, b.kinds, b.shapes)
    assert a.threads.dtype == b.threads.dtype
    np.testing.assert_array_equal(a.threads, b.threads)
    pd.testing.assert_frame_equal(a.ranges, b.ranges)
    assert a.meta == b.meta


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_columns_are_those_of_its_tables(path: Path) -> None:
    columns = read_chrome_columns(path)
    assert_same_columns(columns, tables_columns(path))
    assert_same_columns(read_chrome_columns(path, chunk_bytes=None), columns)
    assert_same_columns(read_chrome_columns(path, chunk_bytes=64 << 10), columns)
    assert len(columns) > 100 and len(columns.names) > 10
    timed = {START, DEVICE} <= set(columns.arrays)
    assert timed == (path in RANKS)  # a trace that names its rank keeps GPU starts


def test_load_columns_reads_chrome_traces_without_the_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = tables_columns(FORWARD)

    def no_tables(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the kernels table was built")

    monkeypatch.setattr(chrome, "kernels_table", no_tables)
    columns = load_columns(FORWARD, cache=False)
    assert_same_columns(columns, expected)
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


@pytest.mark.parametrize("seed", range(6))
def test_damaged_traces_give_the_columns_of_their_tables(tmp_path: Path, seed: int) -> None:
    doc = damaged(json.loads(gzip.decompress(FORWARD.read_bytes())), seed)
    if seed == 1:
        doc["distributedInfo"] = {"rank": 1, "world_size": 2}
    if seed == 2:
        doc["baseTimeNanoseconds"] = 2**63  # out of range: read as 0, one warning
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(doc if seed != 3 else doc["traceEvents"]))  # 3: an array
    expected = tables_columns(path, chunk_bytes=None)
    assert any("malformed" in w for w in expected.meta["warnings"])
    for chunk_bytes in (None, 4096):
        try:
            columns = read_chrome_columns(path, chunk_bytes=chunk_bytes)
        except BadInput as exc:  # a damaged time can span years: load_trace refuses it too
            with pytest.raises(BadInput) as info:
                load_trace(path)
            assert str(exc) == str(info.value)
        else:
            assert_same_columns(columns, expected)


def test_a_stream_handed_back_after_batches_keeps_none_of_them(tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress(FORWARD.read_bytes()))
    text = json.dumps(doc)[:-1] + ', "traceEvents": []}'  # the second array wins
    path = tmp_path / "twice.json"
    path.write_text(text)
    columns = read_chrome_columns(path, chunk_bytes=4096)
    assert len(columns) == 0 and columns.ranges.empty
    assert_same_columns(columns, tables_columns(path, chunk_bytes=None))


def test_a_kernel_years_away_is_refused_as_load_trace_refuses_it(tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress(FORWARD.read_bytes()))
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    kernel["ts"] += 86_400e6 * 365  # a year later; its launch stays where it was
    path = tmp_path / "far.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput) as tables:
        load_trace(path)
    with pytest.raises(BadInput) as columns:
        load_columns(path, cache=False)
    assert str(columns.value) == str(tables.value)
    assert "its timestamps span 365 days" in str(columns.value)
