"""Phases without annotations: every annotated fixture, its phase ranges stripped here.

Each real trace is attributed twice: as captured (phases from its ``forward``/``backward``/
``optimizer`` ranges) and with exactly those phase ranges removed (phases inferred from
autograd's threads, the optimizer's kernels and ``Optimizer.step`` ranges). Per phase the
kernel count and kernel time must agree within 1%; where a fixture cannot, the test says
by how much and why (docs/ATTRIBUTION.md, "Phases without annotations").
"""

from __future__ import annotations

from dataclasses import dataclass
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
from synthetic import report, report_of_columns

from profkit.analysis.attribution import Plan, attributed, plan_of
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns
from profkit.traces.load import load_columns

SMALL_COMPILED = "nsys-2025.3-h100-small-compiled"
USER_TRAIN = "nsys-2025.3-h100-user_train"
EXAMPLE = Path(__file__).resolve().parents[1] / "profiles" / "examples"
TRAINING = [SMALL_FP32, SMALL_BF16, SMALL_COMPILED, TINY_COMPILE, USER_TRAIN]


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nsys")


def path_of(name: str, into: Path) -> Path:
    if name.endswith(".json.gz"):
        return DATA / name
    if name == "example":
        return EXAMPLE / "small-ctx128-train-fp32.sqlite"
    return unpack(name, into)


def load(path: Path) -> ActivityColumns:
    """The trace's columns, read afresh (nothing derived kept from another reading)."""
    return load_columns(path, cache=False)


@dataclass
class Attributed:
    """One attribution of a trace's columns: its plan and per-activity arrays."""

    plan: Plan
    arrays: dict[str, np.ndarray]

    @property
    def phases(self) -> np.ndarray:
        """Each activity's phase name."""
        return np.array(self.plan.phase_names)[self.arrays["phase"]]


def attribution_of(columns: ActivityColumns, phases: str = "auto") -> Attributed:
    plan = plan_of(columns, phases=phases)  # type: ignore[arg-type]
    return Attributed(plan, dict(attributed(columns, plan)))


def without(path: Path, drop: np.ndarray) -> ActivityColumns:
    """The trace's columns with the ranges at ``drop`` removed."""
    columns = load(path)
    columns.ranges = columns.ranges[~drop].reset_index(drop=True)
    return columns


def both(path: Path) -> tuple[ActivityColumns, Attributed, ActivityColumns, Attributed]:
    """The columns and attribution as captured, and with its phase ranges stripped."""
    columns = load(path)
    annotated = attribution_of(columns)
    stripped = without(path, annotated.plan.is_phase)
    return columns, annotated, stripped, attribution_of(stripped)


def kernel_totals(att: Attributed, columns: ActivityColumns) -> dict[str, tuple[int, int]]:
    """{phase: (kernels, kernel ns)}: kernel launches only, as the issue's check asks."""
    kernel = np.array(columns.kinds)[columns.arrays["name"]] == "kernel"
    duration = columns.arrays["duration"]
    out = {}
    for index, name in enumerate(att.plan.phase_names):
        rows = (att.arrays["phase"] == index) & kernel
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
    columns, annotated, stripped, inferred = both(path_of(name, unpacked))
    assert (annotated.plan.phase_source, inferred.plan.phase_source) == ("annotated", "inferred")
    truth, found = kernel_totals(annotated, columns), kernel_totals(inferred, stripped)
    assert found == expected
    for phase in ("forward", "backward", "optimizer"):
        assert within_one_percent(found[phase], truth[phase]), phase
    # No range is promoted to a phase once the phase ranges are gone.
    assert not inferred.plan.is_phase.any()


def test_every_activity_lands_where_the_annotation_put_it(unpacked: Path) -> None:
    """Copies and memsets too: the small fp32 export agrees activity by activity."""
    _, annotated, _, inferred = both(path_of(SMALL_FP32, unpacked))
    assert (inferred.phases == annotated.phases).all()
    assert len(annotated.phases) == 4028


