"""A job's files read on Dask workers (``--workers``, ``--scheduler``): the same report as
in one process, whatever the way it ran, and one line for every fault.

The nodes are made from the real 2-GPU DDP export (``kernels_scale.another_node``: every
process id moved, a clock some ms ahead), as in tests/test_nodes_streaming.py. The map
analyses each node's ranks alone on a worker (profkit.analysis.node_parts), so the
comparison with the in-process report, which joins the nodes first, is a real one: every
option, phase mode and rank is compared whole. The scheduler and workers of the
``--scheduler`` tests are real ``dask scheduler`` / ``dask worker`` processes on localhost.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from bench_scripts import benchmark
from nsys_data import unpack

from profkit import analysis
from profkit.analysis.node_parts import Options
from profkit.cluster.tasks import load_on
from profkit.errors import BadInput
from profkit.formats import dumps
from profkit.traces.host_calls import host_traces
from profkit.traces.job import load

distributed = pytest.importorskip("distributed")

DDP2 = "nsys-2025.3-h200x2-small-ddp2"
HF = "frameworks/nsys-2025.3-h200x2-hf-ddp2"
RANKS = [
    Path(__file__).parent / "data" / f"torch-h200x2-small-ddp2-rank{r}.json.gz" for r in (0, 1)
]
PID_STEP = 100_000
OPTIONS: list[dict[str, Any]] = [
    {},
    {"phase": "backward"},
    {"range": "computing softmax"},
    {"top": 0},
    {"rank": 3},
    {"rank": 4, "phase": "optimizer"},
    {"phases": "inferred"},
]
ENV = {**os.environ, "PROFKIT_CACHE": "0", "COLUMNS": "100"}


def _nodes(source: Path, folder: Path, count: int) -> list[Path]:
    scale = benchmark("kernels_scale")
    node0 = source.rename(folder / "node0.sqlite")
    return [node0] + [
        scale.another_node(node0, folder / f"node{i}.sqlite", i * PID_STEP, shift_ns=i * 1_700_000)
        for i in range(1, count)
    ]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three nodes of a 6-rank job (clocks 0, 1.7 and 3.4 ms ahead)."""
    folder = tmp_path_factory.mktemp("cluster")
    return _nodes(unpack(DDP2, folder), folder, 3)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """A local cluster of two worker processes, shared by the module's library tests."""
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


def _in_process(paths: list[Path], options: dict[str, Any]) -> dict[str, Any]:
    job = load(paths, cache=False)
    hosts = host_traces(job.paths, job.files)
    report = analysis.kernel_report(job, consume=True, hosts=hosts, **options)
    return json.loads(dumps(report.to_json()))  # as the command writes it


def _on_workers(
    client: Any, paths: list[Path], options: dict[str, Any], kind: str = "nodes"
) -> dict[str, Any]:
    opts = {k: v for k, v in options.items() if k != "rank"}
    wanted = Options(**opts, rank_tables="rank" in options)
    job, parts = load_on(client, paths, cache=False, options=wanted, findings=True)
    nodes = [p.node for p in parts]
    assert job.kind == kind and all(n is not None for n in nodes)  # analysed where read
    report = analysis.kernel_report(
        job, consume=True, hosts=[], nodes=nodes, rank=options.get("rank"), **opts
    )
    return json.loads(dumps(report.to_json()))  # as the command writes it


@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain"
)
def test_nodes_on_workers_equal_in_process(
    client: Any, nodes: list[Path], options: dict[str, Any]
) -> None:
    """Each node analysed alone on a worker, then joined: the in-process report, whole
    (ranks, steps, job, nodes' clocks, findings), with every option."""
    expected = _in_process(nodes, options)
    got = _on_workers(client, nodes, options)
    assert got == expected
    assert len(got["ranks"]) == (1 if "rank" in options else 6)
    assert [n["offset_ms"] for n in got["nodes"]] == [n["offset_ms"] for n in expected["nodes"]]


