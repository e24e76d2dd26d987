"""Per-rank torch.profiler traces of one run read as compact columns
(profkit.analysis.joins), as the full tables read them once.

The real 2-H200 DDP traces (one file a rank), and variants written from them: rank 1 said
to be another host whose clock runs 3 ms ahead, both ranks given one pid, no NCCL kernels,
no phase ranges, no GPU activity at all (a CPU run). Joined as columns and analysed by the
streaming ranked analysis, every set must give the report the full tables gave
(every rank's tables merged, then analysed; frozen before that engine was deleted:
tests/frozen.py) with every option and phase mode, ranks without GPU activity included.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from frozen import assert_shows_the_numbers, frozen, normalised, normalised_text
from report_checks import close_json, option_id
from typer.testing import CliRunner

from profkit.analysis import kernel_report
from profkit.analysis.engine import rank_entries
from profkit.analysis.joins import analyze_rank_file_columns, merge_rank_columns
from profkit.analysis.rank_layout import ranks_of
from profkit.analysis.report_types import RankedReport
from profkit.cli import app
from profkit.errors import BadInput
from profkit.formats import dumps
from profkit.report.build import build_report
from profkit.traces.columns import DEVICE, START
from profkit.traces.job import load
from profkit.traces.load import load_columns

DATA = Path(__file__).parent / "data"
RANKS = [DATA / f"torch-h200x2-small-ddp2-rank{r}.json.gz" for r in (0, 1)]
SHIFT_NS = 3_000_000  # rank 1's host clock 3 ms ahead
OPTIONS = [
    {},
    {"rank": 0},
    {"rank": 1},
    {"phase": "backward"},
    {"range_": "nccl:all_reduce"},
    {"range_": "computing softmax", "phase": "forward"},
    {"top": 0},
    {"top": 0, "rank": 1, "phase": "optimizer"},
    {"phases": "annotated"},
    {"phases": "inferred"},
    {"phases": "inferred", "rank": 0, "phase": "backward"},
]
runner = CliRunner()
Edit = Callable[[int, dict[str, Any]], None]


def _written(folder: Path, edit: Edit, stem: str = "torch-h200x2-small-ddp2") -> list[Path]:
    """The real rank traces, each changed by ``edit(rank, document)``, written to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, source in enumerate(RANKS):
        doc = json.loads(gzip.decompress(source.read_bytes()))
        edit(rank, doc)
        path = folder / f"{stem}-rank{rank}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
        paths.append(path)
    return paths


def _other_host(rank: int, doc: dict[str, Any]) -> None:
    if rank == 1:
        doc["profkit"]["host"] = "node1"
        doc["baseTimeNanoseconds"] += SHIFT_NS


def _one_pid(rank: int, doc: dict[str, Any]) -> None:
    """Both ranks pid 4242 (two hosts' processes can share one); rank 1 on another host."""
    _other_host(rank, doc)
    for event in doc["traceEvents"]:
        if event.get("pid") == doc["profkit"]["pid"]:
            event["pid"] = 4242
    doc["profkit"]["pid"] = 4242


def _no_nccl(rank: int, doc: dict[str, Any]) -> None:
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("nccl")
    ]


def _no_phases(rank: int, doc: dict[str, Any]) -> None:
    phases = ("forward", "backward", "optimizer")
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") not in phases]


def _no_gpu(rank: int, doc: dict[str, Any]) -> None:
    gpu = ("kernel", "gpu_memcpy", "gpu_memset")
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in gpu]


def _one_cpu_rank(rank: int, doc: dict[str, Any]) -> None:
    if rank == 1:
        _no_gpu(rank, doc)


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    folder = tmp_path_factory.mktemp("chrome-ranks")
    made = {"real": RANKS, "reversed": RANKS[::-1]}
    for name, edit in [("hosts", _other_host), ("one-pid", _one_pid), ("no-nccl", _no_nccl),
                       ("no-phases", _no_phases), ("no-gpu", _no_gpu),
                       ("one-cpu-rank", _one_cpu_rank)]:  # fmt: skip
        made[name] = _written(folder / name, edit)
    return made


def _json(report: Any) -> dict[str, Any]:
    return json.loads(json.dumps(report.to_json(), default=str))