def test_forward_only_trace(unpacked: Path) -> None:
    columns, annotated, stripped, inferred = both(
        path_of("torch-small-ctx128-forward.json.gz", unpacked)
    )
    assert kernel_totals(inferred, stripped) == kernel_totals(annotated, columns)
    assert kernel_totals(inferred, stripped) == {"forward": (718, 5_112_705)}


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
    columns, annotated, stripped, inferred = both(path_of(name, unpacked))
    assert kernel_totals(annotated, columns) == annotated_totals
    assert kernel_totals(inferred, stripped) == inferred_totals


def test_probe_the_gap() -> None:
    """Measured gap: the probe times ``.sum().backward()`` inside its ``backward`` range.

    The ``.sum()`` (and its memsets) run on the main thread before autograd starts: work
    of the forward pass by inference, of ``backward`` by the range: 5 of 11 kernels move
    (0.18 of 8.5 ms); the randn before the first range becomes forward too.
    """
    columns, annotated, stripped, inferred = both(PROBE)
    assert kernel_totals(annotated, columns) == {
        "forward": (6, 8_279_101),
        "backward": (17, 8_542_336),
        "unattributed": (2, 81_890),
    }
    assert kernel_totals(inferred, stripped) == {
        "forward": (11, 8_461_376),
        "backward": (14, 8_441_951),
    }


# --- annotated phases win per step; sub-ranges never become phases ------------------------


def test_a_step_without_phase_ranges_is_inferred_the_others_kept(unpacked: Path) -> None:
    path = path_of(SMALL_FP32, unpacked)
    columns, annotated, _, _ = both(path)
    ranges = columns.ranges
    second = ranges["start"] >= ranges.loc[ranges["name"] == "forward", "start"].max()
    kept = without(path, annotated.plan.is_phase & second.to_numpy())
    mixed = attribution_of(kept)
    assert mixed.plan.phase_source == "mixed"
    assert int(mixed.arrays["inferred"].sum()) == 2014  # the second step's activities
    assert (mixed.phases == annotated.phases).all()
    # The second step's attention ranges are outermost there now; still not phases.
    phase_ranges = kept.ranges["name"][mixed.plan.is_phase].tolist()
    assert phase_ranges == ["forward", "backward", "optimizer"]


def test_subranges_stay_ranges_in_the_report(unpacked: Path) -> None:
    path = path_of(SMALL_FP32, unpacked)
    _, _, stripped, _ = both(path)
    as_captured = report(path)
    inferred = report_of_columns([stripped])
    assert inferred.source["phase_source"] == "inferred"
    assert as_captured.source["phase_source"] == "annotated"
    # The same phase table as the annotated capture's, but for the ranges' wall times.
    same = ["phase", "instances", "kernels", "gpu_time_ms", "share"]
    pd.testing.assert_frame_equal(inferred.phases[same], as_captured.phases[same])
    phases = inferred.phases.set_index("phase")
    assert phases["gpu_time_ms"].to_dict() == pytest.approx(
        {"forward": 10.281538, "backward": 19.631656, "optimizer": 7.667537}
    )
    assert phases["instances"].to_dict() == {"forward": 2, "backward": 2, "optimizer": 2}
    ranges = inferred.ranges.set_index("range")
    assert ranges.at["computing softmax", "kernels"] == 24  # a range, as before
    assert "computing softmax" not in set(inferred.phases["phase"])
    assert inferred.notes[0].startswith("Phases inferred (every step has no forward/backward")
    assert "pt_autograd_0" in inferred.notes[0]


def test_forcing_one_source(unpacked: Path) -> None:
    path = path_of(SMALL_FP32, unpacked)
    inferred = report(path, phases="inferred")
    assert inferred.source["phase_source"] == "inferred"
    assert inferred.phases.set_index("phase")["gpu_time_ms"].to_dict() == pytest.approx(
        {"forward": 10.281538, "backward": 19.631656, "optimizer": 7.667537}
    )
    _, _, stripped, _ = both(path)
    forced = report_of_columns([stripped], phases="annotated")
    assert forced.source["phase_source"] == "annotated"
    assert list(forced.phases["phase"]) == ["unattributed"]
    assert forced.phases.at[0, "gpu_time_ms"] == pytest.approx(37.580731)
    with pytest.raises(BadInput, match="--phases must be one of auto, annotated, inferred"):
        report_of_columns([stripped], phases="guess")


