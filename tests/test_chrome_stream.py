"""The streaming Chrome reader gives exactly what a whole-document parse gives.

Real fixtures (every ``tests/data/torch-*.json.gz``: Kineto's own layout and profkit's
rewritten one, with the ``profkit`` header after ``traceEvents``) are split into many
small batches and compared, event by event and column by column, with one parse of the
whole document by the stdlib ``json`` module and with the reader's whole-document path.
SYNTHETIC documents cover what the fixtures do not: the header after the events, strings
and nested objects that look like event boundaries, layouts the splitter hands back.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from column_checks import assert_same_columns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profkit.errors import BadInput
from profkit.traces.chrome import read_chrome_columns
from profkit.traces.chrome_json import EventBatches, NotStreamable

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("torch-*.json.gz"))
ERRORS = (orjson.JSONDecodeError, UnicodeDecodeError)


def batches_of(data: bytes, chunk_bytes: int) -> tuple[list[list[Any]], dict[str, Any]]:
    batches = EventBatches(io.BytesIO(data), orjson.loads, ERRORS, chunk_bytes)
    return list(batches), batches.header


def assert_same_trace(path: Path, chunk_bytes: int) -> None:
    streamed = read_chrome_columns(path, chunk_bytes=chunk_bytes)
    assert_same_columns(streamed, read_chrome_columns(path, chunk_bytes=None))


def test_there_are_chrome_fixtures() -> None:
    assert len(FIXTURES) >= 5


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_events_and_header_are_the_whole_documents(path: Path) -> None:
    data = gzip.decompress(path.read_bytes())
    doc = json.loads(data)  # the stdlib parser: independent of the reader's
    batches, header = batches_of(data, 64 << 10)
    assert len(batches) > 10  # really streamed, not handed back whole
    assert [e for batch in batches for e in batch] == doc.pop("traceEvents")
    assert header == doc


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_columns_equal_the_whole_document_reader(path: Path) -> None:
    assert_same_trace(path, 4096)  # hundreds of cuts, the header across several reads
    assert_same_trace(path, 1 << 22)  # the default size: the file in one or two batches


def test_fixture_meta_keeps_the_header_after_the_events() -> None:
    """profkit's rewrite puts ``profkit`` after ``traceEvents``; Kineto puts it before."""
    rank1 = read_chrome_columns(DATA / "torch-h200x2-small-ddp2-rank1.json.gz", chunk_bytes=4096)
    assert rank1.meta["profkit"]["rank"] == 1 and rank1.meta["config"]["nproc"] == 2
    assert rank1.meta["distributedInfo"]["rank"] == 1
    assert rank1.meta["base_time_ns"] == 1790857026000000000
    assert rank1.meta["gpus"] == ["NVIDIA H200", "NVIDIA H200"]


# --------------------------------------------------------------------- synthetic documents


