"""Attribution of GPU activity to phases and ranges, categories, and the report's tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from nsys_data import (
    GRAPH_NODES,
    GRAPH_WHOLE,
    MAIN,
    PROBE,
    SMALL_BF16,
    SMALL_FP32,
    START_END,
    STATS,
    TINY_COMPILE,
    WORKER,
    Export,
    unpack,
)
from synthetic import report as report_of

from profkit.analysis import (
    CATEGORIES,
    categorize,
    kernel_report_markdown,
    short_kernel_name,
)
from profkit.analysis.attribution import Plan, attributed, plan_of
from profkit.analysis.report_types import CONTRACT, EXTRA
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns
from profkit.traces.load import load_columns


@pytest.fixture(scope="session")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nsys")


def attribution(path: Path) -> tuple[ActivityColumns, Plan, dict[str, np.ndarray]]:
    """The trace's columns, its attribution plan and each activity's attribution."""
    columns = load_columns(path, cache=False)
    plan = plan_of(columns)
    return columns, plan, dict(attributed(columns, plan))


def phase_totals(path: Path, same_thread: bool = False) -> dict[str, tuple[int, int]]:
    """{phase: (activities, GPU ns)} by profkit's rule, or by the launching thread alone."""
    columns, plan, att = attribution(path)
    codes = att["same" if same_thread else "phase"]
    duration = columns.arrays["duration"]
    return {
        name: (int((codes == i).sum()), int(duration[codes == i].sum()))
        for i, name in enumerate(plan.phase_names)
        if (codes == i).any()
    }


def cross_thread(plan: Plan, att: dict[str, np.ndarray]) -> int:
    """Activities whose phase came from their process's owner thread, not their own: a
    point on the owner's lane, a phase annotated (not inferred) and not the catch-all."""
    unattributed = len(plan.phase_names) - 1
    owner = (att["owner_slot"] >= 0) & (att["inferred"] == 0)
    return int((owner & (att["phase"] != unattributed)).sum())


# --- the real exports ---------------------------------------------------------------------


def test_probe_backward_gets_the_kernels_autograd_launched() -> None:
    assert phase_totals(PROBE) == {
        "forward": (6, 8_279_101),
        "backward": (23, 8_548_608),
        "unattributed": (2, 81_890),  # the randn before the first range
    }
    # The launching thread alone keeps only what the main thread launched in backward
    # (the .sum() and its memset): 9 of 23 activities, 0.1 of 8.5 ms.
    assert phase_totals(PROBE, same_thread=True)["backward"] == (9, 106_529)
    _, plan, att = attribution(PROBE)
    assert cross_thread(plan, att) == 14
    assert plan.owners == {281494723495065 >> 24: 281494723495065}


@pytest.mark.parametrize(
    ("name", "expected", "backward_same_thread"),
    [
        (
            SMALL_FP32,
            {
                "forward": (1460, 10_281_538),
                "backward": (2456, 19_631_656),
                "optimizer": (112, 7_667_537),
            },
            (2, 2_048),
        ),
        (
            SMALL_BF16,
            {
                "forward": (1778, 4_980_874),
                "backward": (2534, 8_241_474),
                "optimizer": (112, 7_677_585),
            },
            (2, 2_112),
        ),
        (
            TINY_COMPILE,
            {"forward": (84, 307_907), "backward": (180, 708_132), "optimizer": (16, 288_163)},
            (2, 1_984),
        ),
    ],
)
def test_training_step_phases_on_h100_exports(
    unpacked: Path,
    name: str,
    expected: dict[str, tuple[int, int]],
    backward_same_thread: tuple[int, int],
) -> None:
    path = unpack(name, unpacked)
    assert phase_totals(path) == expected  # every activity lands in a phase
    same = phase_totals(path, same_thread=True)
    assert same["backward"] == backward_same_thread
    # That same-thread rule is what Nsight Systems' own nvtx_gpu_proj_sum applies: its
    # "GPU ops" and projected time for each phase match ours exactly.
    nsys = pd.read_csv(STATS / f"{name}_nvtx_gpu_proj_sum.csv").set_index("Range")
    for phase in ("forward", "backward", "optimizer"):
        assert nsys.at[f":{phase}", "Total GPU Ops"] == same[phase][0]
    assert nsys.at[":backward", "Total Proj Time (ns)"] == backward_same_thread[1]