def test_the_client_reads_no_node_file(client: Any, nodes: list[Path], tmp_path: Path) -> None:
    """Once the workers' parts are back the client needs no node's file (the launch shapes
    its tables show came with the parts): the files moved away, the report is the same."""
    expected = _in_process(nodes, {})
    copies = [tmp_path / p.name for p in nodes]
    for src, dst in zip(nodes, copies, strict=True):
        dst.write_bytes(src.read_bytes())
    job, parts = load_on(client, copies, cache=False, options=Options(), findings=True)
    gone = tmp_path / "gone"
    gone.mkdir()
    for path in copies:
        path.rename(gone / path.name)
    report = analysis.kernel_report(job, consume=True, hosts=[], nodes=[p.node for p in parts])
    got = json.loads(dumps(report.to_json()))
    assert _paths_dropped(got) == _paths_dropped(expected)


@pytest.mark.parametrize("kind", ["nodes", "ranks"])
def test_a_steps_kernels_read_from_its_file(
    client: Any, nodes: list[Path], kind: str, tmp_path: Path
) -> None:
    """The client holds no activity of files analysed on workers: a step's kernels (what
    the lanes picture draws) are read from the rank's own file again, on the job's clock,
    the same as one process reading the joined files finds them; the files are read only
    when asked."""
    paths = nodes if kind == "nodes" else RANKS
    job = load(paths, cache=False)
    expected = analysis.kernel_report(job, consume=True)
    on_workers, parts = load_on(client, paths, cache=False, options=Options(), findings=True)
    assert on_workers.reread is not None and all(len(f) == 0 for f in on_workers.files)
    read: list[int] = []
    reread = on_workers.reread
    on_workers.reread = lambda i: (read.append(i), reread(i))[1]
    got = analysis.kernel_report(on_workers, hosts=[], nodes=[p.node for p in parts])
    assert read == []
    steps = 0
    for mine, theirs in zip(got.ranks, expected.ranks, strict=True):
        for step in range(len(theirs.steps.made["step"])):
            want = theirs.steps.kernels_of(step)
            pd.testing.assert_frame_equal(mine.steps.kernels_of(step), want)
            steps += len(want) > 0
    assert steps > 0 and read


def test_a_picture_where_the_files_are_not(client: Any, nodes: list[Path], tmp_path: Path) -> None:
    """The files seen by the workers only (a cluster without a shared filesystem): the
    report is made, and a picture of a step's kernels, which stayed on the workers, says
    in one line that this machine cannot read them."""
    copies = [tmp_path / p.name for p in nodes]
    for src, dst in zip(nodes, copies, strict=True):
        dst.write_bytes(src.read_bytes())
    job, parts = load_on(client, copies, cache=False, options=Options(), findings=True)
    for path in copies:
        path.unlink()
    report = analysis.kernel_report(job, hosts=[], nodes=[p.node for p in parts])
    assert len(report.ranks) == 6
    with pytest.raises(BadInput, match=r"stayed on the Dask workers.*no such file"):
        report.ranks[0].steps.kernels_of(0)


def _paths_dropped(value: Any) -> Any:
    """A report's JSON without the files' paths (the copies live elsewhere)."""
    if isinstance(value, dict):
        return {k: _paths_dropped(v) for k, v in value.items() if k not in ("path", "paths")}
    if isinstance(value, list):
        return [_paths_dropped(v) for v in value]
    return value


def test_real_framework_nodes_on_workers(client: Any, tmp_path: Path) -> None:
    """The Hugging Face Trainer's DDP capture as four nodes: the same report, findings
    (its host-side ones found on the workers) included."""
    (tmp_path / "frameworks").mkdir()
    paths = _nodes(unpack(HF, tmp_path), tmp_path, 4)
    expected = _in_process(paths, {})
    assert _on_workers(client, paths, {}) == expected
    # every rank's host findings, found on the workers, numbered as the job's ranks
    assert {f["rank"] for f in expected["findings"] if f["kind"] == "launch_bound"} == set(range(8))


