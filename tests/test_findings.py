"""Findings on the real plant captures (examples/plants.py, tests/data/frameworks/manifest-*.json):
the planted problem is found at its planted size, the same program without it is not."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from profkit import analysis
from profkit.analysis.findings.host import host_findings
from profkit.cli import app
from profkit.traces.host_calls import HostTrace, call_kind, host_traces
from profkit.traces.job import load

DATA = Path(__file__).parent / "data"
FW = DATA / "frameworks"
KINDS = {"host_idle", "host_sync", "launch_bound", "unfused_optimizer", "exposed_comm",
         "straggler", "fp32_gemm", "pageable_copy"}  # fmt: skip
runner = CliRunner()
# "sqlite" rather than "nsys" in the test ids: conftest skips tests marked "nsys" where the
# nsys program is absent, and these read committed exports only
BACKENDS = ["sqlite", "torch"]


def _files(plant: str, backend: str) -> list[Path]:
    if plant in ("ddp2", "straggler2"):
        if backend == "sqlite":
            return [FW / f"nsys-2025.3-h200x2-plants-{plant}.sqlite.xz"]
        return [FW / f"torch-h200x2-plants-{plant}-rank{r}.json.gz" for r in (0, 1)]
    if backend == "sqlite":
        return [FW / f"nsys-2025.3-h100-plants-{plant}.sqlite.xz"]
    return [FW / f"torch-h100-plants-{plant}-rank0.json.gz"]


@functools.cache
def _report(*paths: Path) -> analysis.KernelReport:
    job = load(list(paths))
    return analysis.kernel_report(job, top=0, hosts=host_traces(job.paths, job.files))


def findings(plant: str, backend: str) -> list[dict[str, Any]]:
    found = _report(*_files(plant, backend)).findings
    assert found is not None
    return found


def of_kind(found: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [f for f in found if f["kind"] == kind]


def planted(plant: str, backend: str) -> dict[str, Any]:
    """What the capture's program printed (its manifest entry)."""
    manifest = "manifest-h200x2.json" if plant.endswith("2") else "manifest-h100.json"
    for entry in json.loads((FW / manifest).read_text()):
        kind = "nsys" if backend == "sqlite" else backend
        if entry["name"] == f"plants-{plant}" and entry["kind"] == kind:
            return dict(entry["printed"][0])
    raise KeyError(plant)


def near(value: float, truth: float, within: float = 0.20) -> bool:
    return abs(value - truth) <= within * truth


@pytest.mark.parametrize("backend", BACKENDS)
def test_sleep_is_host_idle_before_forward(backend: str) -> None:
    truth = planted("sleep", backend)
    (idle,) = of_kind(findings("sleep", backend), "host_idle")
    # all three sleeps lie in the capture (nsys: after cudaProfilerStart; torch: its window)
    assert near(idle["recoverable_ms"], truth["sleep_ms"] * truth["steps"])
    assert idle["evidence"]["where"] == "before forward" and idle["phase"] == "forward"
    assert idle["evidence"]["count"] == truth["steps"] and idle["evidence"]["rows"]
    assert not of_kind(findings("baseline", backend), "host_idle")


@pytest.mark.parametrize("backend", BACKENDS)
def test_syncs_are_counted_exactly(backend: str) -> None:
    truth = planted("sync", backend)["syncs"]["total"]
    (sync,) = of_kind(findings("sync", backend), "host_sync")
    assert sync["evidence"]["count"] == truth == 6
    assert len(sync["evidence"]["rows"]) == 6 and sync["recoverable_ms"] > 0
    assert sync["evidence"]["by_phase"] == {"forward": 3, "between phases": 3}  # .item(), .cpu()
    assert not of_kind(findings("baseline", backend), "host_sync")


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_model_is_launch_bound(backend: str) -> None:
    (tiny,) = of_kind(findings("tiny", backend), "launch_bound")
    assert tiny["severity"] == "high" and tiny["evidence"]["busy_share"] < 0.10
    ev = tiny["evidence"]
    assert ev["kernel_us"]["p50"] < ev["median_launch_interval_us"]
    # The baseline (d_model 256, batch 8) is itself launch-bound, busy ~10-14% of its span
    # (an expert would say so too); the tiny plant leaves the GPU idler still.
    (base,) = of_kind(findings("baseline", backend), "launch_bound")
    assert ev["busy_share"] < base["evidence"]["busy_share"]


