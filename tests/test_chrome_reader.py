"""The Chrome trace reader: real torch.profiler traces made here, edge cases, bad inputs.

The CPU trace is real: torch.profiler records one tiny-model train step in the test.
GPU activity cannot be recorded on a CPU-only machine, so the edge-case traces below
(``synthetic_*``) are SYNTHETIC: hand-written events in Kineto's exact shapes (as
``libkineto/src/output_json.cpp`` writes them) for what a CPU run never shows —
backward kernels launched from another thread, memcpy/memset, driver launches, old
capitalised categories. The real GPU fixture (captured on the GPU machine with
``benchmarks/gpu_torch.sh``) is checked against independently computed numbers when
present.
"""

from __future__ import annotations

import gzip
import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from column_checks import assert_same_columns
from torch.profiler import ProfilerActivity, profile, schedule

from profkit.errors import BadInput
from profkit.traces.chrome import is_chrome_trace, kernel_function_name, read_chrome_columns, to_ns
from profkit.traces.columns import ARRAYS, DEVICE, SHAPE, START, ActivityColumns
from profkit.workload.config import WorkloadConfig
from profkit.workload.step import Workload

DATA = Path(__file__).parent / "data"
GPU_FIXTURE = DATA / "torch-small-ctx128-train.json.gz"
ATTENTION = ("computing attention scores", "computing softmax", "final matmul")
RANGE_DTYPES = {"name": "string", "start": "int64", "end": "int64", "thread": "int64",
                "depth": "int64", "domain": "string"}  # fmt: skip