def test_attention_subranges_hold_their_kernels(unpacked: Path) -> None:
    """Ranges on the launching thread agree with nsys; children count in their parents.

    nsys's "GPU Ops" are activities: kernels plus the copies and memsets."""
    name = SMALL_FP32
    report = report_of(unpack(name, unpacked))
    ranges = report.ranges.set_index("range")
    nsys = pd.read_csv(STATS / f"{name}_nvtx_gpu_proj_sum.csv").set_index("Range")
    for label in ("scaled dot product attention", "computing attention scores",
                  "computing softmax", "final matmul", "forward", "optimizer"):  # fmt: skip
        ops = ranges.loc[label, ["kernels", "memcpy", "memset"]].sum()
        assert ops == nsys.at[f":{label}", "Total GPU Ops"]
        assert ranges.at[label, "instances"] == nsys.at[f":{label}", "Range Instances"]
    assert ranges.at["CCCL:cub::DeviceRadixSort", "kernels"] == 2
    children = ["computing attention scores", "computing softmax", "final matmul"]
    assert (
        ranges.loc[children, "kernels"].sum()
        == ranges.at["scaled dot product attention", "kernels"]
    )
    assert ranges.loc[children, "gpu_time_ms"].sum() == pytest.approx(
        ranges.at["scaled dot product attention", "gpu_time_ms"]
    )
    # Analytic FLOPs from the sidecar's config (small: d_model 768, 12 heads; B 4, T 128).
    assert ranges.at["computing attention scores", "mflop"] == pytest.approx(101.449728)
    assert ranges.at["computing softmax", "mflop"] == pytest.approx(3.93216)
    assert ranges.at["final matmul", "mflop"] == pytest.approx(100.663296)


def test_kernel_statistics_match_nsys_cuda_gpu_kern_sum(unpacked: Path) -> None:
    name = SMALL_BF16
    report = report_of(unpack(name, unpacked), top=0)
    ours = report.overall.set_index("name")
    nsys = pd.read_csv(STATS / f"{name}_cuda_gpu_kern_sum.csv").set_index("Name")
    joined = nsys.join(ours, how="left")
    assert joined["instances"].notna().all() and len(joined) == 64
    assert (joined["Instances"] == joined["instances"]).all()
    assert (joined["Total Time (ns)"] == (joined["total_ms"] * 1e6).round()).all()
    for theirs, mine in (("Med (ns)", "med_us"), ("Min (ns)", "min_us"), ("Max (ns)", "max_us"),
                         ("Avg (ns)", "avg_us"), ("StdDev (ns)", "std_us")):  # fmt: skip
        assert np.allclose(joined[theirs], joined[mine] * 1e3, atol=0.051)  # nsys rounds to 0.1


def test_cuda_graph_kernels_belong_to_the_range_around_the_replay(unpacked: Path) -> None:
    nodes = phase_totals(unpack(GRAPH_NODES, unpacked))
    whole = phase_totals(unpack(GRAPH_WHOLE, unpacked))
    # Three replays of (gemm, softmax, memset, sum) plus three relus in another domain.
    assert nodes["forward"] == (15, 249_090)
    assert whole["forward"] == (6, 252_417)  # three whole-graph rows plus the relus
    assert nodes["eager"][0] == whole["eager"][0] == 18
    report = report_of(unpack(GRAPH_WHOLE, unpacked))
    categories = report.categories.set_index(["phase", "category"])
    assert categories.at[("forward", "graph"), "graphs"] == 3
    assert categories.at[("forward", "graph"), "kernels"] == 0
    # "replays" (start/end) wraps the phases, so it is not a phase itself; "lib op" is in
    # another domain, so it is a range but never a phase.
    assert list(report.phases["phase"]) == ["forward", "eager"]
    assert set(report.ranges["range"]) == {"replays", "forward", "eager", "mylib:lib op"}