def _optimizer_ms(report: analysis.KernelReport) -> float:
    rows = report.overall[report.overall["name"].str.contains("multi_tensor_apply")]
    return float(rows["total_ms"].sum())


@pytest.mark.parametrize("backend", BACKENDS)
def test_foreach_is_unfused_optimizer_at_its_cost(backend: str) -> None:
    (unfused,) = of_kind(findings("foreach", backend), "unfused_optimizer")
    # truth: the foreach step's optimizer kernels less the fused step's (baseline capture)
    truth = _optimizer_ms(_report(*_files("foreach", backend))) - _optimizer_ms(
        _report(*_files("baseline", backend))
    )
    assert near(unfused["recoverable_ms"], truth)
    assert unfused["phase"] == "optimizer" and unfused["evidence"]["count"] == 24
    assert not of_kind(findings("baseline", backend), "unfused_optimizer")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sleeping_rank_is_the_straggler(backend: str) -> None:
    truth = planted("straggler2", backend)
    found = findings("straggler2", backend)
    (strag,) = of_kind(found, "straggler")
    assert strag["rank"] == truth["sleep_ranks"][0] == 1
    assert strag["evidence"]["count"] == 3
    (idle,) = of_kind(found, "host_idle")
    assert idle["rank"] == 1 and idle["evidence"]["where"] == "before forward"
    # nsys captures all three sleeps; torch.profiler's window opens after the first one
    # (its first forward range starts before the window), so two are in it
    sleeps = truth["sleeps_per_rank"] if backend == "sqlite" else truth["sleeps_per_rank"] - 1
    assert near(strag["recoverable_ms"], truth["sleep_ms"] * sleeps)
    assert near(idle["recoverable_ms"], truth["sleep_ms"] * sleeps)
    assert not of_kind(findings("ddp2", backend), "straggler")
    assert not [f for f in findings("ddp2", backend) if f["kind"] == "host_idle"]


def _all_fixtures() -> list[list[Path]]:
    singles = sorted(p for p in DATA.glob("*.sqlite.xz") if "no-kernels" not in p.name)
    singles += [DATA / "torch-h200-unannotated-train.json.gz",
                DATA / "torch-small-ctx128-train.json.gz",
                DATA / "torch-small-ctx128-forward.json.gz"]  # fmt: skip
    singles += sorted(FW.glob("nsys-*.sqlite.xz")) + sorted(FW.glob("torch-h100-*.json.gz"))
    sets = [[p] for p in singles]
    sets.append([DATA / f"torch-h200x2-small-ddp2-rank{r}.json.gz" for r in (0, 1)])
    for stem in sorted({p.name.rsplit("-rank", 1)[0] for p in FW.glob("torch-h200x2-*.json.gz")}):
        sets.append(sorted(FW.glob(f"{stem}-rank*.json.gz")))
    return sets


@pytest.mark.parametrize("paths", _all_fixtures(), ids=lambda ps: ps[0].name)
def test_every_fixture_gives_sound_findings(paths: list[Path]) -> None:
    report = _report(*paths)
    found = report.findings
    assert found is not None
    assert [f["recoverable_ms"] for f in found] == sorted(
        (f["recoverable_ms"] for f in found), reverse=True
    )
    for f in found:
        assert f["kind"] in KINDS and f["severity"] in ("high", "medium", "low")
        assert f["recoverable_ms"] >= 0 and 0 <= f["share"] <= 1
        assert f["evidence"]["rows"] and "count" in f["evidence"]
        assert f["phase"] is None or f["phase"] in set(report.phases["phase"])
        assert f["advice"]
        if f["kind"] == "launch_bound":  # never on a GPU busy half its span or more
            assert f["evidence"]["busy_share"] < 0.5


