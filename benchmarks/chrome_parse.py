"""Time the Chrome trace reader, streaming against whole-document, on large real-shaped traces.

The source is a real trace: by default the committed H100 fixture
(``tests/data/torch-small-ctx128-train.json.gz``: one training step of the ``small`` model,
20,301 events, 2,014 GPU activities); ``--source PATH`` takes another, and ``--source cpu``
records one here with torch.profiler from a tiny-model train step on the CPU, giving each
of its ``cpu_op`` events what Kineto writes for one launch on a GPU run (a
``cudaLaunchKernel`` runtime event inside the op, the kernel on stream 7, and the ``ac2g``
flow pair between them; ``--no-gpu-synth`` turns this off). Its events are replicated,
shifted in time with fresh correlation/flow ids, until the JSON reaches each
``--target-mb``; the file is written a copy at a time (the header keys first,
``traceName`` after the events), one compact event per line or, with ``--layout
kineto``, one indented block per event as torch.profiler writes them.

``--copies N`` writes N copies of the source's events instead (``--source
tests/data/torch-h200-unannotated-train.json.gz --copies 200``: about 300 MB, 1 M events).

Each measurement runs in a fresh process; its wall and CPU time cover the read alone
(imports excluded), its peak RSS is the whole process's (``os.wait4``), imports included.
The readers run back to back, alternating, so the machine's load drifts over both:

    python benchmarks/chrome_parse.py --target-mb 200 1000 --repeats 3 --gzip --ijson

``whole`` is ``read_chrome_columns(path, chunk_bytes=None)`` (one ``orjson.loads`` of
the document, then one pass); ``stream`` is ``read_chrome_columns(path)``, the reader's
batches of ``CHUNK_BYTES`` of JSON (:mod:`profkit.traces.chrome_json`). ``columns`` is
``load_columns(path, cache=False)``: what the kernel report reads (the streamed read and
the sidecar). ``--tree DIR`` adds the same read with profkit imported from another
checkout (``columns@DIR``), so a change is timed against its base on the same file,
alternating:

    git worktree add --detach /tmp/base main
    python benchmarks/chrome_parse.py --source tests/data/torch-h200-unannotated-train.json.gz \
        --copies 200 --modes columns --tree /tmp/base --repeats 3

With ``--ijson`` two more modes time only the parse and the pass over the events, without
the columns: through ijson's C backend (``ijson.items(f, "traceEvents.item")``) and through
the reader's own batches, so the two parsers are compared on equal terms.

Before the Chrome reader gave columns, ``whole`` and ``stream`` timed the reader of the
two full tables (``read_chrome_trace``, since deleted) and ``columns`` read those tables
and packed them (``from_trace``); docs/PERFORMANCE.md keeps those figures as the old
code's. To time that code again, run this script as of commit 1f38560 from a checkout
of that commit; ``--tree`` pointed at such a checkout times its ``columns`` beside this
one's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import date
from pathlib import Path
from typing import IO, Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT / "tests" / "data" / "torch-small-ctx128-train.json.gz"
KIB = 1 << 10
ID_STEP = 10_000_000  # added to every id per copy: copies never share a correlation


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


def shifted(body: list[dict[str, Any]], k: int, span: float) -> list[dict[str, Any]]:
    """Copy ``k`` of the events: times moved past copy k-1, ids made unique."""
    out = []
    for ev in body:
        ev2 = dict(ev)
        ev2["ts"] = round(ev["ts"] + k * span, 3)
        if isinstance(ev2.get("id"), int):
            ev2["id"] += k * ID_STEP
        args = ev2.get("args")
        if isinstance(args, dict) and ("correlation" in args or "External id" in args):
            args = dict(args)
            for key in ("correlation", "External id"):
                if isinstance(args.get(key), int):
                    args[key] += k * ID_STEP
            ev2["args"] = args
        out.append(ev2)
    return out


def write_replicated(
    doc: dict[str, Any],
    target_bytes: int,
    outs: list[IO[bytes]],
    layout: str,
    copies: int | None = None,
) -> dict[str, int]:
    """Write copies of ``doc``'s events to every stream in ``outs`` until target_bytes
    (or, given ``copies``, that many copies).

    A copy at a time, so the generator never holds the big document: the header keys,
    the metadata events once, then copies of the other events, then ``traceName``.
    ``layout``: ``kineto`` indents each event as a block of lines, as torch.profiler
    does (about 330 bytes an event from the default source); ``compact`` writes one
    event per line without spaces (about 210 bytes: 1 GB is about 5 M events).
    """
    text = _events_text if layout == "kineto" else _events_lines
    events = doc["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), int | float)]
    span = max(e["ts"] + e.get("dur", 0) for e in body) - min(e["ts"] for e in body) + 100.0
    header = {k: v for k, v in doc.items() if k not in ("traceEvents", "traceName")}
    written = 0

    def put(data: bytes) -> None:
        nonlocal written
        written += len(data)
        for out in outs:
            out.write(data)

    opening = orjson.dumps(header, option=orjson.OPT_INDENT_2)[:-2] + b","
    put((opening if header else b"{") + b'\n  "traceEvents": [\n')
    put(text(meta))
    made = 0
    while made < copies if copies is not None else written < target_bytes:
        put((b",\n" if meta or made else b"") + text(shifted(body, made, span)))
        made += 1
    put(b'\n  ],\n  "traceName": "replicated.json"\n}\n')
    return {"events": len(meta) + made * len(body), "copies": made, "bytes": written}


def _events_text(events: list[dict[str, Any]]) -> bytes:
    """Events as torch.profiler lays them out: an indented block each, comma-separated."""
    text = orjson.dumps(events, option=orjson.OPT_INDENT_2)
    return text[2:-2].replace(b"\n", b"\n  ")  # drop the list's brackets, indent one level


def _events_lines(events: list[dict[str, Any]]) -> bytes:
    """One compact event per line, comma-separated."""
    return b",\n".join(b"  " + orjson.dumps(ev) for ev in events)


def vm_kib(field: str) -> int:
    """``VmRSS`` of this process from /proc, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def child(mode: str, path: str) -> None:
    """Runs in a fresh process: one read, printed as JSON."""
    mode, _, tree = mode.partition("@")  # "columns@/tmp/base": profkit from that checkout
    sys.path.insert(0, tree or str(ROOT))
    from profkit.traces import chrome  # imports untimed
    from profkit.traces.load import load_columns

    result: dict[str, Any] = {"imports_rss_mib": vm_kib("VmRSS") / 1024}
    result["profkit"] = str(Path(chrome.__file__).parents[2])  # which checkout was timed
    wall, cpu = time.perf_counter(), time.process_time()
    if mode == "whole":
        columns = chrome.read_chrome_columns(path, chunk_bytes=None)
        result.update(events=columns.meta["events"], kernels=len(columns))
    elif mode == "columns":
        columns = load_columns(path, cache=False)
        result.update(events=columns.meta["events"], kernels=len(columns))
    elif mode.startswith("stream") and not mode.endswith("-events"):  # "stream-256": 256 KiB
        chunk = int(mode.split("-")[1]) * KIB if "-" in mode else chrome.CHUNK_BYTES
        columns = chrome.read_chrome_columns(path, chunk_bytes=chunk)
        result.update(events=columns.meta["events"], kernels=len(columns))
    else:  # the parse and the pass over the events only, no columns
        result.update(events_only(mode, Path(path)))
    result.update(read_s=time.perf_counter() - wall, read_cpu_s=time.process_time() - cpu)
    print(json.dumps(result))


