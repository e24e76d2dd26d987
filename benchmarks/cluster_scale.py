"""A thousand ranks: ``profkit kernels NODES...`` in one process, on ``--workers N`` local
Dask workers, and on a Dask cluster (``--scheduler``), timed.

Builds ``--nodes`` node exports of one job from the committed Hugging Face Trainer DDP
capture (2 ranks on 2 H200s: ``tests/data/frameworks/nsys-2025.3-h200x2-hf-ddp2``): node 0
is it, node i a copy with every process id moved (``kernels_scale.another_node``) and its
clock ``i % 7`` ms ahead, so 512 nodes are 1,024 ranks. Then runs, in a fresh process each,
``profkit kernels nodes/*.sqlite --no-cache --format json`` in-process, with
``--workers N`` for each N of ``--workers``, and with ``--scheduler`` on a local
``dask scheduler`` with ``--cluster-workers`` ``dask worker`` processes started here
(started before the timing; the command only connects). For each: wall seconds and the
client's own peak RSS (``VmHWM`` of the profkit process, sampled: local workers are its
children, whose memory is theirs), and whether the JSON equals the in-process one, byte for
byte. Writes ``cluster_scale.json`` under ``--workdir`` (default ``$OUT`` or a temporary
folder) after every run, so a run cut short keeps what it measured.

    python benchmarks/cluster_scale.py --nodes 512 --workers 4 15 --cluster-workers 15

``--chrome-ranks N`` reads N per-rank torch traces instead (the same run's Chrome traces:
``build_ranks``); ``--before DIR`` runs each ``--workers`` mode with another checkout's
profkit too, and the in-process one (``DIR``: its root), for a before/after on one
machine.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kernels_scale import PID_STEP, ROOT, another_node, stamp
from kernels_scale import build as scale_build

SOURCE = ROOT / "tests" / "data" / "frameworks" / "nsys-2025.3-h200x2-hf-ddp2.sqlite.xz"
TORCH_SOURCE = ROOT / "tests" / "data" / "frameworks" / "torch-h200x2-hf-ddp2-rank{}.json.gz"
GIB = 1 << 30
RANK_PID = 100_000  # rank r's process id: RANK_PID + r (pids are below 2^22)


def build(folder: Path, count: int, copies: int = 1) -> list[Path]:
    """``count`` nodes of one job from the HF capture (see the module doc); ``copies`` > 1:
    each node's activities, API calls and marks repeated that many times, one after the
    other (``kernels_scale.build``: a node of as many times the steps)."""
    folder.mkdir(parents=True, exist_ok=True)
    node0 = folder / "node0000.sqlite"
    if copies > 1:
        scale_build(SOURCE, copies, node0)
    else:
        with lzma.open(SOURCE) as src, node0.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    paths = [node0]
    for i in range(1, count):
        shift = (i % 7) * 1_000_000
        paths.append(another_node(node0, folder / f"node{i:04d}.sqlite", i * PID_STEP, shift))
    return paths


def build_ranks(folder: Path, count: int) -> list[Path]:
    """``count`` per-rank torch traces of one run from the Hugging Face Trainer DDP capture's
    two (``TORCH_SOURCE``): rank r is rank ``r % 2``'s trace named rank r of ``count``, its
    process id ``RANK_PID + r`` (every rank a process of its own)."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = [json.loads(gzip.decompress(Path(str(TORCH_SOURCE).format(r)).read_bytes()))
            for r in (0, 1)]  # fmt: skip
    paths = []
    for rank in range(count):
        doc = docs[rank % 2]
        info = doc["distributedInfo"]
        info.update(rank=rank, world_size=count)
        info["pg_config"][0].update(pg_size=count, ranks=list(range(count)))
        events = doc["traceEvents"]
        pid = next(e["pid"] for e in events if isinstance(e.get("pid"), int))
        moved = [{**e, "pid": RANK_PID + rank} if e.get("pid") == pid else e
                 for e in events]  # fmt: skip
        path = folder / f"rank{rank:04d}.json.gz"
        path.write_bytes(gzip.compress(json.dumps({**doc, "traceEvents": moved}).encode(), 1))
        paths.append(path)
    return paths


