"""Memory snapshots with millions of trace entries: the streaming reader, the columnar
timeline, the streamed HTML page.

- On every real fixture, the summary, the timeline and what the picture is made of are the
  JSON facts the old code (commit 3160c87: whole pickle as Python objects) computed
  (tests/data/memory-golden.json, see tests/memory_golden.py).
- The streaming reader (``read_snapshot``, with and without ``trace_fast``'s runs) gives
  the columns of the whole loader (``load_snapshot``, C unpickler) on the fixtures, on a
  snapshot grown to ~200,000 entries with pickle the way torch writes it
  (benchmarks/memory_scale.py), on odd but valid entries in every protocol, and the same
  one-line error on damaged, truncated and flipped files.
- The grown snapshot's last states are the fixture's, to the byte; its reader's peak RSS
  is a fraction of the whole loader's (measured in fresh processes; not a timing).

Timings live in benchmarks/memory_scale.py, never here.
"""

from __future__ import annotations

import base64
import json
import lzma
import pickle
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_scripts import benchmark
from memory_golden import FIXTURES, facts
from memory_synth import RunsCode

from profkit.errors import BadInput
from profkit.memory import html
from profkit.memory.snapshot import load_snapshot, loads_plain, read_snapshot, snapshot_columns
from profkit.memory.summary import summarize
from profkit.memory.timeline import reconstruct
from profkit.memory.trace_columns import SnapshotColumns

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]
SMALL = DATA / "memory-small-ctx128-train-fp32.pickle.xz"
TINY = DATA / "memory-tiny-ctx64-forward-fp32.pickle.xz"


def _memory_scale() -> Any:
    return benchmark("memory_scale")


def plain(path: Path) -> dict[str, Any]:
    return loads_plain(lzma.decompress(path.read_bytes()))


def assert_same_columns(a: SnapshotColumns, b: SnapshotColumns) -> None:
    """Same segments and settings; per trace, the same rows (stacks compared by content)."""
    assert a.segments == b.segments
    assert a.allocator_settings == b.allocator_settings
    assert len(a.traces) == len(b.traces)
    for x, y in zip(a.traces, b.traces, strict=True):
        names_a, names_b = np.array(a.actions, dtype=object), np.array(b.actions, dtype=object)
        assert (names_a[x.action] == names_b[y.action]).all()
        np.testing.assert_array_equal(x.addr, y.addr)
        np.testing.assert_array_equal(x.size, y.size)
        assert (x.time_us is None) == (y.time_us is None)
        if x.time_us is not None:
            np.testing.assert_array_equal(x.time_us, y.time_us)
        stacks_a = [json.dumps(s) for s in a.sites] + ["none"]  # site -1: no frames
        stacks_b = [json.dumps(s) for s in b.sites] + ["none"]
        assert [stacks_a[s] for s in x.site.tolist()] == [stacks_b[s] for s in y.site.tolist()]
        assert x.ooms == y.ooms


def read_three_ways(path: Path) -> list[SnapshotColumns]:
    return [
        snapshot_columns(load_snapshot(path)),
        read_snapshot(path),
        read_snapshot(path, fast=False),
    ]


def errors_three_ways(path: Path) -> list[str]:
    messages = []
    for read in (load_snapshot, read_snapshot, lambda p: read_snapshot(p, fast=False)):
        with pytest.raises(BadInput) as caught:
            read(path)
        messages.append(str(caught.value))
    return messages


# --- the old code's results, on every real fixture -----------------------------------------

GOLDEN = json.loads((DATA / "memory-golden.json").read_text())


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_summary_timeline_and_picture_are_the_old_codes(path: Path) -> None:
    assert set(GOLDEN) == {p.name for p in FIXTURES}
    assert facts(path) == GOLDEN[path.name]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_streaming_reader_gives_the_whole_loaders_columns(path: Path) -> None:
    whole, fast, slow = read_three_ways(path)
    assert_same_columns(fast, whole)
    assert_same_columns(slow, whole)
    assert len(whole.traces[0]) == GOLDEN[path.name]["timeline"]["events"]


# --- a snapshot grown to ~200,000 entries ---------------------------------------------------


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The small fixture's trace grown 60 times (benchmarks/memory_scale.py), protocol 4."""
    snapshot = _memory_scale().replicate(plain(SMALL), 60)
    path = tmp_path_factory.mktemp("grown") / "grown.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    return path, len(snapshot["device_traces"][0])


@pytest.mark.slow
def test_grown_snapshot_reads_like_the_whole_loader(grown: tuple[Path, int]) -> None:
    path, entries = grown
    assert entries > 190_000
    whole, fast, slow = read_three_ways(path)
    assert_same_columns(fast, whole)
    assert_same_columns(slow, whole)
    assert summarize(fast, top=1000) == summarize(whole, top=1000)


