"""A multi-process nsys export read as compact columns gives the ranked report.

``profkit kernels`` analyses a multi-process export from its columns
(``analysis.engine``). Checked here on the real 2-rank DDP export and on it replicated
three times, against the report the full tables' engine gave before it was deleted
(tests/frozen.py): the JSON of the whole trace and of each rank (floats to 1e-12
relative), the NCCL statistics and totals (exact), the steps across ranks (exact); and
the CLI's table, markdown and JSON outputs. The passes run on up to four threads: in
small chunks, four give the one-thread JSON to the bit.
"""

from __future__ import annotations

import json
import lzma
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from bench_scripts import benchmark
from frozen import assert_shows_the_numbers, frozen, normalised, normalised_text, without_story
from nsys_data import SMALL_FP32, unpack
from report_checks import TABLES, close_json, option_id
from synthetic import report
from typer.testing import CliRunner

import profkit.analysis as analysis
from profkit import cores
from profkit.analysis import chunked
from profkit.analysis.engine import analyze_columns
from profkit.analysis.names import short_kernel_name
from profkit.analysis.rank_layout import ranks_of
from profkit.analysis.report_types import RankedReport
from profkit.cli import app
from profkit.errors import BadInput
from profkit.formats import dumps
from profkit.traces.job import load
from profkit.traces.nsys_columns import read_nsys_columns

DATA = Path(__file__).parent / "data"
NSYS = DATA / "nsys-2025.3-h200x2-small-ddp2.sqlite.xz"
OPTIONS = [
    {},
    {"phase": "backward"},
    {"phase": "FORWARD"},
    {"range": "computing softmax"},
    {"top": 0},
    {"rank": 1},
    {"rank": 0, "phase": "optimizer"},
    {"rank": 1, "range": "final matmul", "top": 3},
]
ERRORS = [{"phase": "nope"}, {"range": "nope"}, {"rank": 5}, {"top": -1}]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ranks-streaming")
    plain = folder / NSYS.name.removesuffix(".xz")
    plain.write_bytes(lzma.decompress(NSYS.read_bytes()))
    scale = benchmark("kernels_scale")
    replicated = folder / "ranks2-x3.sqlite"
    scale.build(NSYS, 3, replicated)
    return {"x1": plain, "x3": replicated}