def _trace(gpu: list[tuple[int, int]], calls: list[tuple[int, int, str]]) -> HostTrace:
    arr = functools.partial(np.array, dtype=np.int64)
    return HostTrace(
        "synthetic", arr([g[0] for g in gpu]), arr([g[1] for g in gpu]), arr([0] * len(gpu)),
        np.zeros(len(gpu), bool), np.full(len(gpu), -1, np.int8), arr([0] * len(gpu)),
        arr([c[0] for c in calls]), arr([c[1] for c in calls]),
        arr([0] * len(calls)), np.array([call_kind(c[2]) for c in calls], np.int8),
        np.array([c[2] for c in calls], object), bool(calls),
    )  # fmt: skip


def test_a_gpu_bound_run_has_no_host_finding() -> None:
    # 1,000 kernels of 100 µs back to back, each launched 10 µs apart long before it runs
    gpu = [(1_000_000 + i * 100_000, 1_000_000 + (i + 1) * 100_000) for i in range(1000)]
    calls = [(i * 10_000, i * 10_000 + 5_000, "cudaLaunchKernel") for i in range(1000)]
    ranges = pd.DataFrame({"name": ["forward"], "start": [0], "end": [101_000_000],
                           "thread": [0], "depth": [0], "domain": [""]})  # fmt: skip
    assert host_findings(_trace(gpu, calls), ranges, None, [], {"forward"}) == []


def test_a_trace_without_api_calls_says_so_once() -> None:
    gpu = [(0, 10), (1_000_000_000, 1_000_000_010)]
    notes: list[str] = []
    empty = pd.DataFrame(columns=["name", "start", "end", "thread", "depth", "domain"])
    assert host_findings(_trace(gpu, []), empty, None, notes, set()) == []
    assert len(notes) == 1 and "API calls" in notes[0]


def test_sync_calls_are_told_from_launches() -> None:
    assert call_kind("cudaStreamSynchronize_v3020") == 1
    assert call_kind("cudaMemcpy") == 1 and call_kind("cudaMemcpyAsync") == 0
    assert call_kind("cudaLaunchKernelExC_v11060") == 0 and call_kind("cuLaunchKernel") == 0
    assert call_kind("cudaGetDevice") == -1


def test_cli_findings_alone_and_first() -> None:
    path = str(_files("sync", "sqlite")[0])
    got = runner.invoke(app, ["kernels", path, "--findings", "-f", "json"])
    assert got.exit_code == 0, got.output
    found = json.loads(got.stdout)
    assert of_kind(found, "host_sync")[0]["evidence"]["count"] == 6
    whole = json.loads(runner.invoke(app, ["kernels", path, "-f", "json"]).stdout)
    assert whole["findings"] == found
    text = runner.invoke(app, ["kernels", path, "--findings"]).stdout
    assert "host_sync" in text and "6 syncs" in text
    table = runner.invoke(app, ["kernels", path, "-n", "1"]).stdout
    assert table.index("Findings") < table.index("Phases")
    csv = runner.invoke(app, ["kernels", path, "--findings", "-f", "csv"]).stdout
    assert csv.splitlines()[0] == "kind,severity,recoverable_ms,share,rank,phase,advice"
    assert len(csv.strip().splitlines()) == len(found) + 1
    md = runner.invoke(app, ["kernels", path, "-f", "md", "-n", "1"]).stdout
    assert md.index("## Findings") < md.index("## Phases")


def _ranked(waits: list[list[float]], exposed: list[float]) -> Any:
    """A stand-in for a ranked report: per step each rank's NCCL wait (10 ms steps), and
    each rank's exposed NCCL time."""
    from types import SimpleNamespace

    rows = [
        {"step": s, "rank": r, "step_ms": 10.0, "nccl_ms": 5.0, "nccl_wait_ms": w}
        for s, per_rank in enumerate(waits)
        for r, w in enumerate(per_rank)
    ]
    comm = [
        {"kernels": 4, "time_ms": 5.0, "overlapped_ms": 0.0, "exposed_ms": e, "by_collective": []}
        for e in exposed
    ]
    ranks = [
        SimpleNamespace(info={"rank": r}, comm=SimpleNamespace(to_json=lambda c=c: c))
        for r, c in enumerate(comm)
    ]
    from profkit.analysis.report_types import RankedReport

    empty = pd.DataFrame()
    return RankedReport(
        {}, {}, empty, empty, empty, empty, empty, ranks=ranks,  # type: ignore[arg-type]
        steps=pd.DataFrame(rows), world_size=len(exposed),
    )  # fmt: skip