def test_chrome_autograd_ops_find_the_worker_without_thread_names() -> None:
    path = DATA / "torch-small-ctx128-train.json.gz"
    columns, annotated, _, _ = both(path)
    assert columns.meta["autograd_threads"] == [510]
    by_ops = without(path, annotated.plan.is_phase)  # autograd's ops, no thread names
    for key in ("thread_names", "threads"):
        by_ops.meta.pop(key, None)
    assert by_ops.meta["autograd_threads"] == [510]
    assert kernel_totals(attribution_of(by_ops), by_ops) == kernel_totals(annotated, columns)
    # Neither names nor ops: no backward can be found, and the note says so.
    blind = without(path, annotated.plan.is_phase)
    for key in ("thread_names", "threads", "autograd_threads"):
        blind.meta.pop(key, None)
    assert "backward" not in kernel_totals(attribution_of(blind), blind)
    notes = report_of_columns([blind]).notes
    assert any("no autograd thread (pt_autograd_N) is named in this trace" in n for n in notes)


# --- synthetic: accumulation, several processes -------------------------------------------

ADAM = "void multi_tensor_apply_kernel<FusedAdamMathFunctor<float>>(T1)"
SEED = "void vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096>)"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096>)"
RANK1_MAIN = (1 << 48) | (200 << 24) | 200
RANK1_WORKER = (1 << 48) | (200 << 24) | 201
NAMES = {MAIN: "python3", WORKER: "pt_autograd_0", RANK1_MAIN: "python3",
         RANK1_WORKER: "pt_autograd_0"}  # fmt: skip


def accumulating(path: Path, pids: tuple[int, ...]) -> ActivityColumns:
    """Two micro-batches per optimizer step in each process of ``pids`` (100, 200), with
    collectives from autograd's hooks (backward) and from the main thread (forward)."""
    e = Export(path)
    threads = {100: (MAIN, WORKER), 200: (RANK1_MAIN, RANK1_WORKER)}
    for pid in pids:
        main, worker = threads[pid]
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
    columns = load(e.save())
    columns.meta["thread_names"] = NAMES
    return columns


def test_gradient_accumulation_and_two_processes(tmp_path: Path) -> None:
    """Two micro-batches per optimizer step, in two processes (ranks) at once."""
    columns = accumulating(tmp_path / "accumulate.sqlite", (100, 200))
    att = attribution_of(columns)
    names = np.array(columns.names)[columns.arrays["name"]]
    got = pd.Series(att.phases).groupby(names).agg(set).to_dict()
    assert got == {"fwd_gemm": {"forward"}, SEED: {"backward"}, "bwd_gemm": {"backward"},
                   ADAM: {"optimizer"}, ALL_REDUCE: {"backward"},
                   ALL_GATHER: {"forward"}}  # fmt: skip
    assert att.plan.phase_source == "inferred"
    instances = {name: n for name, (n, _) in att.plan.inferred_spans.items()}
    assert instances == {"forward": 8, "backward": 8, "optimizer": 4}
    # Per rank: each process's activities alone give the same phases (the per-rank reading).
    process = (columns.launch_threads(columns.arrays["launch_thread"]) >> 24) & 0xFFFFFF
    for pid in (100, 200):
        alone = accumulating(tmp_path / f"alone{pid}.sqlite", (pid,))
        assert (attribution_of(alone).phases == att.phases[process == pid]).all()
    # Two steps per process: the first ends after its optimizer kernel.
    assert att.plan.inference is not None
    steps = att.plan.inference.step_of(np.array([MAIN, MAIN, RANK1_MAIN]), np.array([0, 1500, 0]))
    assert len(set(steps.tolist())) == 3