# --- categories on real names ---------------------------------------------------------------

REAL_NAMES = {
    # Hopper bf16 cuBLASLt, Ampere-era cuBLAS, CUTLASS (from the H100 fixtures and the seeds)
    "nvjet_sm90_tst_192x160_64x3_2x1_v_bz_coopB_NTT": "gemm",
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x64x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": "gemm",
    "ampere_sgemm_128x64_tn": "gemm",
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn": "gemm",
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)": "gemm",
    "void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, float, float, float, (bool)0, float, float, float, (bool)1, (bool)0, (bool)0, (bool)0>(cublasLt::cublasSplitKParams<T6>, const T4 *, const T10 *, T9 *, T5 *, const T6 *, const T6 *, const T11 *, const T4 *, T11 *, void *, long, T6 *, int *)": "gemm",
    "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<const float>, cublasGemvTensorStridedBatched<const float>, cublasGemvTensorStridedBatched<float>, float>>(T13, T6, T6)": "gemm",
    # fused attention
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t>>, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)": "attention",
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0": "attention",
    # softmax, including cross-entropy's log-softmax
    "void at::native::<unnamed>::cunn_SoftMaxForwardReg<float, float, float, at::native::<unnamed>::SoftMaxForwardEpilogue, long, (int)4>(T3 *, const T1 *, T5)": "softmax",
    "void <unnamed>::softmax_warp_forward<float, float, float, (int)10, (bool)0, (bool)0>(T2 *, const T1 *, int, int, int, const bool *, int, bool)": "softmax",
    "void at::native::<unnamed>::cunn_SoftMaxBackwardSmem<(int)8, c10::BFloat16, float, c10::BFloat16, at::native::<unnamed>::LogSoftMaxBackwardEpilogue>(T2 *, const T4 *, const T4 *, long)": "softmax",
    # elementwise, reductions, normalization
    "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, std::array<char *, (unsigned long)3>>(int, T2, T3)": "elementwise",
    "void at::native::elementwise_kernel<(int)128, (int)4, void at::native::gpu_kernel_impl_nocast<at::native::<unnamed>::masked_fill_kernel(at::TensorIterator &, const c10::Scalar &)::[lambda() (instance 1)]::operator ()() const::[lambda() (instance 7)]::operator ()() const::[lambda(float, bool) (instance 1)]>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)": "elementwise",
    "void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<float, (int)4>(long, at::PhiloxCudaState, T3, T4)": "elementwise",
    "void at::native::triu_tril_kernel<bool, int, (bool)0, (int)8, (bool)0>(at::cuda::detail::TensorInfo<T1, T2>, at::cuda::detail::TensorInfo<const T1, T2>, long, long, T2)": "elementwise",
    "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, (int)4, (int)4>>(T3)": "reduction",
    "void at::native::<unnamed>::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(T1 *, T1 *, const T1 *, const T3 *, const T1 *, bool, long, long, long, long)": "reduction",
    "void at::native::<unnamed>::vectorized_layer_norm_kernel<float, float, (bool)0>(int, T2, const T1 *, const T1 *, const T1 *, T2 *, T2 *, T1 *)": "normalization",
    "void at::native::<unnamed>::RowwiseMomentsCUDAKernel<float, float>(long, T2, const T1 *, T2 *, T2 *)": "normalization",
    # optimizer (AdamW's foreach path and the fused one)
    "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<(int)2>, at::native::<unnamed>::TernaryOpScalarFunctor<float, (int)2, (int)2, (int)0>, at::native::LerpFunctor<float>, float>(T1, T2, T3...)": "optimizer",
    "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::FusedAdamMathFunctor<float, (int)4, (at::native::ADAM_MODE)1, (bool)0>>(T1, T2, T3...)": "optimizer",
    # memory: copies and casts (autocast), memcpy, memset
    "void at::native::vectorized_elementwise_kernel<(int)8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda(float) (instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)": "memory",
    "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase &)::[lambda() (instance 3)]::operator ()() const::[lambda() (instance 7)]::operator ()() const::[lambda(float) (instance 1)]>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)": "memory",
    "void at::native::<unnamed>::CatArrayBatchedCopy<float, unsigned int, (int)4, (int)64, (int)64>(T1 *, at::native::<unnamed>::CatArrInputTensorMetadata<T1, T2, T4, T5>, at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4>, int, T2)": "memory",
    "[CUDA memcpy Host-to-Device]": "memory",
    "[CUDA memset]": "memory",
    # collectives, compiled code, whole graphs, the rest
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)": "nccl",
    "triton_per_fused__softmax_div_exp_masked_fill_prepare_softmax_online_sub_view_3": "triton",
    "triton_tem_fused_mm_0": "triton",
    "[CUDA graph 1]": "graph",
    "void <unnamed>::indexing_backward_kernel<float, (int)4>(const long *, const long *, const T1 *, T1 *, long, long, long, long, bool)": "other",
}