def _rank_traces(folder: Path, edit: Callable[[int, dict[str, Any]], None]) -> list[Path]:
    """The real per-rank traces, each changed by ``edit(rank, document)``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, source in enumerate(RANKS):
        doc = json.loads(gzip.decompress(source.read_bytes()))
        edit(rank, doc)
        paths.append(folder / source.name)
        paths[-1].write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    return paths


def _other_host(rank: int, doc: dict[str, Any]) -> None:
    """Rank 1 on another host whose clock runs 3 ms ahead, both ranks one pid (two hosts'
    processes can share one)."""
    if rank == 1:
        doc["profkit"]["host"] = "node1"
        doc["baseTimeNanoseconds"] += 3_000_000
    for event in doc["traceEvents"]:
        if event.get("pid") == doc["profkit"]["pid"]:
            event["pid"] = 4242
    doc["profkit"]["pid"] = 4242


def _cpu_rank(rank: int, doc: dict[str, Any]) -> None:
    """Rank 1 with no GPU activity (a rank's CPU time is still reported)."""
    if rank == 1:
        gpu = ("kernel", "gpu_memcpy", "gpu_memset")
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in gpu]


@pytest.fixture(scope="module")
def rank_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    folder = tmp_path_factory.mktemp("chrome-ranks")
    return {
        "real": RANKS,
        "reversed": RANKS[::-1],
        "hosts": _rank_traces(folder / "hosts", _other_host),
        "cpu-rank": _rank_traces(folder / "cpu-rank", _cpu_rank),
    }


CHROME_CASES = [
    *[("real", o) for o in OPTIONS if o.get("rank", 0) < 2],
    ("real", {"rank": 0, "phase": "optimizer"}),
    *[(name, o) for name in ("reversed", "hosts", "cpu-rank") for o in ({}, {"rank": 1})],
]


@pytest.mark.parametrize(
    ("name", "options"),
    CHROME_CASES,
    ids=[
        f"{n}-" + (",".join(f"{k}={v}" for k, v in o.items()) or "plain") for n, o in CHROME_CASES
    ],
)
def test_per_rank_chrome_traces_analysed_on_workers(
    client: Any, rank_sets: dict[str, list[Path]], name: str, options: dict[str, Any]
) -> None:
    """Per-rank torch traces: each rank analysed alone on a worker, where its trace lies,
    then joined (ranks in rank order, another host's clock put on the first's): the JSON
    equals the in-process one whole, given in any order, with a rank of no GPU work."""
    paths = rank_sets[name]
    assert _on_workers(client, paths, options, kind="ranks") == _in_process(paths, options)


def test_a_rank_the_workers_cannot_analyse(client: Any) -> None:
    """A range no rank has: each worker's analysis refuses it, and the client, reading the
    traces as in one process, says so in the same words."""
    job, parts = load_on(client, RANKS, cache=False, options=Options(range="nope"), findings=True)
    assert job.kind == "ranks" and all(p.node is None and p.host for p in parts)
    with pytest.raises(BadInput) as on_workers:
        analysis.kernel_report(job, range="nope", hosts=[], nodes=[p.node for p in parts])
    with pytest.raises(BadInput) as in_process:
        _in_process(RANKS, {"range": "nope"})
    assert str(on_workers.value) == str(in_process.value)


def test_a_node_without_phase_ranges(client: Any, nodes: list[Path], tmp_path: Path) -> None:
    """A job whose second node was captured without its phase ranges (its phases inferred,
    the others' annotated: a job's phases ``mixed``): the job's phases, their order and
    every table are the ones one process gives, from the nodes' shares."""
    paths = [tmp_path / p.name for p in nodes]
    for src, dst in zip(nodes, paths, strict=True):
        dst.write_bytes(src.read_bytes())
    with sqlite3.connect(paths[1]) as conn:
        strings = "SELECT id FROM StringIds WHERE value IN ('forward', 'backward', 'optimizer')"
        conn.execute(f"DELETE FROM NVTX_EVENTS WHERE textId IN ({strings}) OR text IN "
                     "('forward', 'backward', 'optimizer')")  # fmt: skip
    expected = _in_process(paths, {})
    assert expected["source"]["phase_source"] == "mixed"
    assert _on_workers(client, paths, {}) == expected