def event(i: int, name: str = "forward", **args: Any) -> dict[str, Any]:
    """SYNTHETIC: a Kineto-shaped event; every fourth a kernel, its launch before it."""
    kinds = ["user_annotation", "cuda_runtime", "kernel", "cpu_op"]
    cat = kinds[i % 4]
    ev = {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 7 if cat != "kernel" else 3,
          "ts": 1000.0 + i * 10.125, "dur": 5.5 + i % 3, "args": {"correlation": i // 4, **args}}  # fmt: skip
    if cat == "kernel":
        ev["args"].update(device=0, stream=3, grid=[1, 2, 3], block=[32, 1, 1])
    return ev


def header_after(events: list[dict[str, Any]]) -> dict[str, Any]:
    """SYNTHETIC: every header key after ``traceEvents``, as some writers put them."""
    return {
        "traceEvents": events,
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 4},
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "profkit": {"command": "torch", "config": {"size": "tiny", "ctx": 16}},
        "traceName": "t.json",
    }


def write(tmp_path: Path, doc: Any, name: str = "t.json", indent: int | None = None) -> Path:
    path = tmp_path / name
    data = json.dumps(doc, indent=indent).encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_header_after_the_events(tmp_path: Path, indent: int | None, name: str) -> None:
    doc = header_after([event(i) for i in range(400)])
    path = write(tmp_path, doc, name, indent)
    data = json.dumps(doc, indent=indent).encode()
    batches, header = batches_of(data, 512)
    assert len(batches) > 20
    assert header == {k: v for k, v in doc.items() if k != "traceEvents"}
    assert_same_trace(path, 512)
    columns = read_chrome_columns(path, chunk_bytes=512)
    assert columns.meta["distributedInfo"]["rank"] == 3
    assert columns.meta["config"] == {"size": "tiny", "ctx": 16}
    assert columns.meta["gpus"] == ["NVIDIA H100 80GB HBM3"]
    first = columns.ranges.iloc[0]  # event 0: ts 1000.0 µs, dur 5.5 µs after the base
    assert (first["start"], first["end"]) == (1_700_000_000_001_000_000, 1_700_000_000_001_005_500)
    assert len(columns) == 100 and (columns.arrays["launch_start"] >= 0).all()


def test_boundaries_inside_strings_and_nested_objects(tmp_path: Path) -> None:
    """Text that looks like ``}, {"`` inside a name or in nested args is never a cut."""
    sly = 'kernel<{lambda()#1}, {"x": 1}>}, {'  # its closing quote follows: `}, {"`
    events = [
        event(i, name=sly if i % 3 else "forward", nested=[{"a": 1}, {"b": [{"c": 2}]}])
        for i in range(300)
    ]
    doc = header_after(events)
    data = json.dumps(doc).encode()
    batches, _ = batches_of(data, 700)
    assert [e for batch in batches for e in batch] == events
    assert_same_trace(write(tmp_path, doc), 700)


def test_layouts_it_hands_back_are_read_whole(tmp_path: Path) -> None:
    events = [event(i) for i in range(50)]
    big_after = {**header_after(events), "extra": [{"k": i} for i in range(2000)]}
    nested_key = {"x": {"traceEvents": [1]}, **header_after(events)}
    twice = json.dumps(header_after(events))[:-1] + ', "traceEvents": []}'
    for doc in (events, big_after, nested_key):  # a top-level array; more after the array
        data = json.dumps(doc).encode()
        try:
            batches, header = batches_of(data, 256)
        except NotStreamable:
            pass
        else:  # streamed: then exactly what a whole parse gives
            whole = json.loads(data)
            assert [e for batch in batches for e in batch] == whole.pop("traceEvents")
            assert header == whole
        assert_same_trace(write(tmp_path, doc), 256)
    with pytest.raises(NotStreamable):
        batches_of(twice.encode(), 256)
    (tmp_path / "twice.json").write_text(twice)
    assert read_chrome_columns(tmp_path / "twice.json", chunk_bytes=256).ranges.empty
    first_not_a_list = '{"traceEvents": 5, ' + json.dumps(header_after(events))[1:]
    (tmp_path / "five.json").write_text(first_not_a_list)  # streams: the array wins
    assert_same_trace(tmp_path / "five.json", 256)
    assert len(batches_of(first_not_a_list.encode(), 256)[0]) > 5
    assert_same_trace(write(tmp_path, header_after([])), 256)  # no events at all


def test_truncated_and_corrupt_documents_are_one_line(tmp_path: Path) -> None:
    data = json.dumps(header_after([event(i) for i in range(400)]), indent=2).encode()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) * 3 // 4])
    with pytest.raises(BadInput) as info:
        read_chrome_columns(cut, chunk_bytes=1024)
    message = str(info.value)
    assert "\n" not in message and "not valid JSON (truncated?)" in message
    assert f"near byte {len(data) * 3 // 4:,} of the JSON" in message
    broken = tmp_path / "broken.json"
    broken.write_bytes(data.replace(b'"ph": "X"', b'"ph": X', 1))  # early: not the tail
    with pytest.raises(BadInput, match="is not valid JSON: unexpected character"):
        read_chrome_columns(broken, chunk_bytes=1024)


JSON_TEXT = st.text(alphabet=st.sampled_from(list('{}[],:" \\\nab')), max_size=12)
KEY = st.integers(0, 9).flatmap(lambda i: st.just("traceEvents") if i == 9 else JSON_TEXT)
NESTED = st.recursive(
    st.none() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | JSON_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEY, inner, max_size=3),
    max_leaves=8,
)


@settings(
    max_examples=50, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(
    events=st.lists(st.dictionaries(KEY, NESTED, max_size=4), max_size=30),
    before=st.dictionaries(KEY, NESTED, max_size=3),
    after=st.dictionaries(KEY, NESTED, max_size=3),
    indent=st.sampled_from([None, 0, 1, 4]),
    chunk_bytes=st.integers(1, 300),
)
def test_any_document_streams_exactly_or_is_handed_back(
    events: list[dict[str, Any]],
    before: dict[str, Any],
    after: dict[str, Any],
    indent: int | None,
    chunk_bytes: int,
) -> None:
    before.pop("traceEvents", None)
    after.pop("traceEvents", None)
    data = json.dumps({**before, "traceEvents": events, **after}, indent=indent).encode()
    whole = orjson.loads(data)
    try:
        batches, header = batches_of(data, chunk_bytes)
    except NotStreamable:
        return  # the reader then parses it whole
    assert [e for batch in batches for e in batch] == whole.pop("traceEvents")
    assert header == whole