@pytest.mark.parametrize(("name", "category"), REAL_NAMES.items(), ids=lambda x: str(x)[:40])
def test_categories_of_real_kernel_names(name: str, category: str) -> None:
    assert categorize(name) == category


def test_every_kernel_of_the_fixtures_gets_a_meaningful_category(unpacked: Path) -> None:
    for name in (SMALL_FP32, SMALL_BF16, TINY_COMPILE):
        report = report_of(unpack(name, unpacked), top=0)
        assert set(report.overall["category"]) <= set(CATEGORIES)
        other = report.overall[report.overall["category"] == "other"]
        # Only the embedding's index backward and CUB's radix sort stay unclassified.
        assert other["total_ms"].sum() < 0.01 * report.totals["gpu_time_ms"]
    compiled = report_of(unpack(TINY_COMPILE, unpacked))
    assert "triton" in set(compiled.categories["category"])


def test_short_names_keep_the_functor() -> None:
    assert (
        short_kernel_name(
            "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
            "std::array<char *, (unsigned long)3>>(int, T2, T3)"
        )
        == "vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>"
    )
    assert (
        short_kernel_name(
            "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast"
            "<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>"
            "(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)"
        )
        == "elementwise_kernel<128, 2, BinaryFunctor<float, MulFunctor<float>>>"
    )
    assert (
        short_kernel_name("nvjet_sm90_tst_48x64_64x15_2x1_v_bz_TNN")
        == "nvjet_sm90_tst_48x64_64x15_2x1_v_bz_TNN"
    )
    assert len(short_kernel_name("x" * 200)) == 80


# --- the report ----------------------------------------------------------------------------


