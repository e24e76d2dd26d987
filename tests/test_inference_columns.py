"""Phase inference on compact columns, chunk by chunk.

``inference.infer_columns`` reads an :class:`ActivityColumns`' launch arrays a chunk at a
time. Whatever the chunk size, it must give the per-activity phase, steps, main and
autograd threads, instance spans and (step, phase) counts of one chunk holding them all,
bit for bit: on every committed fixture (as captured and with its phase ranges stripped,
where its phase counts, steps and threads are pinned too), and on synthetic corners
(accumulation, several processes, ``ProfilerStep`` and ``Optimizer.step`` ranges, main
launches sharing a key).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from nsys_data import (
    DATA,
    GRAPH_NODES,
    GRAPH_WHOLE,
    MAIN,
    PROBE,
    SMALL_BF16,
    SMALL_FP32,
    TINY_COMPILE,
    WORKER,
    Export,
    unpack,
)

from profkit.analysis import attribution, chunked
from profkit.analysis.inference import (
    BACKWARD,
    FORWARD,
    InferredPhases,
    LaunchColumns,
    TraceHints,
    infer_columns,
)
from profkit.traces.columns import ActivityColumns
from profkit.traces.load import load_columns

NSYS = [
    SMALL_FP32,
    SMALL_BF16,
    "nsys-2025.3-h100-small-compiled",
    TINY_COMPILE,
    "nsys-2025.3-h100-user_train",
    GRAPH_NODES,
    GRAPH_WHOLE,
    "nsys-2025.3-h200-unannotated-train",
    "nsys-2025.3-h200x2-small-ddp2",
]
TORCH = sorted(p.name for p in DATA.glob("torch-*.json.gz"))
CHUNKS = (1000, 7)
ADAM = "void multi_tensor_apply_kernel<FusedAdamMathFunctor<float>>(T1)"
SEED = "void vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nsys")


def assert_same(found: InferredPhases, expected: InferredPhases) -> None:
    """Equal, dtypes included (the phase is int8: no per-activity int64)."""
    assert found.phase.dtype == expected.phase.dtype == np.int8
    np.testing.assert_array_equal(found.phase, expected.phase)
    assert found.main_threads == expected.main_threads
    for name in ("autograd_threads", "step_starts", "step_phases"):
        got, want = getattr(found, name), getattr(expected, name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    lanes, want_lanes = found.step_lanes, expected.step_lanes
    np.testing.assert_array_equal(lanes.lanes, want_lanes.lanes)
    assert (lanes.base, lanes.span) == (want_lanes.base, want_lanes.span)
    for name in ("instance", "step", "phase", "first", "last"):
        got, want = getattr(found.spans, name), getattr(expected.spans, name)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=f"spans.{name}")


def one_chunk(columns: LaunchColumns, ranges: pd.DataFrame, hints: TraceHints) -> InferredPhases:
    """The inference of every activity in one chunk."""
    return infer_columns(columns, ranges, hints, chunk=len(columns.launch_start) + 1)


Summary = tuple[tuple[int, int, int, int], int, int, int]


def summary(found: InferredPhases) -> Summary:
    """(activities with no phase, forward, backward, optimizer), step starts (the lane's
    end included), main threads, autograd threads."""
    counts = np.bincount(found.phase.astype(np.int64) + 1, minlength=4)
    return (
        tuple(int(c) for c in counts),  # type: ignore[return-value]
        len(found.step_starts),
        len(found.main_threads),
        len(found.autograd_threads),
    )


def check(
    cols: ActivityColumns, expected: Summary | None, chunks: tuple[int, ...] = CHUNKS
) -> None:
    """Each chunk size (and the engine's own) against one chunk, as captured and with the
    phase ranges stripped (as tests/test_phase_inference.py strips them)."""
    hints = TraceHints.of(cols.meta)
    is_phase = attribution.plan_of(cols).is_phase
    for ranges in (cols.ranges, cols.ranges[~is_phase].reset_index(drop=True)):
        whole = one_chunk(LaunchColumns.of_columns(cols), ranges, hints)
        if expected is not None:
            assert summary(whole) == expected
        for chunk in (chunked.CHUNK, *chunks):
            found = infer_columns(LaunchColumns.of_columns(cols), ranges, hints, chunk=chunk)
            assert_same(found, whole)


# Per fixture: summary() of its inference, the same as captured and stripped.
PINNED: dict[str, Summary] = {
    SMALL_FP32: ((0, 1460, 2456, 112), 3, 1, 1),
    SMALL_BF16: ((0, 1778, 2534, 112), 3, 1, 1),
    "nsys-2025.3-h100-small-compiled": ((0, 580, 1036, 112), 3, 1, 1),
    TINY_COMPILE: ((0, 84, 180, 16), 3, 1, 1),
    "nsys-2025.3-h100-user_train": ((0, 243, 615, 94), 6, 1, 1),
    GRAPH_NODES: ((0, 33, 0, 0), 2, 1, 0),
    GRAPH_WHOLE: ((0, 24, 0, 0), 2, 1, 0),
    "nsys-2025.3-h200-unannotated-train": ((0, 132, 369, 54), 4, 1, 4),
    "nsys-2025.3-h200x2-small-ddp2": ((0, 4536, 8808, 336), 7, 2, 4),
    "torch-h200-unannotated-train.json.gz": ((0, 88, 246, 36), 4, 1, 1),
    "torch-h200x2-small-ddp2-rank0.json.gz": ((0, 756, 1468, 56), 2, 1, 1),
    "torch-h200x2-small-ddp2-rank1.json.gz": ((0, 756, 1468, 56), 2, 1, 1),
    "torch-small-ctx128-forward.json.gz": ((0, 730, 0, 0), 2, 1, 0),
    "torch-small-ctx128-train.json.gz": ((0, 730, 1228, 56), 2, 1, 1),
    "probe": ((0, 14, 17, 0), 2, 1, 1),
}


@pytest.mark.parametrize("name", NSYS)
def test_nsys_fixtures(unpacked: Path, name: str) -> None:
    check(load_columns(unpack(name, unpacked), cache=False), PINNED[name])


@pytest.mark.parametrize("name", [*TORCH, "probe"])
def test_other_fixtures(name: str) -> None:
    path = PROBE if name == "probe" else DATA / name
    check(load_columns(path, cache=False), PINNED[name])


def test_the_engine_reads_columns_in_chunks_of_chunk(
    unpacked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``attribution.inferred_phases`` reads ``chunked.CHUNK`` activities at a
    time: a small one (14 chunks of the 2-rank export) changes nothing."""
    path = unpack("nsys-2025.3-h200x2-small-ddp2", unpacked)
    whole = attribution.inferred_phases(load_columns(path, cache=False))
    monkeypatch.setattr(chunked, "CHUNK", 1000)
    cols = load_columns(path, cache=False)
    assert len(cols) > 10 * chunked.CHUNK
    in_chunks = attribution.inferred_phases(cols)
    assert_same(in_chunks, whole)


# --- synthetic corners ----------------------------------------------------------------------


def test_accumulation_in_two_processes(tmp_path: Path) -> None:
    """Two micro-batches per optimizer step in two processes (tests/test_phase_inference.py)."""
    rank1_main = (1 << 48) | (200 << 24) | 200
    rank1_worker = (1 << 48) | (200 << 24) | 201
    e = Export(tmp_path / "accumulate.sqlite")
    for main, worker, pid in ((MAIN, WORKER, 100), (rank1_main, rank1_worker, 200)):
        at = 0
        for micro in range(4):
            e.kernel("fwd_gemm", at + 50_000, 10, launch_at=at, thread=main, pid=pid)
            e.kernel(SEED, at + 50_100, 1, launch_at=at + 100, thread=main, pid=pid)
            e.kernel("bwd_gemm", at + 50_200, 20, launch_at=at + 200, thread=worker, pid=pid)
            e.kernel("bwd_gemm", at + 50_300, 20, launch_at=at + 300, thread=worker, pid=pid)
            if micro % 2:
                e.kernel(ADAM, at + 50_400, 5, launch_at=at + 400, thread=main, pid=pid)
            at += 1000
    cols = load_columns(e.save(), cache=False)
    cols.meta["thread_names"] = {MAIN: "python3", WORKER: "pt_autograd_0",
                                 rank1_main: "python3", rank1_worker: "pt_autograd_0"}  # fmt: skip
    check(cols, ((0, 8, 24, 4), 5, 2, 2), chunks=(1, 3, 5))  # the seeds: backward


def in_memory(
    launches: list[tuple[int, int, str]], ranges: list[tuple[int, int, int, str]]
) -> tuple[LaunchColumns, pd.DataFrame]:
    """Activities (launch time or -1, thread, name) in this order, and ranges (thread, start,
    end, name), as columns."""
    time = np.array([t for t, _, _ in launches], dtype=np.int64)
    thread = np.array([th for _, th, _ in launches], dtype=np.int64)
    names = list(dict.fromkeys(n for _, _, n in launches))
    name = np.array([names.index(n) for _, _, n in launches], dtype=np.int64)
    rows = np.flatnonzero(time >= 0)
    threads, codes = np.unique(thread[rows], return_inverse=True)
    code = np.full(len(time), -1, dtype=np.int16)
    code[rows] = codes
    bounds = (int(time[rows].min()), int(time[rows].max())) if len(rows) else None
    frame = pd.DataFrame(ranges or None, columns=["thread", "start", "end", "name"])
    frame = frame.astype({"thread": np.int64, "start": np.int64, "end": np.int64})
    return LaunchColumns(time, code, name.astype(np.int32), threads, names, bounds), frame


def both_ways(
    launches: list[tuple[int, int, str]],
    ranges: Sequence[tuple[int, int, int, str]] = (),
    hints: TraceHints | None = None,
) -> InferredPhases:
    """The inference in one chunk, checked equal to it in chunks of 1, 2 and 1000."""
    hints = hints or TraceHints(thread_names={WORKER: "pt_autograd_0"})
    columns, frame = in_memory(launches, list(ranges))
    expected = one_chunk(columns, frame, hints)
    for chunk in (1, 2, 1000):
        assert_same(infer_columns(columns, frame, hints, chunk=chunk), expected)
    return expected


def test_profiler_steps_and_optimizer_step_ranges() -> None:
    """torch.profiler's ranges: steps start at each ProfilerStep#N; what the main thread
    launches inside Optimizer.step#... is optimizer work, whatever its kernels."""
    other = MAIN + 5
    launches = []
    ranges = []
    for step in range(3):
        at = step * 1000
        ranges.append((MAIN, at, at + 999, f"ProfilerStep#{step}"))
        launches += [(at + 10, MAIN, "fwd"), (at + 20, other, "prefetch"), (at + 30, MAIN, SEED)]
        launches += [(at + 40, WORKER, "bwd"), (at + 50, WORKER, "bwd"), (-1, -1, "[CUDA memset]")]
        launches += [(at + 60, MAIN, "step_mul"), (at + 70, MAIN, "step_add")]
        ranges.append((MAIN, at + 55, at + 75, "Optimizer.step#AdamW.step"))
    found = both_ways(launches, ranges)
    assert found.phase.tolist()[:8] == [FORWARD, FORWARD, BACKWARD, BACKWARD, BACKWARD, -1, 2, 2]
    # Steps at each ProfilerStep#N and just after each optimizer between two passes; the
    # last key is the lane's end.
    assert found.step_starts.tolist()[:-1] == [0, 71, 1000, 1071, 2000]


def test_main_launches_sharing_the_seeds_key() -> None:
    """Two main-thread launches at the same time just before a pass: the seed is the last
    of them in activity order (the one a stable sort by key puts last before the pass),
    and only if it is a fill; chunks of one activity split the tie."""
    before = [(0, MAIN, "fwd")]
    after = [(20, WORKER, "bwd"), (30, WORKER, "bwd"), (40, MAIN, ADAM)]
    fill_last = both_ways([*before, (10, MAIN, "fwd"), (10, MAIN, SEED), *after])
    assert fill_last.phase.tolist()[1:3] == [FORWARD, BACKWARD]
    fill_first = both_ways([*before, (10, MAIN, SEED), (10, MAIN, "fwd"), *after])
    assert fill_first.phase.tolist()[1:3] == [FORWARD, FORWARD]
    # The same with the tie's launches apart in the activity order.
    spread = both_ways([(10, MAIN, SEED), *before, *after, (10, MAIN, "fwd")])
    assert spread.phase.tolist()[0] == FORWARD


def test_only_autograd_launches() -> None:
    """No main-thread launch at all: every launch backward, no seed to look for (the
    vectorised code this replaced failed there)."""
    found = both_ways([(10, WORKER, "bwd"), (-1, -1, "x"), (20, WORKER, SEED)])
    assert found.phase.tolist() == [BACKWARD, -1, BACKWARD]
    assert found.main_threads == {}


def test_nothing_launched() -> None:
    found = both_ways([(-1, -1, "x"), (-1, -1, "y")])
    assert found.phase.tolist() == [-1, -1]
    assert found.step_phases.shape == (0, 3)


@pytest.mark.parametrize("seed", range(2))
def test_random_traces_any_chunk(seed: int) -> None:
    """Random steps of several processes, coarse clocks (ties everywhere), unlaunched and
    thread-less activities, shuffled: the columns in chunks agree with one chunk."""
    rng = np.random.default_rng(seed)
    for _ in range(25):
        launches: list[tuple[int, int, str]] = []
        ranges: list[tuple[int, int, int, str]] = []
        names: dict[int, str] = {}
        grid = int(rng.choice([1, 5, 50]))
        for pid in range(100, 100 + int(rng.integers(1, 4))):
            main = (1 << 48) | (pid << 24) | 1
            workers = [main + 1 + i for i in range(int(rng.integers(0, 3)))]
            names |= {main: "python3"} | {w: f"pt_autograd_{i}" for i, w in enumerate(workers)}
            at = int(rng.integers(0, 1000))
            for step in range(int(rng.integers(1, 5))):
                if rng.random() < 0.3:
                    ranges.append((main, at, at + 10_000, f"ProfilerStep#{step}"))
                for _ in range(int(rng.integers(1, 3))):
                    for thread, name in (
                        *((main, str(rng.choice(["fwd", SEED, "copy"]))) for _ in range(4)),
                        *((int(rng.choice(workers or [main])), "bwd") for _ in range(6)),
                        (main, SEED),
                        (main + 9, "side"),
                    ):
                        if rng.random() < 0.7:
                            launches.append((at // grid * grid, thread, name))
                            at += int(rng.integers(0, 30))
                start = at
                for _ in range(int(rng.integers(0, 4))):
                    launches.append((at // grid * grid, main, str(rng.choice([ADAM, "copy"]))))
                    at += int(rng.integers(0, 30))
                if rng.random() < 0.4:
                    ranges.append((main, start, at + 1, "Optimizer.step#AdamW.step"))
        launches += [(-1, -1, "copy")] * int(rng.integers(0, 3))
        if rng.random() < 0.3:
            launches.append((int(rng.integers(0, 500)), -1, "orphan"))
        order = rng.permutation(len(launches))
        hints = TraceHints(thread_names={t: n for t, n in names.items() if rng.random() < 0.9})
        both_ways([launches[i] for i in order], ranges, hints)
