"""Time the Chrome trace reader on a large trace derived from a real torch.profiler one.

The source is a real trace: ``--source PATH`` (say the committed GPU fixture), or, by
default, one made here by torch.profiler from a tiny-model train step on the CPU. Its
events are replicated, shifted in time with fresh correlation/flow ids, until the JSON
reaches ``--target-mb``. A CPU-only source has no GPU activity, so by default each of
its ``cpu_op`` events also gets what Kineto writes for one launch on a GPU run: a
``cudaLaunchKernel`` runtime event inside the op, the kernel on stream 7, and the
``ac2g`` flow pair between them (``--no-gpu-synth`` turns this off). The summary says
which source and which additions were used.

Each measurement runs in a fresh process; its peak RSS is reported above what the
process held after its imports (torch comes with ``import profkit``):

    python benchmarks/chrome_parse.py --target-mb 300 --repeats 3

prints a markdown table for docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]


def cpu_source_trace(workdir: Path) -> Path:
    """A real torch.profiler trace of one tiny-model train step on the CPU."""
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(ROOT))
    from profkit.workload.config import WorkloadConfig
    from profkit.workload.step import Workload

    workload = Workload(WorkloadConfig(size="tiny", ctx=64, warmup=1, steps=1, device="cpu"))
    workload.step()
    path = workdir / "source.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        workload.step()
    prof.export_chrome_trace(str(path))
    return path


def load(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc: dict[str, Any] = orjson.loads(data)
    return doc


def add_gpu_activity(doc: dict[str, Any]) -> int:
    """Give every cpu_op one launch + kernel + ac2g flows, as Kineto writes them on CUDA."""
    added: list[dict[str, Any]] = []
    corr = 1_000_000
    for ev in doc["traceEvents"]:
        if ev.get("cat") != "cpu_op" or ev.get("ph") != "X":
            continue
        corr += 1
        ext = (ev.get("args") or {}).get("External id", 0)
        launch_ts = round(ev["ts"] + ev["dur"] / 2, 3)
        kernel_ts = round(launch_ts + 6.125, 3)
        pid, tid = ev["pid"], ev["tid"]
        added += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid,
             "tid": tid, "ts": launch_ts, "dur": 3.712,
             "args": {"External id": ext, "cbid": 211, "correlation": corr}},
            {"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": launch_ts,
             "cat": "ac2g", "name": "ac2g"},
            {"ph": "X", "cat": "kernel",
             "name": "void at::native::vectorized_elementwise_kernel<4, "
                     "at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >"
                     "(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
             "pid": 0, "tid": 7, "ts": kernel_ts, "dur": 4.224,
             "args": {"External id": ext, "queued": 0, "device": 0, "context": 1,
                      "stream": 7, "correlation": corr, "registers per thread": 26,
                      "shared memory": 0, "blocks per SM": 0.5, "warps per SM": 2.0,
                      "grid": [66, 1, 1], "block": [128, 1, 1],
                      "est. achieved occupancy %": 3}},
            {"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": kernel_ts,
             "cat": "ac2g", "name": "ac2g", "bp": "e"},
        ]  # fmt: skip
    doc["traceEvents"].extend(added)
    return len(added) // 4


def replicate(doc: dict[str, Any], target_bytes: int) -> tuple[dict[str, Any], int]:
    """Copies of the non-metadata events, each shifted past the last, until target_bytes."""
    events = doc["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), int | float)]
    one_copy = len(orjson.dumps(body))
    copies = max(1, -(-target_bytes // one_copy))
    span = max(e["ts"] + e.get("dur", 0) for e in body) - min(e["ts"] for e in body) + 100.0
    id_step = 10_000_000
    out: list[dict[str, Any]] = list(meta)
    for k in range(copies):
        for ev in body:
            ev2 = dict(ev)
            ev2["ts"] = round(ev["ts"] + k * span, 3)
            if "id" in ev2 and isinstance(ev2["id"], int):
                ev2["id"] += k * id_step
            args = ev2.get("args")
            if isinstance(args, dict) and ("correlation" in args or "External id" in args):
                args = dict(args)
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] += k * id_step
                ev2["args"] = args
            out.append(ev2)
    return {**doc, "traceEvents": out}, copies


def vm_kib(field: str) -> int:
    """``VmHWM`` (peak) or ``VmRSS`` of this process from /proc, in KiB.

    Not ``getrusage``: its ru_maxrss survives fork+exec, so a child would report the
    parent's peak (this script holds the whole big trace while it spawns them).
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def child(mode: str, path: str) -> None:
    """Runs in a fresh process: one measurement, printed as JSON."""
    sys.path.insert(0, str(ROOT))
    from profkit.traces.chrome import read_chrome_trace  # imports (torch via profkit) untimed

    baseline_kib = vm_kib("VmRSS")
    started = time.perf_counter()
    result: dict[str, Any] = {}
    if mode == "reader":
        trace = read_chrome_trace(path)
        result.update(kernels=len(trace.kernels), ranges=len(trace.ranges))
    else:
        data = Path(path).read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        result["decompress_s"] = time.perf_counter() - started
        if mode.endswith("-nogc"):
            import gc

            gc.disable()  # what read_chrome_trace does around its parse
        parsed = time.perf_counter()
        doc = json.loads(data) if mode.startswith("json") else orjson.loads(data)
        result["parse_s"] = time.perf_counter() - parsed
        result["events"] = len(doc["traceEvents"])
    result["seconds"] = time.perf_counter() - started
    result["peak_rss_mb"] = (vm_kib("VmHWM") - baseline_kib) / 1024
    print(json.dumps(result))


