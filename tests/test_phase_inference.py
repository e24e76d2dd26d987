"""Phases without annotations: every annotated fixture, its phase ranges stripped here.

Each real trace is attributed twice: as captured (phases from its ``forward``/``backward``/
``optimizer`` ranges) and with exactly those phase ranges removed (phases inferred from
autograd's threads, the optimizer's kernels and ``Optimizer.step`` ranges). Per phase the
kernel count and kernel time must agree within 1%; where a fixture cannot, the test says
by how much and why (docs/ATTRIBUTION.md, "Phases without annotations").
"""

from __future__ import annotations

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

from profkit.analysis import analyze
from profkit.analysis.attribution import Attribution, TraceHints, attribute, inference_note
from profkit.errors import BadInput
from profkit.traces import Trace, load_trace

SMALL_COMPILED = "nsys-2025.3-h100-small-compiled"
USER_TRAIN = "nsys-2025.3-h100-user_train"
EXAMPLE = Path(__file__).resolve().parents[1] / "profiles" / "examples"
TRAINING = [SMALL_FP32, SMALL_BF16, SMALL_COMPILED, TINY_COMPILE, USER_TRAIN]


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nsys")


def load(name: str, into: Path) -> Trace:
    if name.endswith(".json.gz"):
        return load_trace(DATA / name)
    if name == "example":
        return load_trace(EXAMPLE / "small-ctx128-train-fp32.sqlite")
    return load_trace(unpack(name, into))


def both(trace: Trace) -> tuple[Attribution, Attribution]:
    """The attribution as captured, and with its phase ranges stripped."""
    hints = TraceHints.of(trace.meta)
    annotated = attribute(trace.kernels, trace.ranges, hints=hints)
    stripped = trace.ranges[~annotated.is_phase_range].reset_index(drop=True)
    return annotated, attribute(trace.kernels, stripped, hints=hints)


def kernel_totals(att: Attribution, trace: Trace) -> dict[str, tuple[int, int]]:
    """{phase: (kernels, kernel ns)}: kernel launches only, as the issue's check asks."""
    kernel = (trace.kernels["kind"] == "kernel").to_numpy()
    duration = (trace.kernels["end"] - trace.kernels["start"]).to_numpy()
    out = {}
    for index, name in enumerate(att.phase_names):
        rows = (att.kernel_phase == index) & kernel
        if rows.any():
            out[name] = (int(rows.sum()), int(duration[rows].sum()))
    return out


def within_one_percent(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return all(abs(x - y) <= 0.01 * max(x, 1) for x, y in zip(a, b, strict=True))


# --- every annotated training fixture ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (SMALL_FP32, {"forward": (1436, 10_236_994), "backward": (2310, 19_437_095),
                      "optimizer": (112, 7_667_537)}),
        (SMALL_BF16, {"forward": (1754, 4_940_458), "backward": (2460, 8_127_008),
                      "optimizer": (112, 7_677_585)}),
        (SMALL_COMPILED, {"forward": (580, 8_321_447), "backward": (964, 16_006_084),
                          "optimizer": (112, 7_680_735)}),
        (TINY_COMPILE, {"forward": (84, 307_907), "backward": (180, 708_132),
                        "optimizer": (16, 288_163)}),
        # The whole program was captured: the one kernel before the first step (the
        # tokens' randint) is outside every range when annotated, forward when inferred.
        (USER_TRAIN, {"forward": (211, 1_555_889), "backward": (540, 3_309_562),
                      "optimizer": (94, 750_122)}),
        ("torch-small-ctx128-train.json.gz", {"forward": (718, 5_112_890),
                                              "backward": (1155, 9_731_279),
                                              "optimizer": (56, 3_833_170)}),
        ("example", {"forward": (1436, 10_209_431), "backward": (2310, 19_391_532),
                     "optimizer": (112, 7_676_641)}),
    ],
)  # fmt: skip
def test_inferred_phases_match_the_annotated_ones(
    unpacked: Path, name: str, expected: dict[str, tuple[int, int]]
) -> None:
    trace = load(name, unpacked)
    annotated, inferred = both(trace)
    assert (annotated.phase_source, inferred.phase_source) == ("annotated", "inferred")
    truth, found = kernel_totals(annotated, trace), kernel_totals(inferred, trace)
    assert found == expected
    for phase in ("forward", "backward", "optimizer"):
        assert within_one_percent(found[phase], truth[phase]), phase
    # No range is promoted to a phase once the phase ranges are gone.
    assert not inferred.is_phase_range.any()


def test_every_activity_lands_where_the_annotation_put_it(unpacked: Path) -> None:
    """Copies and memsets too: the small fp32 export agrees activity by activity."""
    trace = load(SMALL_FP32, unpacked)
    annotated, inferred = both(trace)
    names = np.array(annotated.phase_names)[annotated.kernel_phase]
    assert (np.array(inferred.phase_names)[inferred.kernel_phase] == names).all()
    assert len(names) == 4028