def test_straggler_needs_the_same_rank_step_after_step() -> None:
    from profkit.analysis.findings.ranks import straggler

    (found,) = straggler(_ranked([[3.0, 0.0], [2.5, 0.0], [3.5, 0.0]], [1.0, 1.0]))
    assert found.rank == 1 and found.recoverable_ms == pytest.approx(9.0)
    # bounded by the straggler's own host idle where it has one
    (bounded,) = straggler(_ranked([[3.0, 0.0]] * 3, [1.0, 1.0]), {1: {"0": 1.0, "1": 1.0}})
    assert bounded.recoverable_ms == pytest.approx(2.0)
    assert straggler(_ranked([[3.0, 0.0], [0.0, 3.0], [3.0, 0.0], [0.0, 3.0]], [1, 1])) == []
    assert straggler(_ranked([[0.5, 0.0]] * 3, [1.0, 1.0])) == []  # 5% of the step
    assert straggler(_ranked([[3.0, 0.0]], [1.0, 1.0])) == []  # one step


def test_exposed_comm_is_transfer_not_waiting() -> None:
    from profkit.analysis.findings.ranks import exposed_comm

    # rank 0 waits 3 ms a step of its 5 exposed ms; rank 1 waits for nobody
    report = _ranked([[3.0, 0.0]] * 2, [10.0, 4.0])
    found = {f.rank: f for f in exposed_comm(report)}
    assert found[0].recoverable_ms == pytest.approx(4.0)
    assert found[1].recoverable_ms == pytest.approx(4.0)
    assert found[1].evidence["rows"] == [] and found[1].evidence["count"] == 4
    assert exposed_comm(_ranked([[0.0, 0.0]] * 2, [0.5, 0.5])) == []  # 2.5% of the steps