def _script(name: str, *args: str) -> Callable[[Path], subprocess.CompletedProcess[str]]:
    """A runner of ``benchmarks/NAME.py PATH ARGS...`` in a fresh interpreter."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, str(script), str(path), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300)

    return run


def _streamed(path: Path, options: dict[str, Any]) -> RankedReport:
    cols = read_nsys_columns(path)
    layout = ranks_of(cols)
    assert layout is not None
    report = analyze_columns(
        cols,
        options.get("top", 20),
        options.get("phase"),
        options.get("range"),
        layout=layout,
        rank=options.get("rank"),
    )
    assert isinstance(report, RankedReport)
    return report


@pytest.mark.parametrize("which", ["x1", "x3"])
@pytest.mark.parametrize("options", OPTIONS, ids=option_id)
def test_columns_give_the_frozen_report(
    exports: dict[str, Path], which: str, options: dict[str, Any]
) -> None:
    """The report the full tables gave (goldens kernels--nsys-2025.3-h200x2-small-ddp2*
    hold the CLI's for x1 with some of these options)."""
    want = frozen("ranks_streaming", f"{which}/{option_id(options)}")
    got = _streamed(exports[which], options)
    mine = normalised(got.to_json(), folder=exports["x1"].parent)
    close_json(mine, want["json"])
    for entry, theirs in zip(mine["ranks"], want["json"]["ranks"], strict=True):
        assert entry["comm"] == theirs["comm"]  # integer ns: exact
        assert {k: entry[k] for k in got.ranks[0].totals} == {
            k: theirs[k] for k in got.ranks[0].totals
        }
    assert got.steps.to_dict("list") == want["steps"]  # exact
    assert got.world_size == want["json"]["job"]["world_size"]
    tables = frozen("ranks_streaming_tables", f"{which}/{option_id(options)}")
    assert normalised([e.info for e in got.ranks], folder=exports["x1"].parent) == tables["infos"]
    _same_tables(got, tables["whole"])
    for entry, theirs in zip(got.ranks, tables["ranks"], strict=True):
        _same_tables(entry.report, theirs)


def _same_tables(report: Any, want: dict[str, Any]) -> None:
    """Every table of a report (not only its JSON's top rows) and its notes as frozen
    (floats to 1e-12 relative: std is summed in another order)."""
    assert without_story({"notes": report.notes})["notes"] == want["notes"]
    for table in TABLES:
        got = getattr(report, table)
        frozen_table = pd.DataFrame(**want[table])
        if "short_name" in got:  # shortened by today's rule (issue 27), whenever frozen
            assert got["short_name"].tolist() == [short_kernel_name(n) for n in got["name"]]
            got, frozen_table = (
                got.drop(columns="short_name"),
                frozen_table.drop(columns="short_name"),
            )
        pd.testing.assert_frame_equal(
            got.reset_index(drop=True),
            frozen_table.reset_index(drop=True),
            check_dtype=False,
            check_index_type=False,
            rtol=1e-12,
        )


@pytest.mark.parametrize("options", ERRORS, ids=lambda o: ",".join(o))
def test_bad_options_say_what_the_full_tables_said(
    exports: dict[str, Path], options: dict[str, Any]
) -> None:
    with pytest.raises(BadInput) as got:
        _streamed(exports["x1"], options)
    want = frozen("ranks_streaming", "error/" + ",".join(options))
    assert normalised_text(str(got.value), folder=exports["x1"].parent) == want


def test_the_ranks_columns_and_the_numbers(exports: dict[str, Path]) -> None:
    """The rank numbering, and numbers counted here by plain SQL."""
    import sqlite3

    cols = read_nsys_columns(exports["x1"])
    layout = ranks_of(cols)
    assert layout is not None
    assert [(i["rank"], i["device"]) for i in layout.info] == [(0, 0), (1, 1)]
    conn = sqlite3.connect(exports["x1"])
    per_device = dict(
        conn.execute(
            "SELECT deviceId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY deviceId"
        ).fetchall()
    )
    pids = dict(
        conn.execute("SELECT DISTINCT deviceId, processId FROM TARGET_INFO_CUDA_CONTEXT_INFO")
    )
    conn.close()
    report = _streamed(exports["x1"], {})
    for entry in report.ranks:
        assert entry.totals["kernels"] == per_device[entry.info["device"]]
        assert entry.info["pid"] == pids[entry.info["device"]]


def test_the_command_prints_what_the_full_tables_printed(exports: dict[str, Path]) -> None:
    runner = CliRunner()
    path = str(exports["x1"])
    argvs = [
        ["--format", "json"],
        ["--format", "md"],
        ["--format", "table", "--rank", "1", "--phase", "backward"],
        ["--format", "csv", "--range", "computing softmax", "--top", "0"],
    ]

    def run(argv: list[str]) -> str:
        result = runner.invoke(app, ["kernels", path, "--no-cache", *argv])
        assert result.exit_code == 0, result.output
        return result.stdout

    folder = exports["x1"].parent
    streamed = [run(argv) for argv in argvs]
    full = [frozen("ranks_streaming", "cli/" + " ".join(argv)) for argv in argvs]
    close_json(normalised(json.loads(streamed[0]), folder=folder), full[0])
    assert_shows_the_numbers(streamed[1], full[0])  # the markdown; table and csv below
    assert "backward" in streamed[2] and streamed[3].count("\n") > 5


def _rounded(text: str) -> str:
    """Text tables with numbers to 9 significant digits (std's last ulps may differ), the
    phase story's notes aside (report_checks.STORY_NOTES: the full tables have none)."""
    text = re.sub(r"• (?:Phases from |Recognized: )[^•]*", "", text)  # the terminal's
    text = re.sub(r"(?m)^- (?:Phases from |Recognized: ).*\n", "", text)  # markdown's
    return re.sub(r"\d+\.\d+(?:e[-+]\d+)?", lambda m: f"{float(m.group()):.9g}", text)


@pytest.mark.parametrize(
    "options",
    [{}, {"phase": "backward"}, {"range": "computing softmax"}],
    ids=["all", "phase", "range"],
)
def test_four_threads_give_the_one_thread_report_to_the_bit(
    exports: dict[str, Path], monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    """Small chunks (1,000 activities), so every pass has many chunks in flight: the JSON
    and each step's kernels (what the rank pictures read) are the same strings."""
    monkeypatch.setattr(chunked, "CHUNK", 1000)
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 4)
    reports, kernels = {}, {}
    for threads in (1, 4):
        monkeypatch.setattr(chunked, "MAX_THREADS", threads)
        assert chunked.threads() == threads
        report = _streamed(exports["x3"], options)
        reports[threads] = dumps(report.to_json())
        kernels[threads] = [e.steps.kernels_of(1).to_json() for e in report.ranks]
    assert reports[4] == reports[1]
    assert kernels[4] == kernels[1]
    assert len(json.loads(kernels[1][0])["start"]) > 1000  # a step spans several chunks


def test_the_stages_script_times_ranks_one_process_and_says_what_it_cannot(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    """benchmarks/ranks_stages.py: wall and CPU per stage for 2 ranks and for one process
    (it crashed on one: no layout); one line and exit status 2 for a missing file."""
    run = _script("ranks_stages")

    two = run(exports["x1"])
    assert two.returncode == 0, two.stderr
    assert "12,360 kernels, 2 ranks" in two.stdout
    assert re.search(r"one pass: sums +\d+\.\d\d s +\d+\.\d\d s", two.stdout)
    one = run(unpack(SMALL_FP32, tmp_path))
    assert one.returncode == 0, one.stderr
    assert "3,858 kernels, one CUDA process" in one.stdout
    assert re.search(r"one pass: sums +\d+\.\d\d s +\d+\.\d\d s", one.stdout)
    missing = run(tmp_path / "none.sqlite")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"error: no such file: {tmp_path / 'none.sqlite'}"
    ]


def test_the_read_timeline_script_times_each_step_and_says_what_it_cannot(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    """benchmarks/read_timeline.py: each step of the read with its thread, count, wall, CPU
    and span (every table's chunks, the calls, the activities, the ranges); one line and
    exit status 2 for a file that is not an export."""
    run = _script("read_timeline", "--runs", "2")

    done = run(exports["x1"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("13,680 activities read in") == 2
    step = r" +\d+ +\d+\.\d{3} s +\d+\.\d{3} s +\d+\.\d{3} - +\d+\.\d{3}"
    for thread, name in [("thr", "chunk RUNTIME"), ("thr", "chunk KERNEL"), ("thr", "nvtx_rows"),
                         ("thr", "build_ranges"), ("main", "_Calls.add"), ("main", "_Calls.seal"),
                         ("main", "_Builder.add")]:  # fmt: skip
        assert len(re.findall(rf"{thread} +{name}{step}", done.stdout)) == 2, name
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database")
    failed = run(text)
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines() == [
        f"error: {text} is not an SQLite database (expected an Nsight Systems SQLite export)"
    ]


def test_rank0_alone_reads_as_rank0_of_the_two(exports: dict[str, Path], tmp_path: Path) -> None:
    """The benchmark's same-workload comparison (kernels_scale.one_process): rank 0 of the
    2-rank export alone is one process whose rows are exactly rank 0's, and whose report
    (the one-process path) has rank 0's numbers in the 2-rank report."""
    import sqlite3

    scale = benchmark("kernels_scale")
    with sqlite3.connect(exports["x1"]) as conn:
        pids = scale.gpu_processes(conn)
    assert len(pids) == 2
    alone = tmp_path / "rank0.sqlite"
    rows = scale.build(NSYS, 1, alone, rank=0)
    with sqlite3.connect(exports["x1"]) as conn:
        for table, column in (("KERNEL", "globalPid"), ("RUNTIME", "globalTid"),
                              ("MEMCPY", "globalPid")):  # fmt: skip
            want = conn.execute(
                f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_{table} "
                f"WHERE ({column} >> 24) & 16777215 = ?",
                (pids[0],),
            ).fetchone()[0]
            assert rows[f"CUPTI_ACTIVITY_KIND_{table}"] == want > 0
    cols = read_nsys_columns(alone)
    assert ranks_of(cols) is None  # one CUDA process: the one-process path
    one = report(alone).to_json()
    rank0 = report(exports["x1"]).to_json()["ranks"][0]
    assert rank0["pid"] == pids[0]
    for key in ("kernels", "kernel_time_ms", "gpu_time_ms"):
        assert one["totals"][key] == rank0[key]
    assert [(p["phase"], p["kernels"]) for p in one["phases"]] == [
        (p["phase"], p["kernels"]) for p in rank0["phases"]
    ]


def test_a_world_of_four_ranks_is_the_two_side_by_side(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    """kernels_scale.build's ``world`` (benchmarks/ranks_world.py): two copies of the 2-rank
    export side by side as four ranks, each on a GPU and in processes of its own, as many
    kernels as two copies one after the other; each rank has its original's numbers."""
    import sqlite3

    scale = benchmark("kernels_scale")
    with sqlite3.connect(exports["x1"]) as conn:
        pids = scale.gpu_processes(conn)
        kernels = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    four = tmp_path / "world4.sqlite"
    rows = scale.build(NSYS, 2, four, world=4)
    assert rows["CUPTI_ACTIVITY_KIND_KERNEL"] == 2 * kernels
    got = analysis.kernel_report(load([four], cache=False)).to_json()
    two = analysis.kernel_report(load([exports["x1"]], cache=False)).to_json()["ranks"]
    step = scale.PID_STEP
    assert [(r["rank"], r["device"], r["pid"]) for r in got["ranks"]] == [
        (0, 0, pids[0]), (1, 1, pids[1]), (2, 2, pids[0] + step), (3, 3, pids[1] + step)
    ]  # fmt: skip
    for entry in got["ranks"]:
        original = two[entry["rank"] % 2]
        for key in ("kernels", "kernel_time_ms", "gpu_time_ms", "comm", "phases"):
            assert entry[key] == original[key], (entry["rank"], key)
    assert got["job"]["world_size"] == 4


def test_the_read_floor_script_times_the_readers_queries(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    """benchmarks/read_floor.py: the kernel query of one process, of several, and the
    cheapest with a start, on the reader's own SQL; one line and exit status 2 for an
    export of one process."""
    run = _script("read_floor", "--runs", "1")

    done = run(exports["x1"])
    assert done.returncode == 0, done.stderr
    assert "12,360 kernel rows, 1 chunks" in done.stdout
    for label in ("one process", "several processes", "with start, no process"):
        assert re.search(rf"  {label} +\d+ ms per M rows +\d+\.\d\dx", done.stdout), label
    single = unpack(SMALL_FP32, tmp_path)
    one = run(single)
    assert one.returncode == 2
    assert one.stderr.strip() == f"error: {single}: one CUDA process: give a multi-rank export"


def test_ranks_without_phase_ranges_infer_theirs_on_the_columns(tmp_path: Path) -> None:
    """The real export with its phase ranges deleted keeps its other NVTX ranges (attention,
    NCCL's own): the columns infer its phases as the full tables did, and do not take its
    outermost other ranges for annotated phases (the full tables' report, frozen)."""
    import sqlite3

    path = tmp_path / "no-phases.sqlite"
    path.write_bytes(lzma.decompress(NSYS.read_bytes()))
    with sqlite3.connect(path) as conn:
        conn.execute(
            "DELETE FROM NVTX_EVENTS WHERE textId IN (SELECT id FROM StringIds "
            "WHERE value IN ('forward', 'backward', 'optimizer'))"
        )
    cols = read_nsys_columns(path)
    layout = ranks_of(cols)
    assert layout is not None and len(cols.ranges)
    got = analyze_columns(cols, layout=layout).to_json()
    assert got["source"]["phase_source"] == "inferred"
    assert [p["phase"] for p in got["phases"]] == ["forward", "backward", "optimizer"]
    close_json(normalised(got, folder=tmp_path), frozen("ranks_streaming", "no-phases"))


@pytest.mark.parametrize("options", [{}, {"phase": "backward"}], ids=["all", "phase"])
def test_statistics_in_batches_of_names_are_the_same(
    exports: dict[str, Path], monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    """Batches of at most 2,000 activities (a name with more is a batch alone), each with
    every rank's groups of its names: every statistic as when all names are sorted at once."""
    from profkit.analysis import kernel_stats

    whole = dumps(_streamed(exports["x3"], options).to_json())
    monkeypatch.setattr(kernel_stats, "BATCH", 2000)
    batches = []
    name_batches = kernel_stats._name_batches
    monkeypatch.setattr(
        kernel_stats, "_name_batches", lambda g: batches.append(name_batches(g)) or batches[-1]
    )
    assert dumps(_streamed(exports["x3"], options).to_json()) == whole
    assert min(len(b) for b in batches) >= 8
