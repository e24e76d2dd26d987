"""Several ranks: NCCL interval arithmetic, per-rank reading, and real torchrun launches.

The torchrun tests start real ``torch.distributed.run`` process groups over gloo on the
tiny model (CPU). Real 2-GPU fixtures (an nsys export of two ranks, per-rank torch
traces) are checked against plain SQL / plain JSON in ``test_multi_gpu_fixtures``.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from nsys_data import Export
from synthetic import columns_from_tables, report, report_of_columns
from typer.testing import CliRunner

from profkit.analysis.comm import (
    Intervals,
    both_covered_ns,
    collective,
    comm_stats_apart,
    covered_ns,
    is_nccl,
)
from profkit.analysis.report_types import RankedReport
from profkit.cli import app
from profkit.errors import BadInput
from profkit.run import bench as bench_lib
from profkit.run import torchrun
from profkit.run.child import run_child
from profkit.run.proc import descendants
from profkit.traces.columns import ActivityColumns
from profkit.workload.config import WorkloadConfig

TINY = {"size": "tiny", "ctx": 32, "device": "cpu", "warmup": 1, "steps": 2}


def torch_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


runner = CliRunner()


# --- interval arithmetic --------------------------------------------------------------


def _brute_cover(intervals: list[tuple[int, int]], horizon: int) -> np.ndarray:
    covered = np.zeros(horizon, dtype=bool)
    for start, end in intervals:
        covered[start:end] = True
    return covered


def test_union_and_intersection_match_a_time_grid() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        a = np.sort(rng.integers(0, 60, size=(rng.integers(0, 8), 2)), axis=1)
        b = np.sort(rng.integers(0, 60, size=(rng.integers(0, 8), 2)), axis=1)
        grid_a = _brute_cover([tuple(x) for x in a], 64)
        grid_b = _brute_cover([tuple(x) for x in b], 64)
        assert covered_ns(a[:, 0], a[:, 1]) == int(grid_a.sum())
        assert both_covered_ns(a[:, 0], a[:, 1], b[:, 0], b[:, 1]) == int((grid_a & grid_b).sum())


def test_intervals_that_end_before_they_start_cover_nothing() -> None:
    """As on a time grid: a reversed interval (a clock glitch) neither covers nor uncovers."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        a = rng.integers(0, 60, size=(rng.integers(0, 10), 2))  # some end before they start
        b = rng.integers(0, 60, size=(rng.integers(0, 10), 2))
        grid_a = _brute_cover([tuple(x) for x in a], 64)
        grid_b = _brute_cover([tuple(x) for x in b], 64)
        assert covered_ns(a[:, 0], a[:, 1]) == int(grid_a.sum())
        assert both_covered_ns(a[:, 0], a[:, 1], b[:, 0], b[:, 1]) == int((grid_a & grid_b).sum())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "AllReduce"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllReduce"),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "ReduceScatter"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllGather"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)", "Broadcast"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "SendRecv"),
        ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", "AllReduce"),
        ("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", "Other"),
    ],
)  # fmt: skip
def test_collectives_of_every_naming_generation(name: str, expected: str) -> None:
    assert is_nccl(np.array([name])).tolist() == [True]
    assert collective(name) == expected


def test_gemm_is_not_nccl() -> None:
    assert is_nccl(
        np.array(["sm90_xmma_gemm_f32f32", "[CUDA memcpy Device-to-Device]"])
    ).tolist() == [False, False]


# --- per-rank analysis on a two-process trace -----------------------------------------