def column(columns: ActivityColumns, name: str) -> list[Any]:
    """One array of the columns, per activity, its codes looked up: names, kinds, grid and
    block, launching thread ids (-1: unknown); else the values (launch_start -1: unknown)."""
    codes = np.asarray(columns.arrays["name"])
    if name == "name":
        return [columns.names[c] for c in codes]
    if name == "kind":
        return [columns.kinds[c] for c in codes]
    if name in ("grid", "block"):
        return [columns.shapes[c][name == "block"] for c in columns.arrays[SHAPE]]
    if name == "launch_thread":
        return columns.launch_threads(columns.arrays["launch_thread"]).tolist()
    return np.asarray(columns.arrays[name]).tolist()


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny-model train step on the CPU, recorded the way profkit torch does."""
    path = tmp_path_factory.mktemp("chrome") / "cpu.json.gz"
    workload = Workload(WorkloadConfig(size="tiny", ctx=16, warmup=0, steps=1, device="cpu"))

    def ready(prof: Any) -> None:
        prof.export_chrome_trace(str(path))  # torch's own gzip export

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(2):
            workload.step()
            prof.step()
    return path


# ------------------------------------------------------------------ the real CPU trace


def test_cpu_trace_ranges_phases_attention_and_depths(cpu_trace: Path) -> None:
    ranges = read_chrome_columns(cpu_trace).ranges
    counts = ranges["name"].value_counts().to_dict()
    # tiny has 2 layers: one attention range with 3 sub-ranges per layer, one step.
    assert counts == {
        "forward": 1,
        "backward": 1,
        "optimizer": 1,
        "scaled dot product attention": 2,
        "computing attention scores": 2,
        "computing softmax": 2,
        "final matmul": 2,
        "Optimizer.step#AdamW.step": 1,
        "Optimizer.zero_grad#AdamW.zero_grad": 1,
    }
    depth = dict(zip(ranges["name"], ranges["depth"], strict=True))
    assert depth["forward"] == depth["backward"] == depth["optimizer"] == 0
    assert depth["scaled dot product attention"] == 1
    assert all(depth[name] == 2 for name in ATTENTION)
    assert depth["Optimizer.step#AdamW.step"] == 1
    assert ranges["thread"].nunique() == 1  # on the CPU, backward runs on the main thread
    assert ranges["start"].is_monotonic_increasing
    assert (ranges["end"] > ranges["start"]).all()


def test_cpu_trace_nesting_is_consistent_with_times(cpu_trace: Path) -> None:
    ranges = read_chrome_columns(cpu_trace).ranges
    forward = ranges[ranges["name"] == "forward"].iloc[0]
    backward = ranges[ranges["name"] == "backward"].iloc[0]
    assert forward["end"] <= backward["start"]
    for row in ranges[ranges["depth"] > 0].itertuples():
        parents = ranges[
            (ranges["depth"] == row.depth - 1)
            & (ranges["start"] <= row.start)
            & (ranges["end"] >= row.end)
        ]
        assert len(parents) == 1, row.name


def test_cpu_trace_has_no_kernels_and_says_so(cpu_trace: Path) -> None:
    columns = read_chrome_columns(cpu_trace)
    assert len(columns) == 0 and columns.names == [] and len(columns.threads) == 0
    assert {name: columns.arrays[name].dtype for name in ARRAYS} == ARRAYS
    assert columns.ranges.dtypes.astype(str).to_dict() == RANGE_DTYPES
    assert any("no GPU kernels were recorded" in w for w in columns.meta["warnings"])
    assert columns.meta["format"] == "chrome"


def test_profiler_step_ranges_are_kept_out_of_the_phases(cpu_trace: Path) -> None:
    trace = read_chrome_columns(cpu_trace)
    assert not trace.ranges["name"].str.startswith("ProfilerStep#").any()
    (step,) = trace.meta["profiler_steps"]
    assert step["name"].startswith("ProfilerStep#")
    assert step["start"] <= trace.ranges["start"].min()
    assert step["end"] >= trace.ranges["end"].max()


def test_plain_json_and_gzip_read_the_same(cpu_trace: Path, tmp_path: Path) -> None:
    plain = tmp_path / "cpu.json"
    plain.write_bytes(gzip.decompress(cpu_trace.read_bytes()))
    a, b = read_chrome_columns(cpu_trace), read_chrome_columns(plain)
    b.meta["path"] = a.meta["path"]  # the one difference: the file's name
    assert_same_columns(a, b)


def test_times_are_base_plus_exact_nanoseconds(cpu_trace: Path) -> None:
    doc = json.loads(gzip.decompress(cpu_trace.read_bytes()), parse_float=Decimal)
    base = int(doc.get("baseTimeNanoseconds", 0))
    event = next(e for e in doc["traceEvents"] if e.get("name") == "forward")
    trace = read_chrome_columns(cpu_trace)
    row = trace.ranges[trace.ranges["name"] == "forward"].iloc[0]
    assert row["start"] == base + int(event["ts"] * 1000)
    assert row["end"] - row["start"] == int(event["dur"] * 1000)


def test_to_ns_is_exact_where_naive_rounding_is_not() -> None:
    rng = random.Random(0)
    values = [rng.randrange(10**15, 8 * 10**15) for _ in range(20_000)]  # ns, ~1e12 µs
    as_us = [float(f"{ns // 1000}.{ns % 1000:03d}") for ns in values]  # Kineto's format
    assert to_ns(as_us).tolist() == values
    assert sum(round(us * 1000) != ns for us, ns in zip(as_us, values, strict=True)) > 0
    assert to_ns([4376015922311.139], base_ns=1790857026000000000)[0] == (
        1790857026000000000 + 4376015922311139
    )


# --------------------------------------------------------- synthetic Kineto-shaped traces


def synthetic_trace(events: list[dict[str, Any]], **header: Any) -> dict[str, Any]:
    """SYNTHETIC: a Kineto-shaped document around ``events``."""
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_000_000_000_000,
        "traceEvents": events,
    }
    doc.update(header)
    return doc


def x(cat: str, name: str, ts: float, dur: float, pid: int, tid: int, **args: Any) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def launch(ts: float, tid: int, corr: int, name: str = "cudaLaunchKernel") -> dict:
    cat = "cuda_driver" if name.startswith("cu") and not name.startswith("cuda") else "cuda_runtime"
    return x(cat, name, ts, 3.5, 4242, tid, **{"External id": corr + 1, "cbid": 211,
                                                "correlation": corr})  # fmt: skip


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict:
    return x("kernel", name, ts, dur, 0, stream, **{"queued": 0, "device": 0, "context": 1,
             "stream": stream, "correlation": corr, "grid": [160, 40, 1],
             "block": [128, 1, 1]})  # fmt: skip


MAIN, AUTOGRAD = 4242, 4250
GEMM = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(cutlass_80_simt_sgemm_128x64_8x5_nn_align1::Params)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"


def synthetic_step() -> list[dict[str, Any]]:
    """SYNTHETIC: forward on the main thread, backward kernels launched from autograd."""
    return [
        {"ph": "M", "name": "thread_name", "pid": 4242, "tid": MAIN, "args": {"name": "thread 4242 (python)"}},
        {"ph": "M", "name": "thread_name", "pid": 4242, "tid": AUTOGRAD, "args": {"name": "thread 4250 (pt_autograd_0)"}},
        x("user_annotation", "ProfilerStep#3", 10.0, 1000.0, 4242, MAIN),
        x("user_annotation", "forward", 100.0, 200.0, 4242, MAIN),
        x("user_annotation", "scaled dot product attention", 120.0, 50.0, 4242, MAIN),
        x("cpu_op", "aten::mm", 125.0, 10.0, 4242, MAIN),
        launch(126.0, MAIN, 501),
        x("user_annotation", "backward", 300.0, 400.0, 4242, MAIN),
        launch(310.5, AUTOGRAD, 502),
        launch(320.25, AUTOGRAD, 503),
        # Kineto's projection of the CPU range onto the GPU: must not become a range.
        x("gpu_user_annotation", "backward", 330.0, 5.0, 0, 7),
        kernel(GEMM, 130.0, 25.125, 501),
        kernel(ADD, 330.001, 4.5, 502),
        kernel(GEMM, 340.0, 60.0, 503),
        {"ph": "s", "id": 502, "pid": 4242, "tid": AUTOGRAD, "ts": 310.5, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 502, "pid": 0, "tid": 7, "ts": 330.001, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]  # fmt: skip


def write(tmp_path: Path, doc: Any, name: str = "t.json") -> Path:
    path = tmp_path / name
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


def test_synthetic_backward_kernels_keep_their_autograd_launch_thread(tmp_path: Path) -> None:
    trace = read_chrome_columns(write(tmp_path, synthetic_trace(synthetic_step())))
    base = 1_000_000_000_000
    # Each kernel has its own launch (correlation 501, 502, 503): thread and start.
    assert column(trace, "launch_thread") == [MAIN, AUTOGRAD, AUTOGRAD]
    assert column(trace, "launch_start") == [base + 126_000, base + 310_500, base + 320_250]
    assert column(trace, "duration") == [25_125, 4_500, 60_000]
    shorts = [kernel_function_name(name) for name in column(trace, "name")]
    assert shorts == ["Kernel2", "vectorized_elementwise_kernel", "Kernel2"]
    assert column(trace, "grid") == ["160,40,1"] * 3 and column(trace, "block") == ["128,1,1"] * 3
    assert set(column(trace, "kind")) == {"kernel"}
    # A trace that names its rank keeps GPU starts and devices: the same events, timed.
    ranked = synthetic_trace(synthetic_step(), distributedInfo={"rank": 0, "world_size": 1})
    timed = read_chrome_columns(write(tmp_path, ranked, "ranked.json"))
    assert column(timed, START) == [base + 130_000, base + 330_001, base + 340_000]
    assert column(timed, DEVICE) == [0, 0, 0]
    assert trace.ranges["name"].tolist() == ["forward", "scaled dot product attention", "backward"]
    assert trace.ranges["depth"].tolist() == [0, 1, 0]
    assert trace.meta["threads"] == {
        MAIN: "thread 4242 (python)",
        AUTOGRAD: "thread 4250 (pt_autograd_0)",
    }
    assert trace.meta["gpus"] == ["NVIDIA H100 80GB HBM3"]
    assert trace.meta["warnings"] == []


def test_synthetic_memcpy_memset_and_driver_launches(tmp_path: Path) -> None:
    events = [
        x("user_annotation", "forward", 0.0, 100.0, 4242, MAIN),
        launch(1.0, MAIN, 11, "cudaMemcpyAsync"),
        launch(2.0, MAIN, 12, "cudaMemsetAsync"),
        launch(3.0, MAIN, 13, "cuLaunchKernel"),
        launch(4.0, MAIN, 14, "cudaMemcpyAsync"),
        x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 10.0, 2.0, 0, 7,
          device=0, context=1, stream=7, correlation=11, bytes=4096),
        x("gpu_memset", "Memset (Device)", 20.0, 1.0, 0, 7, device=0, context=1, stream=7,
          correlation=12, bytes=4096),
        kernel("triton_poi_fused_add_0", 30.0, 1.5, 13, stream=9),
        x("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 40.0, 1.0, 0, 7,
          device=0, context=1, stream=7, correlation=14, bytes=64),
    ]  # fmt: skip
    k = read_chrome_columns(write(tmp_path, synthetic_trace(events), "t.json.gz"))
    assert column(k, "name") == [
        "[memcpy HtoD]",
        "[memset]",
        "triton_poi_fused_add_0",
        "[memcpy DtoD]",
    ]
    assert column(k, "kind") == ["memcpy", "memset", "kernel", "memcpy"]
    assert column(k, "grid") == ["", "", "160,40,1", ""]
    base = 1_000_000_000_000  # each its own launch: 1, 2, 3 and 4 µs
    assert column(k, "launch_start") == [base + 1_000, base + 2_000, base + 3_000, base + 4_000]


def test_synthetic_nested_ranges_on_two_threads(tmp_path: Path) -> None:
    events = [
        x("user_annotation", "outer", 0.0, 100.0, 1, 1),
        x("user_annotation", "inner", 0.0, 50.0, 1, 1),  # same start as its parent
        x("user_annotation", "inner2", 50.0, 50.0, 1, 1),  # starts where its sibling ends
        x("user_annotation", "deep", 60.0, 10.0, 1, 1),
        x("user_annotation", "after", 100.0, 10.0, 1, 1),  # starts where outer ends
        x("user_annotation", "other", 5.0, 200.0, 1, 2),
        x("user_annotation", "other-inner", 6.0, 1.0, 1, 2),
    ]
    r = read_chrome_columns(write(tmp_path, synthetic_trace(events))).ranges
    depth = dict(zip(r["name"], r["depth"], strict=True))
    assert depth == {"outer": 0, "inner": 1, "inner2": 1, "deep": 2, "after": 0, "other": 0,
                     "other-inner": 1}  # fmt: skip
    assert dict(zip(r["name"], r["thread"], strict=True))["other"] == 2


def test_synthetic_unmatched_duplicate_and_malformed_events(tmp_path: Path) -> None:
    events = [
        x("user_annotation", "forward", 0.0, 100.0, 1, 1),
        launch(5.0, 1, 21, "cudaLaunchKernel"),
        launch(5.5, 1, 21, "cuLaunchKernel"),  # the driver call inside it, same id
        kernel(GEMM, 10.0, 1.0, 21),
        kernel(GEMM, 20.0, 1.0, 99),  # its launch fell outside the trace window
        {"ph": "X", "cat": "kernel", "name": "half-written", "pid": 0, "tid": 7},
        "not an event",
    ]
    trace = read_chrome_columns(write(tmp_path, synthetic_trace(events)))
    assert column(trace, "launch_start") == [1_000_000_000_000 + 5_000, -1]  # -1: unknown
    warnings = " ".join(trace.meta["warnings"])
    assert "1 of 2 GPU activities have no matching" in warnings
    assert "skipped 2 malformed events" in warnings


def test_synthetic_old_kineto_and_array_format(tmp_path: Path) -> None:
    """Older Kineto: capitalised categories, absolute µs, no baseTimeNanoseconds."""
    events = [
        x("user_annotation", "forward", 1_700_000_000_000.5, 100.0, 1, 1),
        x("Runtime", "cudaLaunchKernel", 1_700_000_000_001.0, 2.0, 1, 1, correlation=5),
        x("Kernel", GEMM, 1_700_000_000_010.0, 3.25, 0, 7, device=0, stream=7, correlation=5),
        x("Memset", "Memset (Device)", 1_700_000_000_020.0, 1.0, 0, 7, device=0, stream=7),
    ]
    doc = {"traceEvents": events}
    trace = read_chrome_columns(write(tmp_path, doc))
    assert column(trace, "kind") == ["kernel", "memset"]
    # The kernel's launch (correlation 5) is known; the memset has none.
    assert column(trace, "launch_thread") == [1, -1]
    assert column(trace, "launch_start") == [1_700_000_000_001_000, -1]
    assert column(trace, "duration") == [3_250, 1_000]
    array = read_chrome_columns(write(tmp_path, events, "array.json"))
    for name in ("name", "kind", "grid", "block", "duration", "launch_start", "launch_thread"):
        assert column(array, name) == column(trace, name), name


def test_kernel_function_names() -> None:
    assert kernel_function_name(ADD) == "vectorized_elementwise_kernel"
    assert kernel_function_name("ampere_sgemm_128x64_tn") == "ampere_sgemm_128x64_tn"
    assert (
        kernel_function_name(
            "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
            "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
            "operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, "
            "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
            "operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>(int, "
            "at::native::gpu_kernel_impl_nocast<>(at::TensorIteratorBase&)::{lambda(int)#1})"
        )
        == "elementwise_kernel"
    )
    assert kernel_function_name("nvjet_tst_128x64_64x8_2x1_v_bz_coopA_NTN") == (
        "nvjet_tst_128x64_64x8_2x1_v_bz_coopA_NTN"
    )


# ------------------------------------------------------------------------- bad inputs


def _one_line_bad_input(path: Path, *needles: str) -> None:
    with pytest.raises(BadInput) as info:
        read_chrome_columns(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    for needle in needles:
        assert needle in message


def test_bad_inputs_are_one_line_errors(tmp_path: Path, cpu_trace: Path) -> None:
    _one_line_bad_input(tmp_path / "missing.json", "no such file")
    _one_line_bad_input(tmp_path, "directory")
    (tmp_path / "empty.json").write_bytes(b"")
    _one_line_bad_input(tmp_path / "empty.json", "empty")
    (tmp_path / "bad.json").write_text("{not json")
    _one_line_bad_input(tmp_path / "bad.json", "not valid JSON")
    (tmp_path / "cut.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1.5')
    _one_line_bad_input(tmp_path / "cut.json", "not valid JSON", "truncated?")
    for name, value in (("obj.json", {"foo": 1}), ("list.json", [1, 2]), ("str.json", "x")):
        (tmp_path / name).write_text(json.dumps(value))
        _one_line_bad_input(tmp_path / name, "not a Chrome trace")
    data = cpu_trace.read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[: len(data) // 2])
    _one_line_bad_input(tmp_path / "cut.json.gz", "truncated or corrupt gzip")
    (tmp_path / "junk.json.gz").write_bytes(b"\x1f\x8b" + b"junk" * 10)
    _one_line_bad_input(tmp_path / "junk.json.gz", "truncated or corrupt gzip")
    (tmp_path / "latin.json").write_bytes(b'{"traceEvents": ["\xff"]}')
    _one_line_bad_input(tmp_path / "latin.json", "not valid JSON")
    # A picture named like a trace: said to be binary, not a JSON parser's complaint.
    (tmp_path / "image.json.gz").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    _one_line_bad_input(tmp_path / "image.json.gz", "not a Chrome trace", "binary data")
    (tmp_path / "words.json").write_text("hello world")
    _one_line_bad_input(tmp_path / "words.json", "not a Chrome trace", "JSON object or array")


def test_sniffing(tmp_path: Path, cpu_trace: Path) -> None:
    assert is_chrome_trace(cpu_trace)
    assert is_chrome_trace(tmp_path / "missing.json")  # the reader then says what is wrong
    renamed = tmp_path / "trace.bin"
    renamed.write_bytes(cpu_trace.read_bytes())
    assert is_chrome_trace(renamed)  # gzip content sniffed
    text = tmp_path / "trace.txt"
    text.write_text(json.dumps(synthetic_trace([])))
    assert is_chrome_trace(text)
    sqlite = tmp_path / "run.sqlite"
    sqlite.write_bytes(b"SQLite format 3\x00" + bytes(100))
    assert not is_chrome_trace(sqlite)
    assert not is_chrome_trace(tmp_path / "missing.sqlite")
    other = tmp_path / "notes.txt"
    other.write_text('{"results": []}')
    assert not is_chrome_trace(other)


# ------------------------------------------------------------ the real GPU fixture, if any


@pytest.mark.skipif(not GPU_FIXTURE.exists(), reason="GPU fixture not captured yet")
def test_real_gpu_trace_matches_independent_counts() -> None:
    """Golden numbers computed with the stdlib json module and exact decimals by
    benchmarks/gpu_torch.sh on the GPU machine, beside the fixture."""
    expected = json.loads(
        GPU_FIXTURE.with_name(GPU_FIXTURE.name.replace(".json.gz", ".expected.json")).read_text()
    )
    trace = read_chrome_columns(GPU_FIXTURE)
    k = pd.DataFrame({name: column(trace, name)
                      for name in ("kind", "duration", "launch_start", "launch_thread")})  # fmt: skip
    assert k["kind"].value_counts().to_dict() == expected["activities_by_kind"]
    assert int(k["duration"].sum()) == expected["gpu_time_ns"]
    assert int((k["launch_start"] >= 0).sum()) == expected["activities_with_launch"]
    assert trace.ranges["name"].value_counts().to_dict() == expected["ranges"]

    def launched_in(phase: str) -> tuple[pd.DataFrame, int]:
        r = trace.ranges[trace.ranges["name"] == phase].iloc[0]
        return k[(k["launch_start"] >= r["start"]) & (k["launch_start"] < r["end"])], r["thread"]

    # Launch calls and ranges share one thread-id space: forward launches on its thread...
    forward, main = launched_in("forward")
    assert len(forward) > 0 and (forward["launch_thread"] == main).all()
    # ...and the reason for the attribution rule: backward kernels come from another one.
    backward, main = launched_in("backward")
    assert (backward["launch_thread"] != main).mean() > 0.9


def test_kernels_cli_attributes_autograd_launches_to_backward(tmp_path: Path) -> None:
    """SYNTHETIC trace through `profkit kernels`: the same analysis as for nsys exports."""
    from typer.testing import CliRunner

    from profkit.cli import app

    path = write(tmp_path, synthetic_trace(synthetic_step()), "step.json.gz")
    result = CliRunner().invoke(app, ["kernels", str(path), "-f", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    phases = {p["phase"]: (p["kernels"], round(p["gpu_time_ms"], 6)) for p in report["phases"]}
    assert phases["forward"] == (1, 0.025125)
    assert phases["backward"] == (2, 0.0645)  # both launched from pt_autograd_0
    assert report["source"]["format"] == "chrome"


def test_kernels_cli_on_a_cpu_trace_shows_ranges_and_says_why_no_kernels(cpu_trace: Path) -> None:
    from typer.testing import CliRunner

    from profkit.cli import app

    result = CliRunner().invoke(app, ["kernels", str(cpu_trace)])
    assert result.exit_code == 0, result.output
    assert "no GPU activities" in result.stdout and "computing softmax" in result.stdout
    assert "Top" not in result.stdout  # no empty kernel tables
    assert "no GPU kernels were recorded" in result.stdout