def _full(sets: dict[str, list[Path]], name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The full tables' report of the set ``name`` (every rank's tables merged, then
    analysed), as it was frozen: ``{"error": ...}`` where they refused the options."""
    return frozen("chrome_ranks_streaming", f"{name}/{option_id(options)}")


def _same(sets: dict[str, list[Path]], name: str, value: Any) -> Any:
    """``value`` with the set's folder and the data folder written as frozen."""
    return normalised(value, data=DATA, set=sets[name][0].parent)


def _streamed(paths: list[Path], options: dict[str, Any]) -> dict[str, Any]:
    report = analyze_rank_file_columns([load_columns(p, cache=False) for p in paths], **options)
    assert isinstance(report, RankedReport)
    return _json(report)


@pytest.mark.parametrize("name", ["real", "hosts"])
@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_the_columns_give_the_full_tables_report(
    sets: dict[str, list[Path]], name: str, options: dict[str, Any]
) -> None:
    """(goldens kernels--torch-h200x2-small-ddp2-rank0+...-rank1* hold the CLI's JSON of
    the real set with some of these options)"""
    got = _same(sets, name, _streamed(sets[name], options))
    close_json(got, _full(sets, name, options))


@pytest.mark.parametrize("name", ["reversed", "one-pid", "no-nccl", "no-phases"])
def test_odd_sets_give_the_full_tables_report_too(sets: dict[str, list[Path]], name: str) -> None:
    """Ranks given last first; two hosts' ranks with one pid (each keeps its own
    activities, under a key of its own); a run without NCCL kernels; ranks without phase
    ranges (their phases inferred)."""
    got = _streamed(sets[name], {})
    close_json(_same(sets, name, got), _full(sets, name, {}))
    real = _streamed(sets["real"], {})
    if name == "one-pid":
        assert [(r["rank"], r["pid"]) for r in got["ranks"]] == [(0, 4242), (1, 4242)]
    mine = [{k: v for k, v in r.items() if k not in ("pid", "host")} for r in got["ranks"]]
    theirs = [{k: v for k, v in r.items() if k not in ("pid", "host")} for r in real["ranks"]]
    if name in ("reversed", "one-pid"):
        assert mine == theirs


def test_each_rank_infers_the_phases_it_infers_alone(sets: dict[str, list[Path]]) -> None:
    """Without phase ranges, each rank of the joined set infers its phases from its own
    autograd threads and ProfilerStep windows: what its trace alone gives, and what its
    phase ranges say where it has them (the merge once kept rank 0's hints under thread ids
    no merged thread has, and rank 0 found only forward)."""
    joined = _streamed(sets["no-phases"], {})
    annotated = _streamed(sets["real"], {})
    for entry, path, marked in zip(joined["ranks"], sets["no-phases"], annotated["ranks"],
                                   strict=True):  # fmt: skip
        alone = _json(kernel_report(load([path], cache=False)))
        assert alone["source"]["phase_source"] == "inferred"
        counted = [(p["phase"], p["kernels"]) for p in entry["phases"]]
        assert counted == [(p["phase"], p["kernels"]) for p in alone["phases"]]
        assert counted == [(p["phase"], p["kernels"]) for p in marked["phases"]]


def test_two_hosts_3_ms_apart_are_put_on_one_clock(sets: dict[str, list[Path]]) -> None:
    """Rank 1's host 3 ms ahead: the offset its 19 collectives show (the GPUs' own clocks
    differ by a few µs: tests/test_nodes.py has the exact value) is taken out, so every
    per-rank number and every step span is the one host's."""
    one_host, two = _streamed(sets["real"], {}), _streamed(sets["hosts"], {})
    assert "nodes" not in one_host
    first, second = two["nodes"]
    assert (first["host"], second["host"], second["ranks"]) == ("vm", "node1", [1])
    assert second["offset_ms"] == pytest.approx(SHIFT_NS / 1e6, abs=0.02)
    assert (second["pairs"], second["agreeing"], second["applied"]) == (19, 19, True)
    assert [r["host"] for r in two["ranks"]] == ["vm", "node1"]
    strip = [{k: v for k, v in r.items() if k != "host"} for r in two["ranks"]]
    assert strip == [{k: v for k, v in r.items() if k != "host"} for r in one_host["ranks"]]
    for mine, theirs in zip(two["job"]["ranks"], one_host["job"]["ranks"], strict=True):
        assert (mine["mean_step_ms"], mine["nccl_ms"]) == (
            theirs["mean_step_ms"],
            theirs["nccl_ms"],
        )
        # A wait compares two hosts' times: each of the 19 collectives carries what is left
        # of the offset (a few µs; docs/MULTI_GPU.md, Clocks).
        assert mine["nccl_wait_ms"] == pytest.approx(theirs["nccl_wait_ms"], abs=19 * 0.01)


