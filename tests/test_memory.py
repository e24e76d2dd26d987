"""Memory snapshots: safe loading, reconstruction of the peak, summary and timeline picture.

No CUDA here, so these tests use synthetic snapshots (tests/memory_synth.py) built to the
format torch documents for ``torch.cuda.memory._snapshot()``, with the ground truth of
every state kept by the toy allocator that made them. Real snapshots captured on a GPU
(tests/data/memory-*.pickle.xz, from benchmarks/gpu_memory.sh) back the golden tests at
the end; those skip until the fixtures are committed.
"""

from __future__ import annotations

import json
import lzma
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib import image as mpimg
from memory_synth import MIB, RunsCode, SnapshotBuilder, frames, transformer_step

from profkit.errors import BadInput, ProfkitWarning
from profkit.memory.snapshot import load_snapshot, loads_plain
from profkit.memory.summary import call_site, summarize, summarize_file
from profkit.memory.timeline import reconstruct
from profkit.run.child import child_argv, run_child
from profkit.run.recorder import dump_snapshot
from profkit.sidecar import read_sidecar, sidecar_path
from profkit.workload.config import WorkloadConfig

DATA = Path(__file__).parent / "data"


# --- safe loading -------------------------------------------------------------------------


def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pickle"
    evil = {"segments": [], "device_traces": [], "x": RunsCode(marker)}
    path.write_bytes(pickle.dumps(evil, protocol=4))
    with pytest.raises(BadInput, match=r"refused to load.*system"):
        load_snapshot(path)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_any_global_is_refused_even_harmless_ones(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "set.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "when": range(3)}, protocol=protocol))
    with pytest.raises(BadInput, match="range"):  # protocol 2 names it __builtin__.xrange
        load_snapshot(path)


def test_snapshot_round_trip_is_plain_protocol_4(tmp_path: Path) -> None:
    snapshot = transformer_step().snapshot()
    path = tmp_path / "run.pickle"
    dump_snapshot(snapshot, path)
    data = path.read_bytes()
    assert data[:2] == b"\x80\x04"  # protocol 4: what memory_viz reads
    assert loads_plain(data) == snapshot
    assert load_snapshot(path)["device_traces"] == snapshot["device_traces"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"hello, world\n", "not a pickle"),
        # A valid pickle of another protocol is a pickle, just not a snapshot.
        (pickle.dumps({"a": 1}, protocol=0), "pickled dict, not a CUDA memory snapshot"),
        (pickle.dumps([1, 2, 3], protocol=4), "pickled list, not a CUDA memory snapshot"),
        (pickle.dumps({"a": 1}, protocol=4), "pickled dict, not a CUDA memory snapshot"),
        (
            pickle.dumps({"segments": [{"address": 1}]}, protocol=4),
            r"not a usable CUDA memory snapshot \(segments\[0\] has no 'total_size'\)",
        ),
        (
            pickle.dumps({"segments": [], "device_traces": [[{"x": 1}]]}, protocol=4),
            r"device_traces\[0\]\[0\] has no 'action'",
        ),
    ],
)
def test_files_that_are_not_snapshots(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "x.pickle"
    path.write_bytes(content)
    with pytest.raises(BadInput, match=message):
        load_snapshot(path)


def test_truncated_pickles_plain_and_compressed(tmp_path: Path) -> None:
    data = pickle.dumps(transformer_step().snapshot(), protocol=4)
    (tmp_path / "cut.pickle").write_bytes(data[: len(data) // 2])
    with pytest.raises(BadInput, match="truncated or corrupt"):
        load_snapshot(tmp_path / "cut.pickle")
    packed = lzma.compress(data)
    (tmp_path / "cut.pickle.xz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(BadInput, match="truncated or corrupt"):
        load_snapshot(tmp_path / "cut.pickle.xz")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no such file"):
        load_snapshot(tmp_path / "nope.pickle")
    with pytest.raises(BadInput, match="is a directory"):
        load_snapshot(tmp_path)


def test_legacy_list_of_segments_and_missing_block_addresses(tmp_path: Path) -> None:
    snapshot = transformer_step().snapshot()
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            del block["address"]
    path = tmp_path / "legacy.pickle"
    path.write_bytes(pickle.dumps(snapshot["segments"], protocol=4))
    loaded = load_snapshot(path)
    assert loaded["device_traces"] == []
    first = loaded["segments"][0]
    assert first["blocks"][0]["address"] == first["address"]
    assert first["blocks"][1]["address"] == first["address"] + first["blocks"][0]["size"]


def test_sidecar_path_strips_compression() -> None:
    assert sidecar_path(Path("p/run.pickle")) == Path("p/run.profkit.json")
    assert sidecar_path(Path("p/run.pickle.xz")) == Path("p/run.profkit.json")


# --- reconstruction -----------------------------------------------------------------------


def test_every_state_matches_the_allocator_ground_truth() -> None:
    builder = transformer_step(layers=5, steps=3)
    timeline = reconstruct(builder.snapshot())
    assert timeline.events == len(builder.events)
    assert np.array_equal(timeline.requested_bytes, builder.truth)
    assert timeline.inconsistent_events == 0
    # Block bytes too, unsplit blocks included (the toy follows the allocator's rules).
    assert np.array_equal(timeline.allocated_bytes, builder.block_truth)


def test_a_large_request_keeps_the_rest_of_its_block_when_not_worth_splitting() -> None:
    b = SnapshotBuilder()
    b.start_recording()
    whole = b.alloc(64 * MIB - 700 * 1024)  # leaves 700 KiB: kept, not split off
    b.free(whole)
    split = b.alloc(62 * MIB)  # leaves 2 MiB: split
    b.free(split)
    small = b.alloc(700 * 1024)  # small pool: always exactly rounded
    b.free(small)
    timeline = reconstruct(b.snapshot())
    assert timeline.allocations.block_bytes.tolist() == [64 * MIB, 62 * MIB, 700 * 1024]
    assert timeline.allocated_bytes.max() == 64 * MIB
    assert timeline.requested_bytes.max() == 64 * MIB - 700 * 1024


def test_walking_back_survives_a_clipped_ring_buffer() -> None:
    builder = transformer_step(layers=4, steps=2)
    full = reconstruct(builder.snapshot())
    for keep in (1, 10, 57):
        clipped = reconstruct(builder.snapshot(keep_last=keep))
        assert clipped.events == keep
        assert np.array_equal(clipped.requested_bytes, full.requested_bytes[-(keep + 1) :])
        assert np.array_equal(clipped.reserved_bytes, full.reserved_bytes[-(keep + 1) :])


def test_no_trace_means_one_state_the_dump() -> None:
    builder = transformer_step(layers=2)
    timeline = reconstruct(builder.snapshot(keep_last=0))
    assert timeline.events == 0
    assert timeline.requested_bytes.tolist() == [builder.requested_bytes()]
    assert timeline.peak_state == 0


def test_address_reuse_and_rounding() -> None:
    b = SnapshotBuilder()
    b.start_recording()
    first = b.alloc(1000, frames(1))
    b.free(first)
    second = b.alloc(1000, frames(2))  # same block size: the same address again
    assert second == first
    b.alloc(100, frames(3))
    timeline = reconstruct(b.snapshot())
    assert timeline.requested_bytes.tolist() == [0, 0, 1000, 0, 0, 1000, 1100]
    assert timeline.allocated_bytes.tolist()[-1] == 1024 + 512  # rounded to 512-byte blocks
    live = timeline.live_at(timeline.events)
    assert [(a.size, a.frames[1]["line"]) for a in live] == [(1000, 2), (100, 3)]


def test_reserved_memory_follows_segment_events() -> None:
    b = SnapshotBuilder()
    b.start_recording()
    b.alloc(10 * MIB)
    b.alloc(70 * MIB)  # does not fit the first 64 MiB segment: a second one
    timeline = reconstruct(b.snapshot())
    assert timeline.reserved_bytes[0] == 0
    assert timeline.reserved_bytes[-1] == (64 + 70) * MIB
    assert timeline.action_count("segment_alloc") == 2


def test_oom_event_is_reported_with_its_request() -> None:
    b = transformer_step(layers=2)
    b.oom(80 * 1024**3)
    summary = summarize(b.snapshot())
    assert summary["oom_events"] == [
        {"event": len(b.events) - 1, "size_bytes": 80 * 1024**3, "device_free_bytes": 123}
    ]


# --- summary ------------------------------------------------------------------------------


def test_call_site_skips_torch_and_stdlib_frames() -> None:
    stack = [
        {"filename": "/usr/lib/python3.12/site-packages/torch/nn/functional.py", "line": 9, "name": "linear"},
        {"filename": "/usr/lib/python3.12/contextlib.py", "line": 81, "name": "inner"},
        {"filename": "/home/me/proj/model.py", "line": 42, "name": "forward"},
        {"filename": "/home/me/proj/train.py", "line": 7, "name": "main"},
    ]  # fmt: skip
    assert call_site(stack) == "proj/model.py:42 forward"
    assert call_site(stack[:2]) == "nn/functional.py:9 linear"  # nothing of the user's
    assert call_site([{"filename": "??", "line": 0, "name": "at::empty"}]) == "??:0 at::empty"
    assert call_site([]) is None


def test_summary_contract_and_peak() -> None:
    builder = transformer_step(layers=4, steps=2)
    summary = summarize(builder.snapshot(), top=3)
    contract = {
        "peak_allocated_bytes",
        "allocated_at_start_bytes",
        "reserved_bytes",
        "top_allocations",
    }
    assert contract <= summary.keys()
    assert summary["peak_allocated_bytes"] == max(builder.truth)  # all sizes are 512-multiples
    assert summary["allocated_at_start_bytes"] == builder.truth[0]
    assert summary["peak_event_index"] == int(np.argmax(builder.truth)) - 1
    assert len(summary["top_allocations"]) == 3
    for row in summary["top_allocations"]:
        assert {"size_bytes", "count", "site"} <= row.keys()
    sizes = [r["size_bytes"] for r in summary["top_allocations"]]
    assert sizes == sorted(sizes, reverse=True)
    json.dumps(summary)  # plain JSON all the way down


def test_sites_at_the_peak_with_phase_marks() -> None:
    builder = transformer_step(layers=4, steps=1)
    meta = {"phase_marks": builder.marks, "config": {"size": "2.7B", "ctx": 256, "batch": 4}}
    summary = summarize(builder.snapshot(), top=10, meta=meta)
    sites = {r["site"]: r for r in summary["top_allocations"]}
    # Weights were allocated before the trace but are alive at the dump: their stack is known.
    assert sites["profkit/model.py:30 __init__"]["count"] == 4
    # Autograd's gradients carry no Python stack; the phase marks say when they were made.
    # The first step's peak: AdamW's state appears while every gradient is still alive.
    assert sites["(no Python stack) in backward"]["size_bytes"] == 8 * 6 * MIB
    assert sites["profkit/workload.py:133 _optimizer_step"]["count"] == 8
    assert summary["peak_phase"] == "optimizer"
    assert summary["residual_stream_bytes"] == 4 * 256 * 2560 * 4


def test_summarize_file_reads_the_sidecar(tmp_path: Path) -> None:
    builder = transformer_step(layers=3)
    path = tmp_path / "run.pickle"
    dump_snapshot(builder.snapshot(), path)
    sidecar_path(path).write_text(json.dumps({"config": {"size": "tiny", "ctx": 16, "batch": 2}}))
    summary = summarize_file(path)
    assert summary["residual_stream_bytes"] == 2 * 16 * 64 * 4
    sidecar_path(path).write_text("{ not json")
    with pytest.warns(ProfkitWarning, match="not valid JSON"):
        assert read_sidecar(path) is None
    with pytest.warns(ProfkitWarning, match="goes on without its extras"):
        assert summarize_file(path)["residual_stream_bytes"] is None  # the summary still works


def test_top_must_be_positive() -> None:
    with pytest.raises(BadInput, match="--top"):
        summarize(transformer_step().snapshot(), top=0)


# --- the picture --------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_writes_a_real_image(tmp_path: Path, suffix: str) -> None:
    from profkit.memory.plot import plot_timeline

    builder = transformer_step(layers=6, steps=2)
    builder.oom(1024**3)
    out = plot_timeline(
        reconstruct(builder.snapshot()),
        tmp_path / f"t{suffix}",
        detail=20,
        phase_marks=builder.marks,
    )
    if suffix == ".png":
        pixels = mpimg.imread(out)
        assert pixels.shape[0] > 500 and pixels.shape[1] > 1000
        assert pixels[..., :3].std() > 0.05  # not a blank canvas
    else:
        text = out.read_text()
        assert text.lstrip().startswith("<?xml") and "<svg" in text


def test_plot_refuses_unknown_picture_types(tmp_path: Path) -> None:
    from profkit.memory.plot import plot_timeline

    with pytest.raises(BadInput, match=r"\.png"):
        plot_timeline(reconstruct(transformer_step().snapshot()), tmp_path / "t.jpg")


def test_plot_of_an_empty_trace(tmp_path: Path) -> None:
    from profkit.memory.plot import plot_timeline

    timeline = reconstruct(transformer_step(layers=2).snapshot(keep_last=0))
    assert plot_timeline(timeline, tmp_path / "t.png").stat().st_size > 0


# --- the child process --------------------------------------------------------------------


def test_child_argv_carries_capture_options(tmp_path: Path) -> None:
    config = WorkloadConfig(size="tiny", ctx=16)
    argv = child_argv(
        config, tmp_path / "r.json", "memory", {"snapshot": "x.pickle", "stacks": "python"}
    )
    assert argv[-4:] == [
        "--capture",
        "memory",
        "--capture-options",
        '{"snapshot": "x.pickle", "stacks": "python"}',
    ]
    assert "--capture-options" not in child_argv(config, tmp_path / "r.json")


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the no-CUDA path of the child"
)
def test_memory_capture_child_without_cuda_reports_an_error(tmp_path: Path) -> None:
    config = WorkloadConfig(size="tiny", ctx=16, warmup=0, steps=1)
    snapshot = tmp_path / "s.pickle"
    result = run_child(config, "memory", capture_options={"snapshot": str(snapshot)}, timeout_s=120)
    assert result["status"] == "error"
    assert "CUDA" in result["error"]
    assert not snapshot.exists()


# --- real snapshots from the GPU machine (benchmarks/gpu_memory.sh) -------------------------

FIXTURES = sorted(DATA.glob("memory-*.pickle.xz"))


@pytest.mark.skipif(
    not FIXTURES, reason="GPU fixtures not committed yet (benchmarks/gpu_memory.sh)"
)
def test_real_oom_snapshot() -> None:
    meta = read_sidecar(DATA / "memory-10B-ctx128-train-fp32.pickle.xz")
    assert meta is not None and meta["status"] == "oom"
    s = summarize_file(DATA / "memory-10B-ctx128-train-fp32.pickle.xz", top=2)
    # The allocation that failed comes right after the peak; the weights hold 48 GiB.
    assert s["oom_events"] == [
        {"event": 14_809, "size_bytes": 9_437_184, "device_free_bytes": 6_488_064}
    ]
    top = s["top_allocations"][0]
    assert (top["site"], top["count"], top["size_bytes"], top["largest_bytes"]) == (
        "profkit/model.py:82 __init__",
        351,
        51_145_113_600,
        216 * 1024**2,
    )


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_real_snapshot_peak_agrees_with_the_allocator(path: Path) -> None:
    meta = read_sidecar(path)
    assert meta is not None, f"{path.name} needs its .profkit.json sidecar"
    summary = summarize_file(path)
    capture = meta["capture"]
    # The trace records requested sizes: their running peak is the allocator's own.
    assert summary["peak_requested_bytes"] == capture["peak_requested_bytes"]
    # Block sizes replayed from the trace: to the byte on every fixture (the brief: 0.5%).
    assert summary["peak_allocated_bytes"] == capture["max_memory_allocated_bytes"]
    assert summary["inconsistent_events"] == 0
    assert summary["top_allocations"], "a real step allocates something"


@pytest.mark.gpu
def test_capture_on_cuda_agrees_with_max_memory_allocated(tmp_path: Path) -> None:
    from profkit.memory.capture import capture

    configs = [
        WorkloadConfig(size="tiny", ctx=32, mode=m, warmup=1, steps=1) for m in ("forward", "train")
    ]
    rows = capture(configs, tmp_path, name="t")
    for row in rows:
        assert row["status"] == "ok", row["error"]
        summary = summarize_file(Path(row["snapshot"]))
        assert summary["peak_requested_bytes"] == row["peak_requested_bytes"]
        recorded = row["peak_allocated_bytes"]
        assert abs(summary["peak_allocated_bytes"] - recorded) <= 0.005 * recorded
        assert row["after_forward_bytes"] > row["model_bytes"]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_real_snapshots_are_plain_data(path: Path) -> None:
    """What torch writes needs no global at all: nothing to allow-list in the unpickler."""
    import pickletools

    opcodes = {op.name for op, _, _ in pickletools.genops(lzma.decompress(path.read_bytes()))}
    assert not opcodes & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"}  # fmt: skip


def test_real_snapshot_plot(tmp_path: Path) -> None:
    from profkit.memory.plot import plot_file

    result = plot_file(DATA / "memory-tiny-ctx64-train-fp32.pickle.xz", tmp_path / "t.png")
    assert result["peak_allocated_bytes"] == 119_432_704
    assert mpimg.imread(tmp_path / "t.png").shape[:2] == (748, 1430)


# --- the recorder's sequence, with fakes for the CUDA allocator calls only ----------------


class _FakeAllocator:
    """Stands in for torch.cuda's allocator calls (no CUDA here); the workload runs on CPU."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, snapshot: dict[str, Any]) -> None:
        import torch

        self.calls: list[tuple[Any, ...]] = []
        self.snapshot = snapshot
        self.allocated = 1000

        def record(enabled: Any = "all", context: Any = "all", stacks: str = "all",
                   max_entries: int = 0, clear_history: bool = False, **_: Any) -> None:  # fmt: skip
            self.calls.append((enabled, stacks, max_entries, clear_history))

        def allocated(*_: Any) -> int:
            self.allocated += 1000
            return self.allocated

        fakes = {
            "is_available": lambda: True,
            "synchronize": lambda *_: None,
            "memory_allocated": allocated,
            "max_memory_allocated": lambda *_: 123_456,
            "max_memory_reserved": lambda *_: 200_000,
            "memory_reserved": lambda *_: 150_000,
            "memory_stats": lambda *_: {"requested_bytes.all.peak": 120_000},
            "get_device_name": lambda *_: "Fake GPU",
        }
        for name, fake in fakes.items():
            monkeypatch.setattr(torch.cuda, name, fake)
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record)
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *_: self.snapshot)


def test_recorder_sequence_in_run_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from profkit.run.child import run_config

    fake = _FakeAllocator(monkeypatch, transformer_step().snapshot())
    config = WorkloadConfig(size="tiny", ctx=16, warmup=2, steps=1, device="cpu")
    path = tmp_path / "s.pickle"
    result = run_config(
        config, "memory", {"snapshot": str(path), "max_entries": 77, "stacks": "python"}
    )
    assert result["status"] == "ok", result.get("traceback")
    # On before the model is built; cleared when the timed steps begin; off after the dump.
    assert fake.calls == [
        ("all", "python", 77, False),
        ("all", "python", 77, True),
        (None, "all", 0, False),
    ]
    memory = result["memory"]
    assert memory["model_bytes"] == 2000  # the first probe: right after the model was built
    assert (
        memory["after_forward_bytes"]
        < memory["after_backward_bytes"]
        < memory["after_optimizer_bytes"]
    )
    # Marks for every phase of every step (warm-up too), in order.
    assert [m["phase"] for m in memory["phase_marks"]] == ["forward", "backward", "optimizer"] * 3
    assert memory["max_memory_allocated_bytes"] == 123_456
    assert memory["peak_requested_bytes"] == 120_000
    assert load_snapshot(path)["device_traces"] == fake.snapshot["device_traces"]
    assert path.read_bytes()[:2] == b"\x80\x04"


def test_recorder_dumps_the_snapshot_after_an_oom(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch

    from profkit.run.child import run_config
    from profkit.workload.step import Workload

    fake = _FakeAllocator(monkeypatch, transformer_step().snapshot())

    def out_of_memory(self: Any) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

    monkeypatch.setattr(Workload, "_optimizer_step", out_of_memory)
    path = tmp_path / "oom.pickle"
    config = WorkloadConfig(size="tiny", ctx=16, warmup=1, steps=1, device="cpu")
    result = run_config(config, "memory", {"snapshot": str(path)})
    assert result["status"] == "oom"
    assert path.exists()  # the snapshot users need most
    assert fake.calls[-1][0] is None  # and recording was switched off
    assert result["memory"]["phase_marks"][-1]["phase"] == "backward"  # died in the optimizer


def test_plotted_stack_at_the_peak_is_the_whole_peak() -> None:
    """The stacked bands of `memory plot` at the peak add up to the requested peak
    (the label shows the allocated peak, rounded up to allocator blocks)."""
    from profkit.memory.plot import _drawn_total
    from profkit.memory.snapshot import load_snapshot
    from profkit.memory.timeline import reconstruct

    timeline = reconstruct(load_snapshot(DATA / "memory-tiny-ctx64-train-fp32.pickle.xz"))
    peak = timeline.peak_state
    drawn = timeline.largest(2000)
    assert _drawn_total(drawn, timeline.events)[peak] == timeline.requested_bytes[peak]
    assert timeline.requested_bytes[peak] == 118_936_328
    assert timeline.allocated_bytes[peak] == 119_432_704  # = max_memory_allocated at capture