def _spelled_forward(rank: int, doc: dict[str, Any]) -> None:
    """Rank 1's forward ranges spelled ``Forward``."""
    if rank == 1:
        for event in doc["traceEvents"]:
            if event.get("name") == "forward":
                event["name"] = "Forward"


def test_a_phase_each_rank_spells_its_own(client: Any, tmp_path: Path) -> None:
    """``--phase forward`` where one rank's trace spells it ``Forward``: each trace alone
    answers it, the job cannot (its tables would mix two phases), on workers as in one
    process, in the same words."""
    paths = _rank_traces(tmp_path, _spelled_forward)
    options = Options(phase="forward")
    job, parts = load_on(client, paths, cache=False, options=options, findings=True)
    assert all(p.node is not None for p in parts)  # each rank alone answers it
    with pytest.raises(BadInput) as on_workers:
        analysis.kernel_report(job, phase="forward", hosts=[], nodes=[p.node for p in parts])
    with pytest.raises(BadInput) as in_process:
        _in_process(paths, {"phase": "forward"})
    assert str(on_workers.value) == str(in_process.value)
    assert "'Forward' on rank 1" in str(in_process.value)


def _cli(
    *args: str | Path, timeout: int = 240, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "profkit", "kernels", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=timeout, cwd=cwd)