def test_forward_only_trace(unpacked: Path) -> None:
    trace = load("torch-small-ctx128-forward.json.gz", unpacked)
    annotated, inferred = both(trace)
    assert kernel_totals(inferred, trace) == kernel_totals(annotated, trace)
    assert kernel_totals(inferred, trace) == {"forward": (718, 5_112_705)}


@pytest.mark.parametrize(
    ("name", "annotated_totals", "inferred_totals"),
    [
        (GRAPH_NODES, {"forward": (12, 246_434), "eager": (6, 223_362)}, {"forward": (18, 469_796)}),
        (GRAPH_WHOLE, {"forward": (3, 7_136), "eager": (6, 222_496)}, {"forward": (9, 229_632)}),
    ],
)  # fmt: skip
def test_cuda_graph_program_the_gap(
    unpacked: Path,
    name: str,
    annotated_totals: dict[str, tuple[int, int]],
    inferred_totals: dict[str, tuple[int, int]],
) -> None:
    """Measured gap: no autograd, no optimizer, so inference calls all of it forward.

    The graph replays are forward both ways (each replay is one launch, so its kernels
    share a phase); ``eager`` is the program's own phase name, which nothing in a trace
    can infer: its 6 kernels join forward (+50% kernels on node-traced graphs).
    """
    trace = load(name, unpacked)
    annotated, inferred = both(trace)
    assert kernel_totals(annotated, trace) == annotated_totals
    assert kernel_totals(inferred, trace) == inferred_totals


def test_probe_the_gap() -> None:
    """Measured gap: the probe times ``.sum().backward()`` inside its ``backward`` range.

    The ``.sum()`` (and its memsets) run on the main thread before autograd starts: work
    of the forward pass by inference, of ``backward`` by the range: 5 of 11 kernels move
    (0.18 of 8.5 ms); the randn before the first range becomes forward too.
    """
    trace = load_trace(PROBE)
    annotated, inferred = both(trace)
    assert kernel_totals(annotated, trace) == {
        "forward": (6, 8_279_101),
        "backward": (17, 8_542_336),
        "unattributed": (2, 81_890),
    }
    assert kernel_totals(inferred, trace) == {
        "forward": (11, 8_461_376),
        "backward": (14, 8_441_951),
    }


# --- annotated phases win per step; sub-ranges never become phases ------------------------


def test_a_step_without_phase_ranges_is_inferred_the_others_kept(unpacked: Path) -> None:
    trace = load(SMALL_FP32, unpacked)
    annotated, _ = both(trace)
    second = (
        trace.ranges["start"] >= trace.ranges.loc[trace.ranges["name"] == "forward", "start"].max()
    )
    kept = trace.ranges[~(annotated.is_phase_range & second.to_numpy())].reset_index(drop=True)
    mixed = attribute(trace.kernels, kept, hints=TraceHints.of(trace.meta))
    assert mixed.phase_source == "mixed"
    assert int(mixed.inferred.sum()) == 2014  # the second step's activities
    assert (
        np.array(mixed.phase_names)[mixed.kernel_phase]
        == np.array(annotated.phase_names)[annotated.kernel_phase]
    ).all()
    # The second step's attention ranges are outermost there now; still not phases.
    assert kept["name"][mixed.is_phase_range].tolist() == ["forward", "backward", "optimizer"]


def test_subranges_stay_ranges_in_the_report(unpacked: Path) -> None:
    trace = load(SMALL_FP32, unpacked)
    annotated, _ = both(trace)
    as_captured = analyze(trace)
    trace.ranges = trace.ranges[~annotated.is_phase_range].reset_index(drop=True)
    report = analyze(trace)
    assert report.source["phase_source"] == "inferred"
    assert as_captured.source["phase_source"] == "annotated"
    # The same phase table as the annotated capture's, but for the ranges' wall times.
    same = ["phase", "instances", "kernels", "gpu_time_ms", "share"]
    pd.testing.assert_frame_equal(report.phases[same], as_captured.phases[same])
    phases = report.phases.set_index("phase")
    assert phases["gpu_time_ms"].to_dict() == pytest.approx(
        {"forward": 10.281538, "backward": 19.631656, "optimizer": 7.667537}
    )
    assert phases["instances"].to_dict() == {"forward": 2, "backward": 2, "optimizer": 2}
    ranges = report.ranges.set_index("range")
    assert ranges.at["computing softmax", "kernels"] == 24  # a range, as before
    assert "computing softmax" not in set(report.phases["phase"])
    assert report.notes[0].startswith("Phases inferred (every step has no forward/backward")
    assert "pt_autograd_0" in report.notes[0]