def test_the_layout_is_the_files_and_ranks_of_agrees_on_real_traces() -> None:
    """Each activity is its file's rank; on the real traces (rank r on GPU r, every
    activity launched) what ranks_of would infer from the joined columns is the same."""
    columns = [load_columns(p, cache=False) for p in RANKS]
    joined = merge_rank_columns(columns)
    assert joined is not None
    cols, layout = joined
    assert np.bincount(layout.rank).tolist() == [len(c) for c in columns]
    cols.meta = {k: v for k, v in cols.meta.items() if k != "ranks"}  # as an export's
    inferred = ranks_of(cols)
    assert inferred is not None
    assert np.array_equal(inferred.rank, layout.rank)
    assert np.array_equal(inferred.range_rank, layout.range_rank)
    assert [(i["rank"], i["pid"], i["device"]) for i in inferred.info] == [
        (i["rank"], i["pid"], i["device"]) for i in layout.info
    ]


def test_a_rank_trace_keeps_starts_and_devices_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A per-rank trace's columns keep its GPU starts and devices (the raw JSON's), read
    fresh or from the cache, in GPU order (by start, then end, then as written: the raw
    JSON's, read here); a trace that names no rank keeps none."""
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    doc = json.loads(gzip.decompress(RANKS[1].read_bytes()))
    base = doc["baseTimeNanoseconds"]
    gpu = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    timed = sorted(
        (base + round(e["ts"] * 1000), base + round((e["ts"] + e["dur"]) * 1000), i)
        for i, e in enumerate(gpu)
    )
    for _ in ("fresh", "cached"):
        cols = load_columns(RANKS[1])
        assert cols.arrays[START].tolist() == [start for start, _, _ in timed]
        assert cols.arrays[DEVICE].tolist() == [gpu[i]["args"]["device"] for _, _, i in timed]
    alone = load_columns(DATA / "torch-small-ctx128-train.json.gz", cache=False)
    assert START not in alone.arrays and DEVICE not in alone.arrays


def test_a_cached_chrome_trace_reads_its_sidecar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache keeps no sidecar: a cached read reads it afresh, as an uncached one does."""
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "run-rank0.json.gz"
    path.write_bytes(RANKS[0].read_bytes())
    sidecar = {"config": {"size": "tiny", "ctx": 32, "batch": 2, "mode": "train"}}
    (tmp_path / "run-rank0.profkit.json").write_text(json.dumps(sidecar))
    fresh, cached = load_columns(path), load_columns(path)
    assert fresh.meta["sidecar"]["config"] == cached.meta["sidecar"]["config"]
    assert cached.meta["sidecar"]["config"]["size"] == "tiny"


@pytest.mark.parametrize("name", ["no-gpu", "one-cpu-rank"])
@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_ranks_without_gpu_activity_give_the_full_tables_report(
    sets: dict[str, list[Path]], name: str, options: dict[str, Any]
) -> None:
    """Ranks without GPU activity (a CPU run's, every rank or one): the columns give the
    full tables' report (the phases' CPU time, no kernels), or their error, loaded as the
    ranks of one run (the streamed analysis once crashed on them)."""
    job = load(sets[name], cache=False)
    assert job.kind == "ranks" and [len(c) == 0 for c in job.files] == [name == "no-gpu", True]
    want = _full(sets, name, options)
    if "error" in want:
        with pytest.raises(BadInput) as refused:
            kernel_report(job, **_renamed(options))
        assert (
            normalised_text(str(refused.value), data=DATA, set=sets[name][0].parent)
            == want["error"]
        )
        return
    close_json(_same(sets, name, _json(kernel_report(job, **_renamed(options)))), want)


def _renamed(options: dict[str, Any]) -> dict[str, Any]:
    """The options as :func:`kernel_report` names them."""
    return {("range" if k == "range_" else k): v for k, v in options.items()}


@pytest.mark.parametrize("name", ["real", "hosts"])
def test_the_cli_reads_rank_sets_as_the_full_tables_did(
    sets: dict[str, list[Path]], name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`profkit kernels RANK0 RANK1` gives every format, uncached and cached: JSON as the
    full tables' (floats to 1e-12), markdown showing their numbers."""
    paths = [str(p) for p in sets[name]]
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    first = runner.invoke(app, ["kernels", *paths, "--format", "json"])  # fills the cache
    assert first.exit_code == 0, first.output
    printed = {}
    for fmt in ("json", "md", "csv"):
        result = runner.invoke(app, ["kernels", *paths, "--format", fmt])
        assert result.exit_code == 0, result.output
        printed[fmt] = result.stdout
    assert printed["json"] == first.stdout
    close_json(_same(sets, name, json.loads(printed["json"])), _full(sets, name, {}))
    assert_shows_the_numbers(printed["md"], _full(sets, name, {}))
    assert printed["csv"].count("\n") > 20
    picture = tmp_path / "lanes.png"
    drawn = runner.invoke(app, ["kernels", *paths, "--plot", str(picture)])
    assert drawn.exit_code == 0, drawn.output
    assert picture.read_bytes().startswith(b"\x89PNG")
    bad = runner.invoke(app, ["kernels", *paths, "--rank", "2"])
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines() == ["error: no rank 2 in this trace; ranks: 0, 1"]


def test_the_cli_streams_uncached_and_inferred(sets: dict[str, list[Path]]) -> None:
    """--no-cache joins the columns (each rank's read by its reader), and so does
    --phases inferred, and traces without GPU activity."""
    paths = [str(p) for p in sets["real"]]
    streamed = runner.invoke(app, ["kernels", *paths, "--no-cache", "-f", "json"])
    assert streamed.exit_code == 0, streamed.output
    close_json(_same(sets, "real", json.loads(streamed.stdout)), _full(sets, "real", {}))
    inferred = runner.invoke(app, ["kernels", *paths, "--no-cache", "--phases", "inferred"])
    assert inferred.exit_code == 0, inferred.output
    cpu = runner.invoke(app, ["kernels", *map(str, sets["no-gpu"]), "--no-cache"])
    assert cpu.exit_code == 0, cpu.output


def test_the_report_reads_rank_sets_from_the_columns(
    sets: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`profkit report`'s part for a folder's per-rank traces comes from the columns, its
    hosts' clock aligned as `profkit kernels` aligns them."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for path in sets["hosts"]:
        (profiles / path.name).write_bytes(path.read_bytes())
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "reports" / "REPORT.md"
    build_report(profiles, None, out)
    text = out.read_text()
    assert "· 2 ranks · 1 captured step each ·" in text
    assert "| 1 | node1 | 1 |" in text and "| yes |" in text
    assert (out.parent / "ranks-torch-h200x2-small-ddp2.png").exists()


def test_a_rank_alone_has_the_tables_it_has_in_the_job() -> None:
    """Lightning's DDP traces without phase marks: rank 1 analysed alone (as a Dask worker
    analyses a rank's trace) has, to the bit, the tables it has in the two-rank job, where
    its kernels' names are numbered after rank 0's (shares are summed in whole ns, ties
    ordered by name)."""
    paths = [DATA / "frameworks" / f"torch-h200x2-lightning-ddp2-bare-rank{r}.json.gz"
             for r in (0, 1)]  # fmt: skip
    job = analyze_rank_file_columns([load_columns(p, cache=False) for p in paths])
    merged, layout = merge_rank_columns([load_columns(paths[1], cache=False)])
    alone, _, _ = rank_entries(merged, layout)
    assert dumps(alone[0].made_json()) == dumps(job.ranks[1].made_json())