def events_only(mode: str, path: Path) -> dict[str, int]:
    """The parse (ijson's or the reader's batches) and the reader's pass, no columns."""
    import gc
    from itertools import islice

    from profkit.files import open_input
    from profkit.traces import chrome
    from profkit.traces.chrome_activities import ActivityArrays

    gc.disable()  # as the reader does
    activities = ActivityArrays()
    with open_input(path, "a trace") as stream:
        if mode == "ijson-events":
            import ijson

            events = ijson.items(stream, "traceEvents.item", use_float=True)
            batches = iter(lambda: list(islice(events, 1 << 14)), [])
            collected = chrome._collect(batches, activities)
        else:
            batches = chrome.EventBatches(stream, orjson.loads, (orjson.JSONDecodeError,))
            collected = chrome._collect(batches, activities)
    found = activities.finish(0, collected["issues"])
    return {"events": collected["events"], "kernels": len(found)}


def measure(mode: str, path: Path) -> dict[str, Any]:
    """One fresh process: its own timings plus its peak RSS from ``wait4``."""
    argv = [sys.executable, __file__, "--child", mode, str(path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode(errors="replace")
    if status != 0:
        raise SystemExit(f"{mode} on {path} failed ({status}):\n{err[-2000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    tree = mode.partition("@")[2]
    if tree and Path(result["profkit"]).resolve() != Path(tree).resolve():
        raise SystemExit(f"{mode} imported profkit from {result['profkit']}, not from {tree}")
    result["peak_rss_mib"] = usage.ru_maxrss / 1024  # KiB on Linux
    result["load_1min"] = os.getloadavg()[0]
    return result


def generate(
    source: dict[str, Any],
    target_mb: float,
    workdir: Path,
    gz: bool,
    layout: str,
    copies: int | None = None,
) -> list[Path]:
    size = f"x{copies}" if copies is not None else f"{target_mb:g}MB"
    path = workdir / f"trace-{size}-{layout}.json"
    with ExitStack() as stack:
        outs: list[IO[bytes]] = [stack.enter_context(path.open("wb"))]
        if gz:
            outs.append(stack.enter_context(gzip.open(f"{path}.gz", "wb", compresslevel=6)))
        info = write_replicated(source, int(target_mb * 1e6), outs, layout, copies)
    print(
        f"{path.name}: {info['bytes'] / 1e6:,.0f} MB of JSON, {info['events']:,} events "
        f"(x{info['copies']})" + (f", {Path(f'{path}.gz').stat().st_size / 1e6:,.0f} MB gzip"
                                  if gz else ""),
        file=sys.stderr,
    )  # fmt: skip
    return [path, Path(f"{path}.gz")] if gz else [path]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(DEFAULT_SOURCE), help="a trace, or 'cpu'")
    parser.add_argument("--target-mb", type=float, nargs="+", default=[200.0, 1000.0])
    parser.add_argument("--copies", type=int, help="this many copies instead of --target-mb")
    parser.add_argument(
        "--modes", nargs="+", default=["whole", "stream"], help="whole, stream, columns"
    )
    parser.add_argument("--tree", type=Path, help="also read as columns with profkit from here")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="also read a .json.gz of each")
    parser.add_argument("--ijson", action="store_true", help="also time ijson's parse")
    parser.add_argument(
        "--chunk-kib", type=int, nargs="*", default=[], help="also stream with these chunk sizes"
    )
    parser.add_argument("--layout", choices=["compact", "kineto"], default="compact")
    parser.add_argument("--no-gpu-synth", action="store_true")
    parser.add_argument("--workdir", type=Path, help="keep the traces here (default: a temp dir)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory(prefix="profkit-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        source = load(cpu_source_trace(workdir) if args.source == "cpu" else Path(args.source))
        if args.source == "cpu" and not args.no_gpu_synth:
            add_gpu_activity(source)
        modes = args.modes + [f"stream-{kib}" for kib in args.chunk_kib]
        modes += [f"columns@{args.tree.resolve()}"] if args.tree else []
        modes += ["ijson-events", "stream-events"] if args.ijson else []
        rows = []
        targets = [0.0] if args.copies is not None else args.target_mb
        for target in targets:
            made = generate(source, target, workdir, args.gzip, args.layout, args.copies)
            for path in made:
                runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
                for _ in range(args.repeats):
                    for mode in modes:
                        runs[mode].append(run := measure(mode, path))
                        print(f"{path.name} {mode}: {json.dumps(run)}", file=sys.stderr)
                rows += [summarize(path, mode, runs[mode]) for mode in modes]
                if not args.workdir:
                    path.unlink()
    print_table(rows, args)


def summarize(path: Path, mode: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = min(runs, key=lambda r: r["read_cpu_s"])
    return {
        "file": path.name,
        "what": mode,
        "events": best["events"],
        "kernels": best["kernels"],
        "wall_s": min(r["read_s"] for r in runs),
        "cpu_s": best["read_cpu_s"],
        "us_per_event": best["read_cpu_s"] / best["events"] * 1e6,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "imports_rss_mib": max(r["imports_rss_mib"] for r in runs),
        "load": [round(r["load_1min"], 1) for r in runs],
    }


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\n{date.today()}: {platform.processor() or platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, orjson {orjson.__version__};"
        f" best of {args.repeats} (wall and CPU: the read alone; peak RSS: the process)\n"
    )
    print(
        "| file | reader | events | GPU activities | wall s | CPU s | CPU µs/event "
        "| peak RSS MiB (after imports) | load avg (1 min) |"
    )
    print("|:---|:---|---:|---:|---:|---:|---:|---:|:---|")
    for r in rows:
        print(
            f"| {r['file']} | {r['what']} | {r['events']:,} | {r['kernels']:,} | "
            f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['us_per_event']:.2f} | "
            f"{r['peak_rss_mib']:,.0f} ({r['imports_rss_mib']:,.0f}) | "
            f"{', '.join(map(str, r['load']))} |"
        )


if __name__ == "__main__":
    main()