def test_forcing_one_source(unpacked: Path) -> None:
    trace = load(SMALL_FP32, unpacked)
    inferred = analyze(trace, phases="inferred")
    assert inferred.source["phase_source"] == "inferred"
    assert inferred.phases.set_index("phase")["gpu_time_ms"].to_dict() == pytest.approx(
        {"forward": 10.281538, "backward": 19.631656, "optimizer": 7.667537}
    )
    annotated, _ = both(trace)
    trace.ranges = trace.ranges[~annotated.is_phase_range].reset_index(drop=True)
    forced = analyze(trace, phases="annotated")
    assert forced.source["phase_source"] == "annotated"
    assert list(forced.phases["phase"]) == ["unattributed"]
    assert forced.phases.at[0, "gpu_time_ms"] == pytest.approx(37.580731)
    with pytest.raises(BadInput, match="--phases must be one of auto, annotated, inferred"):
        analyze(trace, phases="guess")  # type: ignore[arg-type]


def test_chrome_autograd_ops_find_the_worker_without_thread_names() -> None:
    trace = load_trace(DATA / "torch-small-ctx128-train.json.gz")
    assert trace.meta["autograd_threads"] == [510]
    annotated, _ = both(trace)
    stripped = trace.ranges[~annotated.is_phase_range].reset_index(drop=True)
    by_ops = TraceHints(autograd_threads=frozenset({510}))
    att = attribute(trace.kernels, stripped, hints=by_ops)
    assert kernel_totals(att, trace) == kernel_totals(annotated, trace)
    # Neither names nor ops: no backward can be found, and the note says so.
    blind = attribute(trace.kernels, stripped, hints=TraceHints())
    assert "backward" not in kernel_totals(blind, trace)
    note = inference_note(blind, np.arange(len(trace.kernels)), {})
    assert "no autograd thread (pt_autograd_N) is named in this trace" in note[0]


# --- synthetic: accumulation, several processes -------------------------------------------

ADAM = "void multi_tensor_apply_kernel<FusedAdamMathFunctor<float>>(T1)"
SEED = "void vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096>)"


def test_gradient_accumulation_and_two_processes(tmp_path: Path) -> None:
    """Two micro-batches per optimizer step, in two processes (ranks) at once, with
    collectives from autograd's hooks (backward) and from the main thread (forward)."""
    rank1_main = (1 << 48) | (200 << 24) | 200
    rank1_worker = (1 << 48) | (200 << 24) | 201
    names = {MAIN: "python3", WORKER: "pt_autograd_0", rank1_main: "python3",
             rank1_worker: "pt_autograd_0"}  # fmt: skip
    e = Export(tmp_path / "accumulate.sqlite")
    for main, worker, pid in ((MAIN, WORKER, 100), (rank1_main, rank1_worker, 200)):
        at = 0
        for micro in range(4):  # micro-batches 0,1 then optimizer; 2,3 then optimizer
            e.kernel("fwd_gemm", at + 50_000, 10, launch_at=at, thread=main, pid=pid)
            e.kernel(SEED, at + 50_100, 1, launch_at=at + 100, thread=main, pid=pid)
            e.kernel("bwd_gemm", at + 50_200, 20, launch_at=at + 200, thread=worker, pid=pid)
            e.kernel("bwd_gemm", at + 50_300, 20, launch_at=at + 300, thread=worker, pid=pid)
            # DDP: a gradient bucket's all-reduce, launched by autograd's hook; FSDP-like
            # all-gather of the next forward's weights, launched by the main thread.
            e.kernel(ALL_REDUCE, at + 50_350, 30, launch_at=at + 310, thread=worker, pid=pid)
            e.kernel(ALL_GATHER, at + 50_900, 30, launch_at=at + 900, thread=main, pid=pid)
            if micro % 2:
                e.kernel(ADAM, at + 50_400, 5, launch_at=at + 400, thread=main, pid=pid)
            at += 1000
    trace = load_trace(e.save())
    trace.meta["thread_names"] = names
    att = attribute(trace.kernels, trace.ranges, hints=TraceHints.of(trace.meta))
    phase = np.array(att.phase_names)[att.kernel_phase]
    got = pd.Series(phase).groupby(trace.kernels["name"].to_numpy()).agg(set).to_dict()
    assert got == {"fwd_gemm": {"forward"}, SEED: {"backward"}, "bwd_gemm": {"backward"},
                   ADAM: {"optimizer"}, ALL_REDUCE: {"backward"},
                   ALL_GATHER: {"forward"}}  # fmt: skip
    assert att.phase_source == "inferred"
    instances, _ = att.phase_spans(trace.ranges)
    assert instances.to_dict() == {"forward": 8, "backward": 8, "optimizer": 4}
    # Per rank: each process's slice alone gives the same phases (the per-rank reading).
    for pid in (100, 200):
        rows = (trace.kernels["launch_thread"].to_numpy() >> 24) & 0xFFFFFF == pid
        alone = attribute(trace.kernels[rows].reset_index(drop=True), trace.ranges,
                          hints=TraceHints.of(trace.meta))  # fmt: skip
        assert (np.array(alone.phase_names)[alone.kernel_phase] == phase[rows]).all()
    # Two steps per process: the first ends after its optimizer kernel.
    steps = att.inference.step_of(np.array([MAIN, MAIN, rank1_main]), np.array([0, 1500, 0]))
    assert len(set(steps.tolist())) == 3