def test_json_follows_the_contract_exactly(unpacked: Path) -> None:
    report = report_of(unpack(SMALL_FP32, unpacked), top=5)
    value = report.to_json()
    assert list(value) == ["source", "totals", "phases", "ranges", "kernels", "categories"]
    assert {"path", "format"} <= set(value["source"]) and value["source"]["format"] == "nsys-sqlite"
    assert value["source"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert value["totals"] == {
        "kernels": 3858,
        "memcpy": 98,
        "memset": 72,
        "kernel_time_ms": pytest.approx(37.341626),
        "gpu_time_ms": pytest.approx(37.580731),
    }
    for key, columns in CONTRACT.items():
        # the contract's keys first, in order; then those of EXTRA the table has
        assert value[key] and all(list(row)[: len(columns)] == columns for row in value[key])
        assert all(set(list(row)[len(columns) :]) <= set(EXTRA[key]) for row in value[key])
    kernels = pd.DataFrame(value["kernels"])
    assert kernels.groupby("phase").size().to_dict() == {
        "forward": 5,
        "backward": 5,
        "optimizer": 5,
    }
    assert kernels["name"].str.len().max() > 100  # full names in JSON
    assert sum(p["share"] for p in value["phases"]) == pytest.approx(1.0)


def test_phase_python_times_from_the_sidecar(unpacked: Path) -> None:
    report = report_of(unpack(SMALL_FP32, unpacked))
    phases = report.phases.set_index("phase")
    assert phases.at["forward", "python_ms"] == pytest.approx(16.653317 + 16.158417)
    assert phases.at["backward", "instances"] == 2
    assert phases.at["backward", "cpu_time_ms"] == pytest.approx(48.180963)
    # GPU time never exceeds the wall time of the phase's ranges here (one stream).
    assert (phases["gpu_time_ms"] <= phases["cpu_time_ms"]).all()


def test_filters_by_phase_and_range(unpacked: Path) -> None:
    trace = unpack(SMALL_FP32, unpacked)
    backward = report_of(trace, phase="backward")
    assert backward.totals["kernels"] == 2310 and list(backward.phases["phase"]) == ["backward"]
    softmax = report_of(trace, range="computing softmax")
    assert softmax.totals["kernels"] == 24
    assert set(softmax.categories["category"]) == {"softmax"}
    cub = report_of(trace, range="CCCL:cub::DeviceRadixSort")
    assert cub.totals["kernels"] == 2 and set(cub.overall["category"]) == {"other"}
    with pytest.raises(BadInput, match=r"no phase 'warmup'.*forward, backward, optimizer"):
        report_of(trace, phase="warmup")
    with pytest.raises(BadInput, match="no range named 'attention'"):
        report_of(trace, range="attention")
    with pytest.raises(BadInput, match="--top"):
        report_of(trace, top=-1)


def test_markdown_report(unpacked: Path) -> None:
    report = report_of(unpack(SMALL_FP32, unpacked), top=3)
    text = kernel_report_markdown(report, "small fp32")
    assert text.startswith("# small fp32\n")
    for section in ("## Phases", "## Top 3 by GPU time (kernels, memcpy, memset), all phases",
                    "## Top 3 by GPU time (kernels, memcpy, memset) in backward",
                    "## Ranges", "## GPU time by category"):  # fmt: skip
        assert section in text
    assert "python_ms" in text and "NVIDIA H100 80GB HBM3" in text
    assert (
        "backward: 2,454 of its 2,456 GPU activities were launched from pt_autograd_0 and "
        "attributed through the ranges open on python3 at launch"
    ) in text
    assert "would give it 2." in text
    assert "matmuls do 202.1 MFLOP and the softmax 3.93 MFLOP (51.4× the FLOPs)" in text
    assert "only 6.3× its GPU time (0.633 ms vs 0.100 ms" in text


# --- synthetic edge cases -------------------------------------------------------------------


def synthetic(tmp_path: Path, build) -> Path:  # type: ignore[no-untyped-def]
    export = Export(tmp_path / "synthetic.sqlite")
    build(export)
    return export.save()


def test_nested_ranges_count_their_children(tmp_path: Path) -> None:
    def build(e: Export) -> None:
        e.ranges([("forward", 0, 1000), ("layer", 100, 600), ("attention", 200, 300)])
        e.kernel("a_gemm", 2000, 10, launch_at=250)  # inside all three
        e.kernel("b_gemm", 2100, 20, launch_at=500)  # forward > layer
        e.kernel("c_gemm", 2200, 40, launch_at=700)  # forward only
        e.kernel("late", 2300, 80, launch_at=1000)  # a range's end is exclusive

    report = report_of(synthetic(tmp_path, build))
    ranges = report.ranges.set_index("range")
    assert ranges["kernels"].to_dict() == {"forward": 3, "layer": 2, "attention": 1}
    assert ranges["gpu_time_ms"].to_dict() == pytest.approx(
        {"forward": 70e-6, "layer": 30e-6, "attention": 10e-6}
    )
    assert report.phases.set_index("phase")["kernels"].to_dict() == {
        "forward": 3,
        "unattributed": 1,
    }


def test_worker_thread_kernels_take_the_owner_threads_ranges(tmp_path: Path) -> None:
    def build(e: Export) -> None:
        e.ranges([("forward", 0, 1000), ("backward", 1000, 3000), ("optimizer", 3000, 4000)])
        e.range("step", 0, 4000)  # a wrapper around the phases: not a phase itself
        e.kernel("fwd", 5000, 10, launch_at=500)
        for i in range(5):
            e.kernel(f"bwd{i}", 6000 + i * 100, 10, launch_at=1500 + i, thread=WORKER)
        # A worker holding a range of its own (emit_nvtx style) keeps it, and the phase.
        e.range("aten::mm", 2000, 2100, thread=WORKER)
        e.kernel("bwd_mm", 7000, 10, launch_at=2050, thread=WORKER)
        e.kernel("opt", 8000, 10, launch_at=3500)
        e.kernel("after", 9000, 10, launch_at=4500, thread=WORKER)  # no phase open anywhere

    trace = synthetic(tmp_path, build)
    report = report_of(trace)
    assert report.phases.set_index("phase")["kernels"].to_dict() == {
        "forward": 1, "backward": 6, "optimizer": 1, "unattributed": 1,
    }  # fmt: skip
    ranges = report.ranges.set_index("range")["kernels"].to_dict()
    assert ranges == {"step": 8, "backward": 6, "forward": 1, "optimizer": 1, "aten::mm": 1}
    assert "backward" not in phase_totals(trace, same_thread=True)  # nsys's rule: none
    _, plan, att = attribution(trace)
    assert plan.owners == {MAIN >> 24: MAIN}
    assert cross_thread(plan, att) == 6


def test_other_domains_are_ranges_not_phases(tmp_path: Path) -> None:
    def build(e: Export) -> None:
        e.domain(1, "mylib")
        e.range("lib call", 0, 5000, domain=1)  # encloses everything, but in its own domain
        e.ranges([("forward", 100, 1000), ("backward", 1000, 2000)])
        e.kernel("k1", 3000, 10, launch_at=500)
        e.kernel("k2", 3100, 10, launch_at=1500)

    report = report_of(synthetic(tmp_path, build))
    assert list(report.phases["phase"]) == ["forward", "backward"]
    assert report.ranges.set_index("range").at["mylib:lib call", "kernels"] == 2


def test_user_ranges_are_phases_only_beside_known_phases(tmp_path: Path) -> None:
    def build(e: Export) -> None:
        e.ranges([("load batch", 0, 100), ("train_step", 100, 1000), ("inner", 200, 300)])
        e.range("epoch", 0, 2000, kind=START_END)
        e.kernel("copy", 5000, 5, launch_at=50)
        e.kernel("gemm", 5100, 50, launch_at=250)

    trace = synthetic(tmp_path, build)
    # No forward/backward/optimizer range anywhere: no range is promoted to a phase (it
    # could as well be an op inside the model); the phases are inferred, all forward here.
    report = report_of(trace)
    assert report.phases.set_index("phase")["kernels"].to_dict() == {"forward": 2}
    assert report.source["phase_source"] == "inferred"
    assert report.ranges.set_index("range")["kernels"].to_dict() == {
        "epoch": 2, "train_step": 1, "inner": 1, "load batch": 1,
    }  # fmt: skip
    forced = report_of(trace, phases="annotated")
    assert forced.phases.set_index("phase")["kernels"].to_dict() == {"unattributed": 2}

    def beside(e: Export) -> None:
        e.ranges([("load batch", 0, 100), ("forward", 100, 1000), ("inner", 200, 300)])
        e.kernel("copy", 5000, 5, launch_at=50)
        e.kernel("gemm", 5100, 50, launch_at=250)

    # Beside a known phase, the user's own top-level range is a phase too.
    (tmp_path / "beside").mkdir()
    report = report_of(synthetic(tmp_path / "beside", beside))
    assert report.phases.set_index("phase")["kernels"].to_dict() == {"load batch": 1, "forward": 1}
    assert report.source["phase_source"] == "annotated"


def test_processes_have_their_own_owner_thread(tmp_path: Path) -> None:
    rank1_main = (1 << 48) | (200 << 24) | 200
    rank1_worker = (1 << 48) | (200 << 24) | 201

    def build(e: Export) -> None:
        e.ranges([("forward", 0, 1000), ("backward", 1000, 2000)])
        e.ranges([("forward", 0, 1500), ("backward", 1500, 2000)], thread=rank1_main)
        e.kernel("r0", 3000, 10, launch_at=1200, thread=WORKER)
        e.kernel("r1", 3000, 10, launch_at=1200, thread=rank1_worker, pid=200, correlation=1)

    columns, plan, att = attribution(synthetic(tmp_path, build))
    names = [columns.names[i] for i in columns.arrays["name"]]
    phases = dict(zip(names, np.array(plan.phase_names)[att["phase"]], strict=True))
    assert phases == {"r0": "backward", "r1": "forward"}


def test_the_range_table_sums_each_name_and_domain_as_a_groupby_would() -> None:
    """``range_table`` (of ``ranges_from_counts``) groups range rows on integer codes; a
    pandas groupby on the text (what it replaced) must give the same rows, order and sums,
    missing names dropped."""
    from profkit.analysis.report_tables import range_table

    rng = np.random.default_rng(3)
    n = 5_000
    names = np.array(["forward", "backward", "optimizer", "softmax", None], dtype=object)
    labels = names[rng.integers(0, 5, n)]
    start = rng.integers(0, 10**9, n)
    ranges = pd.DataFrame(
        {
            "start": start,
            "end": start + rng.integers(0, 10**6, n),
            "domain": pd.array(np.array(["", "NCCL", None], dtype=object)[rng.integers(0, 3, n)]),
        }
    )
    counts = {
        "kernels": rng.integers(0, 50, n),
        "kernel_ns": rng.integers(0, 10**7, n),
        "gpu_ns": rng.integers(0, 10**7, n),
    }
    none = np.zeros(n, dtype=np.int64)  # memcpy, memset, graphs
    by_range = np.column_stack(
        [counts["kernels"], none, none, none, counts["kernel_ns"], counts["gpu_ns"]]
    )
    got = range_table(by_range, ranges, labels, None, None)
    frame = pd.DataFrame(
        {"range": labels, "domain": ranges["domain"].fillna("").to_numpy(dtype=object), **counts,
         "cpu_ns": (ranges["end"] - ranges["start"]).to_numpy()}
    )  # fmt: skip
    want = (
        frame.groupby(["range", "domain"], sort=False)
        .agg(instances=("cpu_ns", "size"), **{c: (c, "sum") for c in [*counts, "cpu_ns"]})
        .reset_index()
        .sort_values(["gpu_ns", "instances"], ascending=[False, False], kind="stable")
        .reset_index(drop=True)
    )
    assert len(got) == len(want) == 8  # 4 names x 2 domains ("" and None are one)
    assert got["range"].tolist() == want["range"].tolist()
    assert got["domain"].tolist() == want["domain"].tolist()
    assert got["instances"].tolist() == want["instances"].tolist()
    assert (got["gpu_time_ms"] * 1e6).round().astype(np.int64).tolist() == want["gpu_ns"].tolist()
    assert (got["cpu_time_ms"] * 1e6).round().astype(np.int64).tolist() == want["cpu_ns"].tolist()
    assert got["kernels"].tolist() == want["kernels"].tolist()