def run(argv: list[str], out: Path, root: Path = ROOT) -> dict[str, Any]:
    """``argv`` to completion in ``root`` (the profkit it runs): wall seconds and the
    process's own peak RSS (VmHWM)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=root)
    peak = [0]

    def sample() -> None:
        status = Path(f"/proc/{proc.pid}/status")
        while proc.poll() is None:
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak[0] = max(peak[0], int(line.split()[1]) * 1024)
            except (OSError, ValueError):
                break
            time.sleep(0.05)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    _, stderr = proc.communicate()
    wall = time.perf_counter() - started
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed:\n{stderr.decode()[-2000:]}")
    return {"wall_s": round(wall, 2), "client_peak_rss_gib": round(peak[0] / GIB, 3),
            "bytes": out.stat().st_size}  # fmt: skip


def local_cluster(folder: Path, workers: int) -> tuple[Path, list[subprocess.Popen[bytes]]]:
    """A ``dask scheduler`` and ``workers`` ``dask worker`` processes on localhost."""
    file = folder / "scheduler.json"
    file.unlink(missing_ok=True)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--scheduler-file", str(file), "--port", "0", "--no-dashboard",
                               "--host", "127.0.0.1"], **quiet)]  # type: ignore[call-overload]  # fmt: skip
    while not file.exists():
        time.sleep(0.2)
    procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                   "--scheduler-file", str(file), "--nworkers", str(workers),
                                   "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"],
                                  **quiet))  # type: ignore[call-overload]  # fmt: skip
    import distributed

    with distributed.Client(scheduler_file=str(file), timeout="60s") as client:
        client.wait_for_workers(workers, timeout=120)
    return file, procs


def stages(paths: list[Path], workers: int) -> dict[str, float]:
    """Where the client's time goes with ``--workers N``, stage by stage, timed in this
    process (the library calls the command makes): the local cluster's start, the map (the
    workers read and analyse the nodes, the parts come back), the reduce (the job's own
    tables), the JSON; then one node's task timed alone, the map's efficiency (the tasks'
    time alone over the workers' time) and the same tasks' on as many plain processes."""
    from profkit import analysis
    from profkit.analysis.node_parts import Options
    from profkit.cluster.client import CLOSING_THREAD, dask_client
    from profkit.cluster.tasks import load_on
    from profkit.formats import dumps

    marks = {"start": time.perf_counter()}
    with dask_client(workers, None) as client:  # as the command starts and closes it
        marks["cluster started"] = time.perf_counter()
        job, parts = load_on(client, paths, cache=False, options=Options(), findings=True)
        marks["map"] = time.perf_counter()
    marks["cluster closing"] = time.perf_counter()  # in the background, beside the reduce
    nodes = [p.node for p in parts]
    report = analysis.kernel_report(job, consume=True, hosts=[], nodes=nodes)
    marks["reduce"] = time.perf_counter()
    dumps(report.to_json())
    marks["json"] = time.perf_counter()
    names = list(marks)
    found: dict[str, float] = {
        n: round(marks[n] - marks[p], 2) for p, n in itertools.pairwise(names)
    }
    for thread in threading.enumerate():  # the cluster's close, done before anything is timed
        if thread.name == CLOSING_THREAD:
            thread.join()
    # One node's task alone in this process (no Dask, no other task beside it), on a
    # sample: what the map's tasks would cost with a core each and nothing shared.
    from profkit.cluster.tasks import file_part

    sample = paths[: min(len(paths), 64)]
    started = time.perf_counter()
    for path in sample:
        file_part(str(path), None, False, True, Options(), True)
    task = (time.perf_counter() - started) / len(sample)
    found["task_alone_s"] = round(task, 4)
    # 1.0: the workers ran the tasks as fast as one alone does; less: sharing the host
    # (cores, memory bandwidth, clocks), Dask's own work, the client's receiving
    found["map_efficiency"] = round(task * len(paths) / (found["map"] * workers), 3)
    # The same tasks on as many plain processes, no Dask: what the host alone allows
    import multiprocessing

    each = 8
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_task, [str(sample[0])] * workers)  # started and warm
        started = time.perf_counter()
        pool.map(_task, [str(p) for p in (sample * workers)[: each * workers]], chunksize=each)
        wall = time.perf_counter() - started
    found["pool_efficiency"] = round(task * each / wall, 3)
    return found


def _task(path: str) -> None:
    """One node's task, as a worker runs it (for a plain process pool)."""
    from profkit.analysis.node_parts import Options
    from profkit.cluster.tasks import file_part

    file_part(path, None, False, True, Options(), True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=512, help="node exports of 2 ranks each")
    parser.add_argument(
        "--copies", type=int, default=1, help="each node's steps repeated (heavier nodes)"
    )
    parser.add_argument(
        "--chrome-ranks", type=int, default=0, help="N: N per-rank torch traces, not nodes"
    )
    parser.add_argument("--before", type=Path, default=None, help="another checkout: its runs too")
    parser.add_argument("--workers", type=int, nargs="*", default=[4, 15])
    parser.add_argument("--cluster-workers", type=int, default=15, help="0: no --scheduler run")
    parser.add_argument("--skip-in-process", action="store_true")
    parser.add_argument("--stages", type=int, default=0, help="N: time the stages with N workers")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="cluster-"))
    workdir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="cluster-nodes-"))
    started = time.perf_counter()
    if args.chrome_ranks:
        paths = build_ranks(scratch / "ranks", args.chrome_ranks)
        shape = {"traces": "torch (Chrome), one a rank", "ranks": len(paths)}
    else:
        paths = build(scratch / "nodes", args.nodes, args.copies)
        shape = {"nodes": len(paths), "ranks": 2 * len(paths), "copies": args.copies}
    print(f"built {shape} in {time.perf_counter() - started:.1f} s")
    base = [sys.executable, "-m", "profkit", "kernels", *map(str, paths), "--no-cache",
            "--format", "json"]  # fmt: skip
    result: dict[str, Any] = {**stamp(os.getloadavg()), **shape, "runs": {}}
    if args.stages:
        result["stages"] = stages(paths, args.stages)
        print(f"stages with {args.stages} workers: {result['stages']}", flush=True)
    expected = scratch / "in-process.json"
    modes: list[tuple[str, list[str]]] = []
    if not args.skip_in_process:
        modes.append(("in-process", []))
    modes += [(f"--workers {n}", ["--workers", str(n)]) for n in args.workers]
    if args.before is not None:
        modes += [] if args.skip_in_process else [("in-process [before]", [])]
        modes += [(f"--workers {n} [before]", ["--workers", str(n)]) for n in args.workers]
    if args.cluster_workers:
        modes.append(
            (f"--scheduler ({args.cluster_workers} dask workers)", ["--scheduler", "FILE"])
        )
    for label, extra in modes:
        procs: list[subprocess.Popen[bytes]] = []
        if extra[-1:] == ["FILE"]:
            file, procs = local_cluster(scratch, args.cluster_workers)
            extra = [extra[0], str(file)]
        out = expected if label == "in-process" else scratch / "out.json"
        try:
            root = args.before if label.endswith("[before]") else ROOT
            row = run([*base, "--out", str(out), *extra], out, root)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        if out != expected and expected.exists() and root == ROOT:  # (another's: its own)
            row["equals_in_process"] = out.read_bytes() == expected.read_bytes()
        result["runs"][label] = row
        print(f"{label}: {row}", flush=True)
        (workdir / "cluster_scale.json").write_text(json.dumps(result, indent=2))
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {workdir / 'cluster_scale.json'}")
    return 0 if all(r.get("equals_in_process", True) for r in result["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