def test_a_chrome_trace_without_runtime_events_says_so(tmp_path: Path) -> None:
    import gzip

    doc = json.loads(gzip.decompress(_files("sleep", "torch")[0].read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cuda_runtime"]
    path = tmp_path / "no-runtime.json"
    path.write_text(json.dumps(doc))
    got = runner.invoke(app, ["kernels", str(path), "-f", "md", "-n", "1"])
    assert got.exit_code == 0, got.output
    assert "host_idle, host_sync and launch_bound need the CUDA API calls" in got.stdout
    assert got.stdout.count("need the CUDA API calls") == 1
    assert "## Findings" in got.stdout and "host_idle" not in got.stdout.split("## Phases")[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_lanes_mark_the_gaps_the_findings_attribute(backend: str, tmp_path: Path) -> None:
    from profkit.report.rank_plots import plot_ranks, step_gaps

    report = _report(*_files("straggler2", backend))
    found = {(f["kind"], f["rank"]): f for f in report.findings or []}
    idle = found[("host_idle", 1)]["evidence"]
    marked = report.gap_marks[1]
    assert (marked["cause"] == "idle").sum() == idle["count"]
    if ("launch_bound", 1) in found:  # torch: rank 1's launch gaps are marked too
        assert (marked["cause"] == "launch").sum() == found[("launch_bound", 1)]["evidence"][
            "count"
        ]
    assert set(report.gap_marks) == {r for _, r in found if r is not None}
    # per step, the idle the picture shades on rank 1 is the finding's idle of that step
    # (the sleep before forward: it ends at the step's first kernel, so it is the step's)
    for step in sorted(set(report.steps["step"])):
        gaps = step_gaps(report, step)[1]
        shaded = gaps[gaps["cause"] == "idle"]
        assert float((shaded["launch"] - shaded["start"]).sum()) / 1e6 == pytest.approx(
            idle["by_step_ms"][str(step)], abs=1e-6
        )
    assert plot_ranks(report, tmp_path / "lanes.png").stat().st_size > 0


def test_syncs_in_one_gap_drain_it_once() -> None:
    # two event syncs while the last kernel runs; the GPU idles 0.35 ms until the next launch
    gpu = [(0, 1_000_000), (1_350_000, 10_000_000)]
    calls = [(500_000, 1_000_000, "cudaEventSynchronize"),
             (995_000, 1_000_000, "cudaEventSynchronize"),
             (1_300_000, 1_305_000, "cudaLaunchKernel")]  # fmt: skip
    empty = pd.DataFrame(columns=["name", "start", "end", "thread", "depth", "domain"])
    (sync,) = host_findings(_trace(gpu, calls), empty, None, [], set())
    assert sync.kind == "host_sync" and sync.evidence["count"] == 2
    assert sync.recoverable_ms == pytest.approx(0.35)
    assert sync.gaps is not None and len(sync.gaps) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_host_calls_are_kept_with_the_cached_columns(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import profkit.traces.host_calls as host_calls

    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path))
    paths = _files("sync", backend)
    job = load(paths)
    (read,) = host_traces(job.paths, job.files)
    assert host_calls.KEPT_AS in job.files[0].derived

    def no_read(*_: Any) -> None:
        raise AssertionError("the trace was read again")

    monkeypatch.setattr(host_calls, "read_host_trace", no_read)
    again = load(paths)  # a repeated query: the columns and the host calls from the cache
    (kept,) = host_traces(again.paths, again.files)
    for name in ("gpu_start", "gpu_end", "gpu_pid", "gpu_nccl", "gpu_copy", "gpu_bytes",
                 "call_start", "call_end", "call_pid", "call_kind", "call_name"):  # fmt: skip
        assert np.array_equal(getattr(kept, name), getattr(read, name)), name
    assert (kept.path, kept.has_calls) == (read.path, read.has_calls)
    assert kept.gpu_nccl.dtype == bool and kept.call_kind.dtype == np.int8


@pytest.mark.parametrize("cache", [False, True])
def test_a_torch_trace_is_parsed_once_for_its_columns_and_findings(
    cache: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first read of a torch trace keeps what the findings read of its events, from
    the columns' own pass over the JSON: no second parse, with the cache or without, and
    the same host calls a pass of their own reads. Cached, they are in the entry."""
    import profkit.traces.host_calls as host_calls

    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path))
    paths = _files("ddp2", "torch")
    apart = [host_calls.read_host_trace(p, f.meta)
             for p, f in zip(paths, load(paths, cache=False).files, strict=True)]  # fmt: skip

    def no_read(*_: Any) -> None:
        raise AssertionError("the trace was parsed again")

    monkeypatch.setattr(host_calls, "read_host_trace", no_read)
    job = load(paths, cache=cache)
    kept = host_traces(job.paths, job.files)
    if cache:  # a repeated query: the columns and the host calls from the entry
        kept = host_traces(paths, load(paths).files)
    for read, host in zip(apart, kept, strict=True):
        for name in ("gpu_start", "gpu_end", "gpu_pid", "gpu_nccl", "gpu_copy", "gpu_bytes",
                     "call_start", "call_end", "call_pid", "call_kind", "call_name"):  # fmt: skip
            assert np.array_equal(getattr(host, name), getattr(read, name)), name
        assert (host.path, host.has_calls) == (read.path, read.has_calls)
        assert len(read.call_start) and len(read.gpu_start)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rank_option_keeps_the_straggler_of_all_ranks(backend: str) -> None:
    whole = {(f["kind"], f["rank"]): f for f in findings("straggler2", backend)}
    for shown in (0, 1):
        job = load(_files("straggler2", backend))
        report = analysis.kernel_report(
            job, top=0, rank=shown, hosts=host_traces(job.paths, job.files)
        )
        got = {(f["kind"], f["rank"]): f for f in report.findings or []}
        # rank 1's own host idle bounds the straggler's recoverable_ms, whichever rank is shown
        assert got[("straggler", 1)] == whole[("straggler", 1)]
        assert {r for k, r in got if k != "straggler"} - {None} <= {shown}
        assert set(report.gap_marks) <= {shown}
    assert ("host_idle", 1) in got


def _gemm_ms(report: analysis.KernelReport) -> float:
    table = report.overall
    return float(table.loc[table["category"] == "gemm", "total_ms"].sum())


def test_fp32_gemms_on_bf16_tensor_cores() -> None:
    fp32 = _report(DATA / "nsys-2025.3-h100-small-fp32.sqlite.xz")
    bf16 = _report(DATA / "nsys-2025.3-h100-small-bf16.sqlite.xz")
    (found,) = of_kind(fp32.findings or [], "fp32_gemm")
    assert not of_kind(bf16.findings or [], "fp32_gemm")
    ev = found["evidence"]
    assert ev["gpu"] == "NVIDIA H100 80GB HBM3" and ev["kernels"] == 14
    assert ev["peak_tflops"] == {"fp32": 66.9, "bf16": 989.4}
    assert found["recoverable_ms"] == pytest.approx(ev["time_ms"] * (1 - 66.9 / 989.4))
    assert found["phase"] == "backward" and all("f32" in r["name"] or "sgemm" in r["name"]
                                                for r in ev["rows"])  # fmt: skip
    # the same model and steps in bf16: its GEMMs took this much less
    truth = _gemm_ms(fp32) - _gemm_ms(bf16)
    assert near(found["recoverable_ms"], truth)
    # torch.profiler names the GPU in its deviceProperties
    (torch,) = of_kind(
        _report(DATA / "torch-small-ctx128-train.json.gz").findings or [], "fp32_gemm"
    )
    assert torch["evidence"]["kernels"] == 14


def test_fp32_gemms_on_an_unknown_gpu_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from profkit.analysis.findings.precision import fp32_gemm

    report = _report(DATA / "nsys-2025.3-h100-small-fp32.sqlite.xz")
    notes: list[str] = []
    assert fp32_gemm(report, None, notes) == [] and fp32_gemm(report, "NVIDIA T4", notes) == []
    assert len(notes) == 2 and "bf16 tensor cores" in notes[0]


def test_pageable_copies_inside_the_steps() -> None:
    # the export's CUPTI_ACTIVITY_KIND_MEMCPY: 3 host-to-device copies from pageable memory
    # (4 MiB each) and 6 device-to-host copies into it (a 4 MiB and a 4-byte one a step)
    report = _report(DATA / "nsys-2025.3-h100-cudagraph-node.sqlite.xz")
    (found,) = of_kind(report.findings or [], "pageable_copy")
    ev = found["evidence"]
    assert ev["count"] == 9 and ev["bytes"] == 12_582_912 + 12_582_924
    assert {d: v["count"] for d, v in ev["by_direction"].items()} == {
        "host-to-device": 3, "device-to-host": 6}  # fmt: skip
    assert found["recoverable_ms"] == pytest.approx(ev["time_ms"])
    assert {r["host_memory"] for r in ev["rows"]} == {"pageable"}
    # copies of a few bytes (.item()) are below the threshold
    assert not of_kind(findings("sync", "sqlite"), "pageable_copy")


def test_chrome_copies_are_read_by_their_names() -> None:
    from profkit.traces.host_trace import _chrome_copy

    assert _chrome_copy("Memcpy HtoD (Pageable -> Device)") == 8
    assert _chrome_copy("Memcpy DtoH (Device -> Pinned)") == 17
    assert _chrome_copy("Memcpy DtoD (Device -> Device)") == -1
    # both readers see the same copies of the sync plant (3 to pageable, 3 to pinned)
    for backend in BACKENDS:
        job = load(_files("sync", backend))
        (host,) = host_traces(job.paths, job.files)
        kept = host.gpu_copy[host.gpu_copy >= 0]
        assert sorted(kept.tolist()) == [16, 16, 16, 17, 17, 17]
        assert int(host.gpu_bytes.sum()) == 24


def test_ddp_transfers_are_short_and_overlapped_so_no_exposed_comm() -> None:
    from profkit.analysis.steps import job_summary

    # small (128M parameters) under DDP on 2 H200s over NVLink: each rank's NCCL time is
    # mostly waiting for the other; the transfer left (NCCL time less the wait, exposed or
    # not) is 2.6% of the 3 steps at most, under EXPOSED_MIN_SHARE (5%)
    report = _report(DATA / "nsys-2025.3-h200x2-small-ddp2.sqlite.xz")
    job = job_summary(report.steps, report.world_size)
    waits = {int(r["rank"]): r for r in job["ranks"]}
    for entry in report.ranks:
        comm, rank = entry.comm.to_json(), int(entry.info["rank"])
        transfer = comm["time_ms"] - waits[rank]["nccl_wait_ms"]
        steps_ms = waits[rank]["mean_step_ms"] * len(job["steps"])
        assert 0 < transfer < 0.03 * steps_ms
        assert comm["overlapped_ms"] > 0  # DDP's bucketed all-reduces overlap the backward
    assert not of_kind(report.findings or [], "exposed_comm")


def test_chrome_host_calls_streamed_or_whole_are_the_same(tmp_path: Path) -> None:
    import gzip

    from profkit.traces.host_calls import read_host_trace

    path = _files("sync", "torch")[0]
    meta = load([path]).files[0].meta
    streamed = read_host_trace(path, meta)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    array = tmp_path / "events-array.json"  # a top-level array: not streamed, read whole
    array.write_text(json.dumps(doc["traceEvents"]))
    whole = read_host_trace(array, meta)
    for name in ("gpu_start", "gpu_end", "gpu_copy", "gpu_bytes", "call_start", "call_kind"):
        assert np.array_equal(getattr(whole, name), getattr(streamed, name)), name
    assert len(streamed.call_start) and (streamed.call_kind == 1).sum() >= 6


def test_copies_without_memory_kinds_say_so_once(tmp_path: Path) -> None:
    import lzma
    import sqlite3

    path = tmp_path / "no-kinds.sqlite"
    path.write_bytes(
        lzma.decompress((DATA / "nsys-2025.3-h100-cudagraph-node.sqlite.xz").read_bytes())
    )
    with sqlite3.connect(path) as conn:  # an export that does not say which memory a copy used
        conn.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY DROP COLUMN srcKind")
    report = _report(path)
    assert not of_kind(report.findings or [], "pageable_copy")
    said = [n for n in report.notes if "pageable_copy needs" in n]
    assert len(said) == 1 and "srcKind/dstKind" in said[0]


def test_per_rank_traces_in_any_order_give_each_rank_its_findings() -> None:
    given = _files("straggler2", "torch")
    forward = findings("straggler2", "torch")
    reversed_ = _report(*reversed(given)).findings
    assert reversed_ == forward  # rank 1's host findings stay rank 1's


def test_a_node_job_finds_each_ranks_host_findings(tmp_path: Path) -> None:
    """Two nodes of one job (the HF DDP capture and a copy as another host's): each rank's
    host findings are its node's alone, numbered as the job's ranks (they once vanished:
    the job's ranks carried their merged process keys, not their pids)."""
    from bench_scripts import benchmark
    from nsys_data import unpack

    (tmp_path / "frameworks").mkdir()
    node0 = unpack("frameworks/nsys-2025.3-h200x2-hf-ddp2", tmp_path)
    node1 = benchmark("kernels_scale").another_node(node0, tmp_path / "node1.sqlite")

    def found(paths: list[Path]) -> list[dict[str, Any]]:
        job = load(paths, cache=False)
        report = analysis.kernel_report(job, hosts=host_traces(job.paths, job.files))
        return [f for f in report.findings or [] if f["kind"] == "launch_bound"]

    alone = {f["rank"]: f["recoverable_ms"] for f in found([node0])}
    job = {f["rank"]: f["recoverable_ms"] for f in found([node0, node1])}
    assert set(alone) == {0, 1}
    assert job == {0: alone[0], 1: alone[1], 2: alone[0], 3: alone[1]}