def _two_ranks_tables(slow_rank: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two processes, three steps each; rank ``slow_rank``'s compute runs 50 µs longer:
    the kernels table and the ranges table."""
    kernels, ranges = [], []
    for rank in range(2):
        pid = 1000 + rank
        main, worker = (pid << 24) | pid, (pid << 24) | (pid + 1)
        for step in range(3):
            t = step * 1_000_000
            for name, lo, hi in (
                ("forward", 0, 200),
                ("backward", 200, 600),
                ("optimizer", 600, 700),
            ):
                ranges.append(
                    dict(
                        name=name,
                        start=t + lo * 1000,
                        end=t + hi * 1000,
                        thread=main,
                        depth=0,
                        domain="",
                    )
                )
            late = 50_000 if rank == slow_rank else 0
            nccl_start = t + 350_000 + late  # the slow rank joins the all-reduce late
            rows = [
                ("sm90_gemm_a", "kernel", t + 10_000, t + 100_000 + late, main, t + 1_000),
                ("sm90_gemm_b", "kernel", t + 250_000, t + 400_000 + late, worker, t + 210_000),
                ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", "kernel", nccl_start, t + 500_000 + late, worker, t + 300_000),
                ("[CUDA memcpy Device-to-Device]", "memcpy", t + 480_000, t + 520_000, main, t + 300_000),
                ("multi_tensor_apply_kernel", "kernel", t + 610_000, t + 650_000 + late, main, t + 601_000),
            ]  # fmt: skip
            for name, kind, start, end, thread, launch in rows:
                kernels.append(dict(name=name, short_name=name, kind=kind, start=start, end=end,
                                    device=rank, stream=7, correlation_id=len(kernels), grid="",
                                    block="", launch_start=launch, launch_thread=thread))  # fmt: skip
    return pd.DataFrame(kernels), pd.DataFrame(ranges)


def _two_ranks(slow_rank: int = 1) -> ActivityColumns:
    """:func:`_two_ranks_tables` as one two-process file's columns, GPU starts and devices
    kept (an nsys export of a torchrun tree)."""
    kernels, ranges = _two_ranks_tables(slow_rank)
    meta = {"path": "two-ranks", "format": "nsys-sqlite"}
    return columns_from_tables(kernels, ranges, meta, timed=True)


def _ranked(cols: ActivityColumns, **options: object) -> RankedReport:
    got = report_of_columns([cols], **options)
    assert isinstance(got, RankedReport)
    return got


def test_each_rank_reports_its_own_nccl_overlap_and_exposed_time() -> None:
    ranks = _ranked(_two_ranks()).to_json()["ranks"]
    assert [(r["rank"], r["device"], r["pid"]) for r in ranks] == [(0, 0, 1000), (1, 1, 1001)]
    # rank 0: NCCL [350, 500) µs per step against compute [250, 400): 50 µs hidden, 100 µs
    # exposed; the memcpy [480, 520) is not compute.
    assert ranks[0]["comm"] == {
        "kernels": 3, "time_ms": 0.45, "overlapped_ms": 0.15, "exposed_ms": 0.3,
        "by_collective": [{"collective": "AllReduce", "kernels": 3, "time_ms": 0.45}],
    }  # fmt: skip
    # rank 1: NCCL [400, 550) against compute [250, 450): 50 µs hidden, 100 exposed.
    assert ranks[1]["comm"]["overlapped_ms"] == 0.15
    assert ranks[1]["comm"]["exposed_ms"] == 0.3
    assert [r["kernels"] for r in ranks] == [12, 12]  # the memcpys are not kernels
    assert [p["kernels"] for p in ranks[0]["phases"]] == [3, 6, 3]  # backward: 3 memcpy apart


def test_the_job_names_the_slow_rank_and_the_time_the_fast_one_waits() -> None:
    job = _ranked(_two_ranks(slow_rank=1)).to_json()["job"]
    assert job["world_size"] == 2
    assert job["slowest_rank"] == 1
    # Step span: rank 0 [10, 650) µs, rank 1 [10, 700) µs -> spread 50 µs.
    assert [(s["slowest_rank"], s["slowest_ms"], s["fastest_ms"]) for s in job["steps"]] == [
        (1, 0.69, 0.64)
    ] * 3
    assert [s["spread_ms"] for s in job["steps"]] == pytest.approx([0.05] * 3)
    # Rank 0 starts each all-reduce 50 µs before rank 1 joins: 50 µs waiting per step.
    assert [s["nccl_wait_ms"] for s in job["steps"]] == [{"0": 0.05, "1": 0.0}] * 3


def test_rank_narrows_the_tables_to_one_rank() -> None:
    one = _ranked(_two_ranks(), rank=1)
    assert [e.info["rank"] for e in one.ranks] == [1]
    assert one.totals["kernels"] == 12  # that rank's kernels alone (15 activities)
    assert one.totals["kernels"] + one.totals["memcpy"] + one.totals["memset"] == 15
    with pytest.raises(BadInput, match="no rank 4 in this trace; ranks: 0, 1"):
        report_of_columns([_two_ranks()], rank=4)


def test_a_multi_process_nsys_export_is_read_per_process(tmp_path: Path) -> None:
    export = Export(tmp_path / "two.sqlite")
    for pid in (100, 200):
        main = (1 << 48) | (pid << 24) | pid
        export.range("forward", 0, 1_000, thread=main)
        export.kernel("sm90_gemm", 2_000, 100, launch_at=100, thread=main, pid=pid)
        export.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 2_050, 200, launch_at=200, thread=main, pid=pid)  # fmt: skip
    got = report(export.save())
    assert isinstance(got, RankedReport)  # several processes: ranked
    ranks = got.to_json()["ranks"]
    assert [(r["pid"], r["kernels"]) for r in ranks] == [(100, 2), (200, 2)]
    # NCCL [2050, 2250) against the gemm [2000, 2100): 50 ns hidden, 150 exposed.
    assert [(r["comm"]["overlapped_ms"], r["comm"]["exposed_ms"]) for r in ranks] == [
        (0.00005, 0.00015)
    ] * 2


def test_single_process_output_has_no_ranks(data_dir: Path) -> None:
    result = runner.invoke(
        app, ["kernels", str(data_dir / "torch-small-ctx128-train.json.gz"), "-f", "json"]
    )
    assert result.exit_code == 0, result.output
    assert "ranks" not in json.loads(result.stdout)


def test_rank_of_one_ranks_trace_says_to_give_every_ranks(data_dir: Path) -> None:
    """One rank's trace of a 2-rank run, alone, has no other rank to pick: the error says
    which rank the file is and how to give them all; a one-GPU trace says --rank needs ranks."""
    rank0 = data_dir / "torch-h200x2-small-ddp2-rank0.json.gz"
    result = runner.invoke(app, ["kernels", str(rank0), "--rank", "1"])
    assert result.exit_code == 2
    assert (
        f"error: {rank0.name} is rank 0 of a 2-rank run alone: give every rank's trace"
        in result.output
    )
    one = data_dir / "torch-small-ctx128-train.json.gz"
    result = runner.invoke(app, ["kernels", str(one), "--rank", "0"])
    assert result.exit_code == 2
    assert "error: --rank needs a multi-rank trace" in result.output


def test_comm_stats_measure_each_device_apart() -> None:
    k, _ = _two_ranks_tables()  # both ranks' rows: the devices must not mix
    kernel = (k["kind"] == "kernel").to_numpy()
    nccl = kernel & is_nccl(k["name"])

    def intervals(rows: np.ndarray) -> Intervals:
        return Intervals(*(k[c].to_numpy(np.int64)[rows] for c in ("start", "end", "device")))

    stats = comm_stats_apart(intervals(nccl), intervals(kernel & ~nccl), k["name"][nccl].to_numpy())
    assert (stats.kernels, stats.overlapped_ms, stats.exposed_ms) == (6, 0.3, 0.6)


# --- the launch ------------------------------------------------------------------------


def test_children_keep_multicast_off_unless_the_user_set_it() -> None:
    from profkit.run.proc import child_env

    env = child_env({"NCCL_NVLS_ENABLE": "1", "PATH": "/bin"})
    assert env["NCCL_NVLS_ENABLE"] == "1"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"


def test_more_ranks_than_gpus_is_one_line() -> None:
    import torch

    found = torch.cuda.device_count()
    asked = found + 2
    with pytest.raises(
        BadInput, match=f"--nproc {asked} needs {asked} GPUs; this machine has {found}"
    ):
        torchrun.check_nproc(WorkloadConfig(size="tiny", nproc=asked), "cuda")


def test_the_job_step_is_the_slowest_ranks() -> None:
    config = WorkloadConfig(size="tiny", nproc=2)
    fast = {"forward_ms": 1.0, "backward_ms": 2.0, "optimizer_ms": 1.0}
    slow = {"forward_ms": 2.0, "backward_ms": 2.5, "optimizer_ms": 1.0}
    results = [
        {"status": "ok", "error": None, "steps": [fast, slow], "peak_memory_bytes": 10},
        {"status": "ok", "error": None, "steps": [slow, fast], "peak_memory_bytes": 30},
    ]
    merged = torchrun.merge_results(config, results, {"status": "error", "error": "x"})
    assert merged["steps"] == [slow, slow]
    assert merged["peak_memory_bytes"] == 30
    assert merged["status"] == "ok"
    merged = torchrun.merge_results(
        config, [results[0], None], {"status": "error", "error": "killed"}
    )
    assert (merged["status"], merged["error"]) == (
        "error",
        "rank 1: rank 1 wrote no result: killed",
    )
    # Every rank failed, one torn down before it could write: the job names the cause.
    failed = {"status": "error", "error": "MissingTool: no CUDA", "steps": []}
    merged = torchrun.merge_results(config, [None, failed], {"status": "error", "error": "x"})
    assert merged["error"] == "rank 1: MissingTool: no CUDA"
    merged = torchrun.merge_results(config, [failed, dict(failed)], {"status": "error"})
    assert merged["error"] == "rank 0: MissingTool: no CUDA"  # the lowest rank of equals


def test_bench_two_gloo_ranks_make_one_row(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    result = runner.invoke(
        app,
        ["bench", "--size", "tiny", "--ctx", "32", "--device", "cpu", "--warmup", "1", "--steps", "2",
         "--nproc", "2", "--parallel", "ddp", "fsdp", "--db", str(db), "-f", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["nproc"], r["parallel"], r["status"]) for r in rows] == [
        (2, "ddp", "ok"),
        (2, "fsdp", "ok"),
    ]
    for row in rows:
        assert row["tokens_per_s"] == pytest.approx(2 * 4 * 32 / (row["step_ms"] / 1e3))
        assert [r["rank"] for r in row["ranks"]] == [0, 1]
    stored = bench_lib.load(db)  # the ranks survive the results DB
    assert [[r["rank"] for r in row["ranks"]] for row in stored] == [[0, 1], [0, 1]]


def _windows(events: list[dict], name: str) -> list[tuple[float, float]]:
    return [(e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("cat") == "user_annotation" and e.get("name") == name]  # fmt: skip


def test_torch_writes_one_trace_per_rank_and_kernels_reads_them_as_ranks(tmp_path: Path) -> None:
    """Each rank steps torch.profiler on the one-GPU path's schedule: the last warm-up step
    is the profiler's own (traced, dropped), so exactly the timed steps are recorded, each
    a ProfilerStep window holding one forward."""
    result = runner.invoke(
        app,
        ["torch", "--size", "tiny", "--ctx", "32", "--device", "cpu", "--warmup", "2",
         "--steps", "3", "--nproc", "2", "--out-dir", str(tmp_path), "-f", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    traces = sorted(tmp_path.glob("*-rank*.json.gz"))
    assert [t.name for t in traces] == [
        "torch-tiny-ctx32-ddp2-train-rank0.json.gz",
        "torch-tiny-ctx32-ddp2-train-rank1.json.gz",
    ]
    read = runner.invoke(app, ["kernels", *map(str, traces), "-f", "json"])
    assert read.exit_code == 0, read.output
    ranks = json.loads(read.stdout)["ranks"]
    for trace, entry in zip(traces, ranks, strict=True):
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        pid = next(e["pid"] for e in doc["traceEvents"]
                   if e.get("name") == "process_labels" and e["args"].get("labels") == "CPU")  # fmt: skip
        steps = [
            (e["name"], e["ts"], e["ts"] + e["dur"])
            for e in doc["traceEvents"]
            if str(e.get("name", "")).startswith("ProfilerStep#")
        ]
        forwards = _windows(doc["traceEvents"], "forward")
        assert (entry["rank"], entry["pid"]) == (doc["distributedInfo"]["rank"], pid)
        assert doc["distributedInfo"]["world_size"] == 2
        phases = {p["phase"]: p for p in entry["phases"]}
        assert len(steps) == len(forwards) == 3 and set(phases) == {
            "forward",
            "backward",
            "optimizer",
        }
        # Steps 0 and 1 are warm-up (1 the profiler's, dropped): the windows are steps 2-4.
        assert [name for name, _, _ in steps] == [
            "ProfilerStep#2",
            "ProfilerStep#3",
            "ProfilerStep#4",
        ]
        for begin, end in forwards:
            assert sum(lo <= begin and end <= hi for _, lo, hi in steps) == 1
    narrowed = runner.invoke(app, ["kernels", *map(str, traces), "--rank", "1", "-f", "json"])
    assert [r["rank"] for r in json.loads(narrowed.stdout)["ranks"]] == [1]
    # The report beside the traces: the run, then the kernel report of the ranks (the same
    # numbers as `profkit kernels` on the traces: the per-rank table's kernel counts).
    report = (tmp_path / "torch-tiny-ctx32-ddp2.md").read_text()
    assert report.startswith("# torch.profiler: tiny, ctx 32, fp32 (torch-tiny-ctx32-ddp2)\n")
    assert "ddp over 2 ranks, device cpu" in report and "3 profiled on every rank" in report
    assert (  # the run as a sentence says it: no "compile False", no "threads None"
        "Run: size tiny, ctx 32, batch 4, mode train, dtype fp32, compile no, attention naive, "
        "warmup 2, steps 3, nproc 2, parallel ddp." in report
    )
    assert all(f"`{t}`" in report for t in traces)
    assert "## Ranks" in report
    assert report.count("no GPU kernels were recorded") == 1  # both ranks say it: once
    for entry in ranks:
        assert f"| {entry['rank']} |" in report and f"{entry['kernels']:,}" in report
    assert result.stderr.rstrip().endswith(f"{tmp_path / 'torch-tiny-ctx32-ddp2.md'}")


def test_torch_ranks_refuse_the_one_process_table_options(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["torch", "--size", "tiny", "--device", "cpu", "--nproc", "2", "--record-shapes",
         "--sort", "cpu_time", "--out-dir", str(tmp_path / "out")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --record-shapes, --sort: torch.profiler's table of one process; with --nproc 2 "
        "each rank writes a Chrome trace and profkit reads them as ranks, so leave it out\n"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch_cuda(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize(
    ("extra", "message"),
    [([], "memory snapshots need a CUDA device"), (["--device", "cpu"], "CUDA caching allocator")],
)
def test_memory_on_two_cpu_ranks_is_one_line_before_torchrun(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    """Snapshots record the CUDA caching allocator: a CPU run has none, so `memory --nproc 2`
    stops in the parent, before torchrun starts, and writes nothing."""
    out_dir, db = tmp_path / "out", tmp_path / "results.db"
    result = runner.invoke(
        app,
        ["memory", "--size", "tiny", "--ctx", "32", "--nproc", "2", *extra,
         "--out-dir", str(out_dir), "--db", str(db)],
    )  # fmt: skip
    assert result.exit_code == 2
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output and result.stdout == ""
    assert not out_dir.exists() and not db.exists()


@pytest.mark.skipif(torch_cuda(), reason="the ranks fail for want of CUDA only without it")
def test_memory_ranks_that_cannot_record_end_as_one_error_result(tmp_path: Path) -> None:
    """The same capture inside the ranks (torchrun over gloo, as a caller that skips the
    parent's check would start it): each rank fails before building the model, writes its
    result, and the group ends as one error result; no snapshot, no rank left behind."""
    config = WorkloadConfig(**TINY, nproc=2)
    snapshot = tmp_path / "memory.pickle"
    got = run_child(config, "memory", timeout_s=180, capture_options={"snapshot": str(snapshot)})
    assert got["status"] == "error"
    # torchrun tears the other rank down when one fails, so on a loaded machine one rank
    # may die before writing: the job's error is then the other's, which said why.
    assert re.match(r"rank [01]: MissingTool: memory snapshots need a CUDA", str(got["error"]))
    ranks = got["ranks"]
    assert [(r["rank"], r["status"]) for r in ranks] == [(0, "error"), (1, "error")]
    assert list(tmp_path.iterdir()) == []  # neither memory-rank0.pickle nor -rank1
    assert _rank_process(0) is None and _rank_process(1) is None


def _rank_process(rank: int) -> int | None:
    for pid in descendants(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"profkit.run.child" in cmdline and f"RANK={rank}".encode() in environ and b"torch.distributed.run" not in cmdline:  # fmt: skip
            return pid
    return None


def test_a_killed_rank_ends_the_group_and_becomes_an_error_result() -> None:
    config = WorkloadConfig(**{**TINY, "steps": 400}, nproc=2)
    got: dict[str, object] = {}
    thread = threading.Thread(target=lambda: got.update(run_child(config, timeout_s=180)))
    thread.start()
    deadline = time.monotonic() + 120
    victim = None
    while victim is None and time.monotonic() < deadline:
        time.sleep(0.5)
        victim = _rank_process(1)
    assert victim is not None, "rank 1 never started"
    time.sleep(3)  # let it reach the steps (the process group is up)
    os.kill(victim, signal.SIGKILL)
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert got["status"] == "error"
    assert str(got["error"]).startswith("rank ")
    ranks = got["ranks"]
    assert isinstance(ranks, list) and [r["rank"] for r in ranks] == [0, 1]
    assert ranks[1]["status"] == "error"
    assert _rank_process(0) is None  # no rank left behind


def test_plot_draws_the_ranks_of_a_two_process_export(tmp_path: Path, data_dir: Path) -> None:
    export = Export(tmp_path / "two.sqlite")
    for pid in (100, 200):
        main = (1 << 48) | (pid << 24) | pid
        for step in range(2):
            t = step * 10_000
            export.range("forward", t, t + 1_000, thread=main)
            export.range("backward", t + 1_000, t + 5_000, thread=main)
            export.kernel("sm90_gemm", t + 2_000, 1_000, launch_at=t + 100, thread=main, pid=pid)
            export.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", t + 2_500, 2_000,
                          launch_at=t + 1_200, thread=main, pid=pid)  # fmt: skip
    sqlite_path = export.save()
    png = tmp_path / "ranks.png"
    result = runner.invoke(app, ["kernels", str(sqlite_path), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    single = runner.invoke(
        app, ["kernels", str(data_dir / "torch-small-ctx128-train.json.gz"), "--plot", str(png)]
    )
    assert single.exit_code == 2
    assert "--plot draws the ranks of a multi-GPU trace" in single.output


def test_the_driver_probe_counts_what_torch_counts() -> None:
    # The parent asks the driver, not torch (seconds of import saved); both must agree, on a
    # machine without CUDA (0) and on the GPU machine alike.
    import torch

    from profkit.workload import cuda

    assert cuda.device_count() == torch.cuda.device_count()


def test_the_driver_probe_honours_cuda_visible_devices() -> None:
    code = "from profkit.workload.cuda import device_count; print(device_count())"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


def test_python_ms_of_one_rank_is_not_shown_beside_every_ranks_ranges(data_dir: Path) -> None:
    """A 2-rank run's sidecar times rank 0's phases only, while the trace's phases table
    sums both ranks' ranges (instances 6 for 3 steps): no python_ms there. A one-process
    run keeps it."""
    from profkit.analysis import display_tables, kernel_report
    from profkit.traces.job import load

    two = kernel_report(load([data_dir / "nsys-2025.3-h200x2-small-ddp2.sqlite.xz"]))
    phases = display_tables(two)[0][1]
    assert list(phases["instances"]) == [6, 6, 6] and "python_ms" not in phases
    one = kernel_report(load([data_dir / "nsys-2025.3-h100-small-fp32.sqlite.xz"]))
    one = display_tables(one)[0][1]
    assert "python_ms" in one and one["python_ms"].notna().all()


def _ranks_table(paths: list[Path]) -> pd.DataFrame:
    """The CLI's ranks table (the first of ``--format csv``'s tables)."""
    import io

    result = runner.invoke(app, ["kernels", *map(str, paths), "--format", "csv", "--no-cache"])
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(io.StringIO(result.stdout))
    return rows[rows["table"] == rows["table"].iloc[0]].dropna(axis=1, how="all")


def test_the_ranks_table_names_hosts_only_where_ranks_span_several(
    data_dir: Path, tmp_path: Path
) -> None:
    one_host = _ranks_table([data_dir / "nsys-2025.3-h200x2-small-ddp2.sqlite.xz"])
    assert "host" not in one_host  # one host: its name adds nothing
    paths = []
    for rank in (0, 1):  # the per-rank traces, rank 1 said to be on another host
        doc = json.loads(gzip.decompress(
            (data_dir / f"torch-h200x2-small-ddp2-rank{rank}.json.gz").read_bytes()))  # fmt: skip
        if rank == 1:
            doc["profkit"]["host"] = "node1"
        paths.append(tmp_path / f"run-rank{rank}.json.gz")
        paths[-1].write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    table = _ranks_table(paths)
    assert list(table.columns[1:5]) == ["rank", "host", "device", "pid"]
    assert table["host"].iloc[1] == "node1" and table["host"].iloc[0] != "node1"


def test_ranks_of_different_runs_are_one_clear_error(data_dir: Path, tmp_path: Path) -> None:
    """A run of 3 ranks left rank 2 beside a later run of 2 (same names): the glob gives
    three traces of two runs, which must not read as one job of world size 3."""
    rank0 = data_dir / "torch-h200x2-small-ddp2-rank0.json.gz"
    rank1 = data_dir / "torch-h200x2-small-ddp2-rank1.json.gz"
    doc = json.loads(gzip.decompress(rank1.read_bytes()))
    doc["distributedInfo"] = {**doc["distributedInfo"], "rank": 2, "world_size": 3}
    stale = tmp_path / "torch-h200x2-small-ddp2-rank2.json.gz"
    stale.write_bytes(gzip.compress(json.dumps(doc).encode()))
    result = runner.invoke(app, ["kernels", str(rank0), str(rank1), str(stale)])
    assert result.exit_code == 2
    assert "these traces come from runs of different world sizes (2, 3)" in result.output
    doc["distributedInfo"]["world_size"] = 2
    stale.write_bytes(gzip.compress(json.dumps(doc).encode()))
    result = runner.invoke(app, ["kernels", str(rank0), str(rank1), str(stale)])
    assert result.exit_code == 2  # the stale header contradicts itself: refused as it is read
    assert "distributedInfo says rank 2 of a world of 2: not one run's rank" in result.output