def test_workers_flag_equals_in_process(nodes: list[Path], tmp_path: Path) -> None:
    """``--workers 2`` (a local cluster the command starts and stops) writes the same JSON
    as the in-process read, byte for byte."""
    outs = [tmp_path / "in.json", tmp_path / "w2.json"]
    for out, extra in zip(outs, [(), ("--workers", "2")], strict=True):
        done = _cli(*nodes, "--format", "json", "--out", out, *extra)
        assert done.returncode == 0, done.stderr
    assert outs[0].read_bytes() == outs[1].read_bytes()


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real ``dask scheduler`` on localhost, its scheduler file, and a way to start
    ``dask worker`` processes (no nanny: the process is the worker, to be killed), each in
    the scheduler's folder, not in the command's working directory (as on a cluster)."""
    folder = tmp_path_factory.mktemp("scheduler")
    file = folder / "scheduler.json"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    proc = subprocess.Popen(
        [*dask, "--scheduler-file", file, "--port", "0", "--no-dashboard", "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV,
    )  # fmt: skip
    workers: list[subprocess.Popen[bytes]] = []

    def start_worker() -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(file),
                "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"]  # fmt: skip
        worker = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=folder
        )
        workers.append(worker)
        return worker

    deadline = time.monotonic() + 60
    while not file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        yield {"file": file, "start_worker": start_worker, "workers": workers}
    finally:
        for p in [*workers, proc]:
            p.kill()
            p.wait()


def _a_live_worker(scheduler: dict[str, Any]) -> None:
    """At least one worker on the scheduler: one started where none is left alive."""
    if not scheduler["workers"] or all(w.poll() is not None for w in scheduler["workers"]):
        scheduler["start_worker"]()
    _wait_for_workers(scheduler["file"], 1)


def _wait_for_workers(file: Path, count: int) -> None:
    with distributed.Client(scheduler_file=str(file), timeout="30s") as c:
        c.wait_for_workers(count, timeout=60)


def test_scheduler_with_real_workers(
    scheduler: dict[str, Any], nodes: list[Path], tmp_path: Path
) -> None:
    """``--scheduler FILE`` and ``--scheduler tcp://...`` on a real scheduler with two real
    worker processes: the in-process JSON, byte for byte."""
    for _ in range(2):
        scheduler["start_worker"]()
    _wait_for_workers(scheduler["file"], 2)
    address = json.loads(scheduler["file"].read_text())["address"]
    expected = tmp_path / "in.json"
    assert _cli(*nodes, "--format", "json", "--out", expected).returncode == 0
    for target in (scheduler["file"], address):
        out = tmp_path / "remote.json"
        done = _cli(*nodes, "--format", "json", "--out", out, "--scheduler", target)
        assert done.returncode == 0, done.stderr
        assert out.read_bytes() == expected.read_bytes()
    # per-rank torch traces, each rank analysed on a worker
    ranks_in, ranks_out = tmp_path / "ranks-in.json", tmp_path / "ranks-remote.json"
    assert _cli(*RANKS, "--format", "json", "--out", ranks_in).returncode == 0
    done = _cli(*RANKS, "--format", "json", "--out", ranks_out, "--scheduler", address)
    assert done.returncode == 0, done.stderr
    assert ranks_out.read_bytes() == ranks_in.read_bytes()


def test_relative_paths_on_workers_elsewhere(
    scheduler: dict[str, Any], nodes: list[Path], tmp_path: Path
) -> None:
    """Paths given relative to the command's working directory, which is not the workers':
    each file is still found, and the JSON (which names the files as given) is the
    in-process one, byte for byte: node exports, then per-rank torch traces."""
    _a_live_worker(scheduler)
    for files in (nodes, RANKS):
        here = files[0].parent
        given = [p.relative_to(here) for p in files]
        outs = [tmp_path / "in.json", tmp_path / "remote.json"]
        for out, extra in zip(outs, [(), ("--scheduler", scheduler["file"])], strict=True):
            done = _cli(*given, "--format", "json", "--out", out, *extra, cwd=here)
            assert done.returncode == 0, done.stderr
        assert json.loads(outs[0].read_text())["source"]["path"].startswith(given[0].name)
        assert outs[1].read_bytes() == outs[0].read_bytes()


def test_a_relative_nsys_runs_on_workers_elsewhere(
    scheduler: dict[str, Any], nodes: list[Path], tmp_path: Path
) -> None:
    """``--nsys tools/nsys`` (a file relative to the command's directory) exports a report
    on a worker that runs in another directory, and the report is the in-process one. (A
    stand-in nsys plays the export: it writes a node's export to the ``--output`` given.)"""
    _a_live_worker(scheduler)
    (tmp_path / "tools").mkdir()
    nsys = tmp_path / "tools" / "nsys"
    nsys.write_text(
        f"#!{sys.executable}\nimport shutil, sys\n"
        f"shutil.copy({str(nodes[0])!r}, sys.argv[sys.argv.index('--output') + 1])\n"
    )
    nsys.chmod(0o755)
    (tmp_path / "run.nsys-rep").write_bytes(b"a report")
    remote, local = tmp_path / "remote.json", tmp_path / "in.json"
    done = _cli("run.nsys-rep", "--nsys", "tools/nsys", "--format", "json", "--out", remote,
                "--scheduler", scheduler["file"], cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run.sqlite").read_bytes() == nodes[0].read_bytes()  # exported there
    done = _cli("run.nsys-rep", "--nsys", "tools/nsys", "--format", "json", "--out", local,
                cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert remote.read_bytes() == local.read_bytes()


def test_a_worker_killed_mid_run(scheduler: dict[str, Any], tmp_path: Path) -> None:
    """A worker killed while it reads a file: Dask runs the file's task again on another
    worker, and the report is the whole one, equal to the in-process read."""
    paths = _nodes(unpack(DDP2, tmp_path), tmp_path, 6)
    expected = tmp_path / "in.json"
    assert _cli(*paths, "--format", "json", "--out", expected).returncode == 0
    victim = scheduler["start_worker"]()
    _wait_for_workers(scheduler["file"], len(scheduler["workers"]))
    out = tmp_path / "remote.json"
    argv = [sys.executable, "-m", "profkit", "kernels", *map(str, paths), "--format", "json",
            "--out", str(out), "--scheduler", str(scheduler["file"])]  # fmt: skip
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    killed = False
    with distributed.Client(scheduler_file=str(scheduler["file"]), timeout="30s") as c:
        deadline = time.monotonic() + 120
        while not killed and run.poll() is None and time.monotonic() < deadline:
            busy = {addr: tasks for addr, tasks in c.processing().items() if tasks}
            pids = c.run(os.getpid, workers=list(busy)) if busy else {}
            if victim.pid in pids.values():  # the victim holds a file's task now
                os.kill(victim.pid, signal.SIGKILL)
                killed = True
            time.sleep(0.05)
    _, stderr = run.communicate(timeout=240)
    assert killed, "the victim never held a task (the run ended first)"
    assert run.returncode == 0, stderr
    assert out.read_bytes() == expected.read_bytes()


def test_a_task_whose_workers_keep_dying(nodes: list[Path], tmp_path: Path) -> None:
    """A file whose task takes its worker down each time it runs (real worker processes,
    each exiting mid-task): Dask tries it again on a fresh worker, then after the allowed
    failures the job stops with one line naming the file (no part of it is reported)."""
    from profkit.cluster.client import ALLOWED_FAILURES, dask_client, map_files
    from profkit.errors import BadInput

    deaths = tmp_path / "deaths"

    def dies(path: str) -> None:  # run on a worker: the process ends, as an OOM kill would
        if path.endswith(nodes[1].name):
            with deaths.open("a") as f:
                f.write("died\n")
            os._exit(1)

    with dask_client(2, None) as c, pytest.raises(BadInput) as said:
        map_files(c, dies, nodes)
    lost = len(deaths.read_text().splitlines())
    assert lost == ALLOWED_FAILURES + 1  # the first run, then the allowed retries
    assert str(said.value) == (
        f"{nodes[1]}: its read lost {lost} Dask workers in a row (out of memory, or "
        "killed); nothing of a partial job is reported"
    )


def test_a_file_missing_on_the_workers(
    scheduler: dict[str, Any], nodes: list[Path], tmp_path: Path
) -> None:
    """A path no worker can read: one line naming it, exit 2, no output written."""
    _a_live_worker(scheduler)
    out = tmp_path / "never.json"
    gone = tmp_path / "node-gone.sqlite"
    done = _cli(nodes[0], gone, "--format", "json", "--out", out, "--scheduler", scheduler["file"])
    assert done.returncode == 2
    assert "node-gone.sqlite" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_scheduler_that_cannot_be_reached(tmp_path: Path) -> None:
    """Nothing listens there: one line naming it, exit 2."""
    done = _cli(tmp_path / "any.sqlite", "--scheduler", "tcp://127.0.0.1:9", timeout=120)
    assert done.returncode == 2
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--workers", "0"), "--workers must be at least 1; got 0"),
        (("--workers", "2", "--scheduler", "tcp://127.0.0.1:9"), "not both"),
        (("--scheduler", "no-such-file"), "neither a scheduler file nor an address"),
    ],
)
def test_bad_cluster_flags(nodes: list[Path], args: tuple[str, ...], said: str) -> None:
    done = _cli(*nodes, *args)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr


def test_without_dask_the_flags_say_how_to_install_it(nodes: list[Path]) -> None:
    """Dask is an extra: where it is not installed (its import blocked here), one line."""
    code = (
        "import sys; sys.modules['distributed'] = None\n"
        "from profkit.__main__ import main; sys.argv = ['profkit', 'kernels', *sys.argv[1:]]\n"
        "main()"
    )
    done = subprocess.run([sys.executable, "-c", code, *map(str, nodes), "--workers", "2"],
                          capture_output=True, text=True, env=ENV, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --workers runs on Dask, which is not installed: pip install 'profkit[dask]'"
    )


def test_a_task_takes_one_thread() -> None:
    """A worker's reads and passes run on one thread each (its tasks are its parallelism);
    elsewhere they take up to four."""
    from profkit.analysis import chunked
    from profkit.cores import limited

    with limited(1):
        assert chunked.threads() == 1
    assert chunked.threads() == min(chunked.MAX_THREADS, os.cpu_count() or 1)