@pytest.mark.slow
def test_grown_snapshot_ends_in_the_fixtures_own_states(grown: tuple[Path, int]) -> None:
    """The last copy is the fixture's trace: walking back from the dump, its states are the
    fixture's to the byte, and no event disagrees with the dump."""
    path, entries = grown
    big, one = reconstruct(read_snapshot(path)), reconstruct(read_snapshot(SMALL))
    assert big.events == entries and big.inconsistent_events == 0
    tail = slice(entries - one.events, None)
    for name in ("requested_bytes", "allocated_bytes", "reserved_bytes"):
        np.testing.assert_array_equal(getattr(big, name)[tail], getattr(one, name))
    assert big.allocated_bytes.max() == 2_669_673_984  # the allocator's own peak, at capture


def _peak_rss_mib(code: str) -> float:
    """Peak RSS of ``python -c code`` (benchmarks/memory_scale.py's launcher, so that this
    big process's own peak, which Linux carries over into its children, is not counted)."""
    result = _memory_scale().measure([sys.executable, "-c", code], ROOT)
    return float(result["peak_rss_mib"])


@pytest.mark.slow
def test_grown_snapshot_reader_peak_is_a_fraction_of_the_whole_loaders(
    grown: tuple[Path, int],
) -> None:
    """Peak RSS above an interpreter that only imported the readers (fresh processes)."""
    path, entries = grown
    start = "from pathlib import Path; from profkit.memory.snapshot import *; p = Path(%r)\n"
    base = _peak_rss_mib(start % str(path))
    streamed = _peak_rss_mib(start % str(path) + "read_snapshot(p)") - base
    whole = _peak_rss_mib(start % str(path) + "load_snapshot(p)") - base
    assert streamed * 3 < whole, (streamed, whole)
    assert streamed * 1024**2 < 150 * entries  # ~60 bytes an entry, plus a window's lists


# --- odd but valid entries, every protocol ----------------------------------------------------


def odd_snapshot() -> dict[str, Any]:
    """The tiny fixture grown past 2,000 entries (past the reader's first batch), with rare
    things scattered in: float and missing times, a shared stack, a new frame, an unknown
    action, an OOM, extra keys, a long string, a bare stack list shared by two entries."""
    snapshot = _memory_scale().replicate(plain(TINY), 8)
    trace = snapshot["device_traces"][0]
    assert len(trace) > 2_000
    trace[1500]["time_us"] = float(trace[1500]["time_us"])
    trace[1600]["frames"] = trace[1599]["frames"]  # one list, two entries
    trace[1700]["frames"] = [{"filename": "/home/me/new.py", "line": 3, "name": "f"}]
    trace[1800]["user_metadata"] = "x" * 300
    trace[1900]["extra"] = {"nested": [1, 2.5, None, True]}
    trace.insert(2000, {"action": "oom", "size": 2**30, "device_free": 7, "stream": 0,
                        "time_us": trace[1999]["time_us"], "frames": []})  # fmt: skip
    trace.insert(2001, dict(trace[2002], action="something_new"))
    return snapshot


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_odd_entries_read_the_same_every_way(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "odd.pickle"
    path.write_bytes(pickle.dumps(odd_snapshot(), protocol=protocol))
    whole, fast, slow = read_three_ways(path)
    assert_same_columns(fast, whole)
    assert_same_columns(slow, whole)
    assert "something_new" in whole.actions
    assert list(fast.traces[0].ooms) == [2000]


def test_missing_times_and_a_bare_list_of_segments(tmp_path: Path) -> None:
    snapshot = odd_snapshot()
    del snapshot["device_traces"][0][1234]["time_us"]
    path = tmp_path / "untimed.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    columns = read_three_ways(path)
    assert all(c.traces[0].time_us is None for c in columns)
    assert_same_columns(columns[1], columns[0])
    path.write_bytes(pickle.dumps(snapshot["segments"], protocol=4))
    legacy = read_snapshot(path)
    assert legacy.legacy and legacy.traces == []
    assert legacy.segments == load_snapshot(path)["segments"]


# --- damaged files: the same one line, whichever reader -----------------------------------


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda e: e.update(size=2**70), "[2345].size is 1180591620717411303424"),
        (lambda e: e.update(size=True), "[2345].size is True, not a whole number"),
        (lambda e: e.update(addr=-5), "[2345].addr is -5, not a whole number"),
        (lambda e: e.update(time_us=float("nan")), "[2345].time_us is nan, not a time"),
        (lambda e: e.update(frames=[7]), "[2345].frames[0] is 7, not a frame"),
        (lambda e: e.update(frames="x.py:1"), "[2345].frames is 'x.py:1', not a list"),
        (lambda e: e.update(action=5), "[2345].action is 5, not text"),
        (lambda e: e.pop("addr"), "[2345] has no 'addr'"),
    ],
)
def test_a_bad_entry_deep_in_the_trace_is_named_the_same(
    tmp_path: Path, damage: Any, needle: str
) -> None:
    snapshot = odd_snapshot()
    damage(snapshot["device_traces"][0][2345])
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    messages = errors_three_ways(path)
    assert len(set(messages)) == 1, messages
    assert f"not a usable CUDA memory snapshot (device_traces[0]{needle}" in messages[0]