def measure(mode: str, path: Path, repeats: int) -> list[dict[str, Any]]:
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, __file__, "--child", mode, str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, help="a real Chrome trace (.json or .json.gz)")
    parser.add_argument("--target-mb", type=float, default=300.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-gpu-synth", action="store_true")
    parser.add_argument("--stdlib-json", action="store_true", help="also time json.loads once")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory(prefix="profkit-bench-") as tmp:
        workdir = Path(tmp)
        source = args.source or cpu_source_trace(workdir)
        doc = load(source)
        source_events = len(doc["traceEvents"])
        has_gpu = any(e.get("cat") == "kernel" for e in doc["traceEvents"])
        synthesized = 0
        if not has_gpu and not args.no_gpu_synth:
            synthesized = add_gpu_activity(doc)
        big, copies = replicate(doc, int(args.target_mb * 1e6))
        raw = orjson.dumps(big)
        del big, doc
        json_path = workdir / "big.json"
        json_path.write_bytes(raw)
        gz_path = workdir / "big.json.gz"
        started = time.perf_counter()
        gz_path.write_bytes(gzip.compress(raw, compresslevel=6))
        gzip_s = time.perf_counter() - started
        print(
            f"source: {args.source or 'torch.profiler CPU trace (tiny, ctx 64, one train step)'}"
            f" — {source_events:,} events; GPU launches synthesized per cpu_op: {synthesized:,};"
            f" replicated x{copies}: {len(raw) / 1e6:,.0f} MB JSON,"
            f" {gz_path.stat().st_size / 1e6:,.0f} MB gzip (gzip -6 took {gzip_s:.1f} s)",
            file=sys.stderr,
        )
        del raw
        rows = []
        for label, path in (("json", json_path), ("json.gz", gz_path)):
            for mode in ("orjson", "orjson-nogc", "reader"):
                runs = measure(mode, path, args.repeats)
                rows.append(summarize(label, mode, path, runs))
        if args.stdlib_json:
            for mode in ("json", "json-nogc"):
                rows.append(summarize("json", mode, json_path, measure(mode, json_path, 1)))
    print(f"\nmachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores,"
          f" Python {platform.python_version()}, orjson {orjson.__version__}\n")  # fmt: skip
    print(
        "| file | what | MB on disk | events | kernels | ranges | median s | min s | MB/s (JSON) "
        "| peak RSS added, MiB |"
    )
    print("|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['file']} | {r['what']} | {r['mb']:,.0f} | {r['events']} | {r['kernels']} "
            f"| {r['ranges']} | {r['median_s']:.2f} | {r['min_s']:.2f} | {r['mb_per_s']:,.0f} "
            f"| {r['rss']:,.0f} |"
        )


def summarize(label: str, mode: str, path: Path, runs: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [r["seconds"] for r in runs]
    json_mb = (path.with_suffix("") if path.suffix == ".gz" else path).stat().st_size / 1e6
    what = {
        "orjson": "orjson.loads, GC on",
        "orjson-nogc": "orjson.loads, GC paused",
        "json": "stdlib json.loads, GC on",
        "json-nogc": "stdlib json.loads, GC paused",
        "reader": "read_chrome_trace (all of it)",
    }[mode]
    if label == "json.gz" and mode != "reader":
        what = "gunzip + " + what
    return {
        "file": label,
        "what": what,
        "mb": path.stat().st_size / 1e6,
        "events": f"{runs[0]['events']:,}" if "events" in runs[0] else "",
        "kernels": f"{runs[0]['kernels']:,}" if "kernels" in runs[0] else "",
        "ranges": f"{runs[0]['ranges']:,}" if "ranges" in runs[0] else "",
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "mb_per_s": json_mb / statistics.median(seconds),
        "rss": max(r["peak_rss_mb"] for r in runs),
    }


if __name__ == "__main__":
    main()