@pytest.mark.parametrize("traces", [float("nan"), {"x": 1}, [[{"action": "alloc"}], 7]])
def test_a_bad_trace_list_is_named_the_same(tmp_path: Path, traces: Any) -> None:
    snapshot = odd_snapshot()
    snapshot["device_traces"] = traces
    path = tmp_path / "bad.pickle"
    for protocol in (0, 4):
        path.write_bytes(pickle.dumps(snapshot, protocol=protocol))
        messages = errors_three_ways(path)
        assert len(set(messages)) == 1 and "not a usable CUDA memory snapshot" in messages[0]


def test_globals_are_refused_by_the_streaming_reader_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    snapshot = odd_snapshot()
    snapshot["device_traces"][0][2100]["frames"] = [RunsCode(marker)]
    for protocol in (0, 2, 4):
        path = tmp_path / f"evil{protocol}.pickle"
        path.write_bytes(pickle.dumps(snapshot, protocol=protocol))
        for message in errors_three_ways(path):
            assert "refused to load" in message and "system" in message
    assert not marker.exists()


def test_every_truncation_is_one_line(tmp_path: Path) -> None:
    data = lzma.decompress(TINY.read_bytes())
    path = tmp_path / "cut.pickle"
    cuts = sorted(
        {*range(1, len(data), max(1, len(data) // 150)), *range(len(data) - 40, len(data))}
    )
    for cut in cuts:
        path.write_bytes(data[:cut])
        for read in (read_snapshot, lambda p: read_snapshot(p, fast=False)):
            with pytest.raises(BadInput, match=r"truncated or corrupt|is not a pickle"):
                read(path)


def test_flipped_bytes_never_escape_as_a_traceback(tmp_path: Path) -> None:
    data = pickle.dumps(odd_snapshot(), protocol=4)
    rng = random.Random(13)
    path = tmp_path / "flipped.pickle"
    for _ in range(40):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            damaged[rng.randrange(2, len(damaged))] = rng.randrange(256)
        path.write_bytes(bytes(damaged))
        results = []
        for read in (read_snapshot, lambda p: read_snapshot(p, fast=False)):
            try:
                results.append(read(path))
            except BadInput as exc:
                assert "\n" not in str(exc)
                results.append(None)
        if all(r is not None for r in results):
            assert_same_columns(results[0], results[1])


# --- the HTML page -------------------------------------------------------------------------


def torch_page(payload: bytes) -> str:
    """torch.cuda._memory_viz's page around ``payload``, built as its _format_viz does."""
    from torch.cuda import _memory_viz

    payload += b"\x00" * (3 - len(payload) % 3)
    snapshot = json.dumps(
        [{"name": "snapshot.pickle", "base64": base64.b64encode(payload).decode()}]
    )
    kind = repr("Active Memory Timeline")
    return _memory_viz._memory_viz_template.replace("$VIZ_KIND", kind).replace(
        "$SNAPSHOT", snapshot
    )


@pytest.mark.parametrize("compress", [False, True])
def test_html_embeds_a_protocol_4_files_own_bytes(tmp_path: Path, compress: bool) -> None:
    data = pickle.dumps(odd_snapshot(), protocol=4)
    path = tmp_path / ("s.pickle.xz" if compress else "s.pickle")
    path.write_bytes(lzma.compress(data) if compress else data)
    page = html.write_html(path, read_snapshot(path), tmp_path / "s.html")
    assert page.read_text() == torch_page(data)


def test_html_of_another_protocol_is_torchs_own_page(tmp_path: Path) -> None:
    from torch.cuda import _memory_viz

    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(plain(TINY), protocol=2))
    page = html.write_html(path, read_snapshot(path), tmp_path / "s.html")
    assert page.read_text() == _memory_viz.trace_plot(load_snapshot(path))


def test_html_refuses_to_load_a_huge_other_protocol_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(plain(TINY), protocol=2))
    monkeypatch.setattr(html, "HTML_WHOLE_MAX_ENTRIES", 100)
    with pytest.raises(
        BadInput, match=r"345 trace entries \(at most 100\); save it with pickle protocol 4"
    ):
        html.write_html(path, read_snapshot(path), tmp_path / "s.html")
    assert not (tmp_path / "s.html").exists()
