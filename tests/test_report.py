"""``profkit report`` and ``--run``: the report from real DBs, traces and snapshots.

Golden numbers come from the real H100 results DB (tests/data/results-h100.db: bench rows
only), the committed nsys export (profiles/examples/), the torch.profiler Chrome traces and
a memory snapshot from the H100 (tests/data/), and a real tiny CPU sweep made here.
"""

from __future__ import annotations

import gzip
import json
import lzma
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from profkit.cli import app
from profkit.report import build_report
from profkit.report.plan import MINIMAL_PLAN, Piece
from profkit.report.run import Where, run_plan
from profkit.workload.config import WorkloadConfig

DATA = Path(__file__).parent / "data"
H100_DB = DATA / "results-h100.db"
EXAMPLES = Path(__file__).parents[1] / "profiles" / "examples"
GPU = "NVIDIA H100 80GB HBM3"
DDP2 = "nsys-2025.3-h200x2-small-ddp2"

runner = CliRunner()


def invoke(*args: str | Path) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def section(text: str, title: str) -> str:
    """The markdown of one ``## title`` section."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def assert_png(path: Path, min_height: int = 300) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] >= min_height and pixels.shape[1] >= 400


def db_rows(db: Path, sql: str) -> list[sqlite3.Row]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        return list(conn.execute(sql))


# --- the real H100 DB ------------------------------------------------------------------


@pytest.fixture(scope="module")
def h100_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Any]:
    root = tmp_path_factory.mktemp("h100")
    db = root / "results.db"
    shutil.copy(H100_DB, db)
    out = root / "reports" / "REPORT.md"
    result = invoke("report", "--profiles", root / "profiles", "--db", db, "--out", out)
    assert result.exit_code == 0, result.output
    return out, out.read_text(), result


def test_h100_header_names_the_gpu_and_the_date(h100_report: tuple[Path, str, Any]) -> None:
    _, text, result = h100_report
    assert text.startswith("# profkit report\n")
    assert f"Measured on **{GPU}** · 2026-11-21 · torch 2.11.0+cu130 (CUDA 13.0)" in text
    assert result.stdout.startswith("wrote ") and "4 of 7 sections, 3 pictures" in result.stdout


def test_h100_bench_tables_hold_every_row_of_the_db(h100_report: tuple[Path, str, Any]) -> None:
    _, text, _ = h100_report
    bench = section(text, "Benchmark")
    rows = db_rows(H100_DB, "select * from bench")
    assert len(rows) == 22
    for row in rows:
        if row["status"] == "ok":
            # every phase, the rate, MFU and the peak, as the DB holds them
            assert f"| {row['step_ms']:,.2f} | {row['step_ms_std']:,.2f} |" in bench
            assert f"| {row['tokens_per_s']:,.0f} |" in bench
            assert f"| {100 * row['mfu']:,.2f} | {row['peak_memory_gib']:,.2f} |" in bench
    assert "| large | 256 | fp32 | 5 | 10 | ok | 61.36 | 0.09 | 118.33 | 0.13 | 31.08 |" in bench
    oom = "| 2.7B | 1,024 | fp32 | 2 | 5 | oom | — | — |"
    assert oom in bench and "| 65.93 | CUDA out of memory." in bench
    assert f"### Training step (mode train) · {GPU}" in bench
    assert "![Training step time, NVIDIA H100 80GB HBM3](report-step-time.png)" in bench


def test_h100_comparisons_only_where_the_db_has_pairs(h100_report: tuple[Path, str, Any]) -> None:
    _, text, _ = h100_report
    comparisons = section(text, "Comparisons")
    assert "| large | 256 | train | 210.77 | 127.65 | -83.12 | -39.44 |" in comparisons
    assert "| bf16 autocast vs fp32 | large | train step | 210.77 | 127.65 | 1.65 |" in comparisons
    assert "| bf16 autocast vs fp32 | 2.7B | forward | 168.67 | 34.84 | 4.84 |" in comparisons
    assert "### torch.compile\n\n_Skipped: every bench row has the same compile (no)" in comparisons
    assert "### Warm-up steps\n\n_Skipped: no two bench rows differ only in warmup" in comparisons
    assert (
        "### Scaling across GPUs\n\n_Skipped: every bench row has the same nproc (1); run two, "
        "e.g. profkit bench --nproc 1 2._"
    ) in comparisons


def test_rows_of_several_gpus_are_a_scaling_table(tmp_path: Path) -> None:
    """The real two-H200 rows (`profkit bench --nproc 1 2 --parallel ddp fsdp`): each
    parallelism against the one-GPU row, efficiency its step mean over theirs."""
    from profkit.run import bench as bench_lib
    from profkit.run import results

    rows = json.loads((DATA / "bench-h200x2-small-nproc.json").read_text())
    db = tmp_path / "results.db"
    with results.opened(db) as conn:
        for row in rows:
            results.insert(conn, bench_lib.TABLE, row, bench_lib.COLUMN_TYPES)
    out = tmp_path / "REPORT.md"
    result = invoke("report", "--profiles", tmp_path / "profiles", "--db", db, "--out", out)
    assert result.exit_code == 0, result.output
    scaling = section(out.read_text(), "Comparisons").split("### Scaling across GPUs\n")[1]
    step = scaling.split("#### step ms · 1 proc vs 2 procs · NVIDIA H200\n")[1]
    mean = {r["label"]: sum(r["step_times_ms"]) / len(r["step_times_ms"]) for r in rows}
    one = mean["small-ctx128-train-fp32"]
    for kind in ("ddp", "fsdp"):
        two = mean[f"small-ctx128-train-fp32-{kind}2"]
        line = (f"| small | 128 | train | {kind} | {one:,.2f} | {two:,.2f} | {two - one:,.2f} | "
                f"{100 * (two - one) / one:,.2f} | {one / two:,.2f} |")  # fmt: skip
        assert line in step, (line, step)


def test_h100_sections_without_data_are_one_line(h100_report: tuple[Path, str, Any]) -> None:
    _, text, result = h100_report
    for title in ("Nsight Systems profiles", "torch.profiler traces", "Attention"):
        body = section(text, title).strip().splitlines()
        assert len(body) == 3 and body[2].startswith("_Skipped: "), body
    memory = section(text, "Memory")  # no memory rows, but bench peaks at two contexts
    assert "_No `profkit memory` rows in the results DB._" in memory
    assert "](report-peak-memory.png)" in memory
    assert "skipped Attention: no attention rows in the results DB" in result.stderr


def test_h100_pictures_are_real_pngs(h100_report: tuple[Path, str, Any]) -> None:
    out, _, _ = h100_report
    names = sorted(p.name for p in out.parent.glob("*.png"))
    assert names == ["report-peak-memory.png", "report-speedups.png", "report-step-time.png"]
    for name in names:
        assert_png(out.parent / name)


@pytest.fixture(scope="module", autouse=True)
def _default_db_under_profiles() -> Any:
    """These tests use the default DB, PROFILES/results.db, of their own temp profiles
    dirs; the session's PROFKIT_DB (conftest) would send them all to one shared DB."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PROFKIT_DB", raising=False)
        yield


# --- a real tiny CPU sweep, made by --run ---------------------------------------------


@pytest.fixture(scope="module")
def minimal_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """``report --run --plan minimal`` on this CPU: a real tiny bench sweep (fp32/bf16 ×
    warm-up 0/1), torch.profiler traces, one attention cell; memory skipped (no CUDA)."""
    root = tmp_path_factory.mktemp("run")
    profiles, out = root / "profiles", root / "reports" / "REPORT.md"
    result = invoke("report", "--run", "--plan", "minimal", "--profiles", profiles, "--out", out)
    assert result.exit_code == 0, result.output
    return profiles, out, result


def test_run_minimal_plan_on_cpu(minimal_run: tuple[Path, Path, Any]) -> None:
    profiles, out, result = minimal_run
    lines = [
        "bench: tiny, ctx 16, train, fp32/bf16, warm-up 0 1: ran 4 of 4 configs",
        "torch.profiler: tiny, ctx 16: wrote ",
        "memory: needs CUDA: memory snapshots need a CUDA device",
        "attention: naive, d_head 16 × seq 32: 1 ok cells",
    ]
    statuses = ["ran", "ran", "skipped", "ran"]
    for status, line in zip(statuses, lines, strict=True):
        assert re.search(rf"^{status} +[\d.]+ s  {re.escape(line)}", result.stderr, re.M), (
            result.stderr
        )
    assert sorted(p.name for p in profiles.iterdir()) == [
        "results.db", "torch-tiny-ctx16-forward.json.gz", "torch-tiny-ctx16-train.json.gz",
    ]  # fmt: skip
    text = out.read_text()
    assert "### Attention: naive eager fp32, batch 8, 2 timed passes, cpu" in text
    assert "### torch-tiny-ctx16-train" in section(text, "torch.profiler traces")
    assert "No GPU kernels in this trace (a CPU run)" in section(text, "torch.profiler traces")
    assert result.stdout.startswith(f"wrote {out} (5 of 7 sections, 2 pictures)")


def test_cpu_sweep_report(minimal_run: tuple[Path, Path, Any]) -> None:
    profiles, out, _ = minimal_run
    text = out.read_text()
    assert "Measured on **CPU**" in text and "torch 2.13.0" in text
    bench = section(text, "Benchmark")
    rows = db_rows(profiles / "results.db", "select * from bench")
    assert [(r["dtype"], r["warmup"], r["status"]) for r in rows] == [
        ("fp32", 0, "ok"), ("fp32", 1, "ok"), ("bf16", 0, "ok"), ("bf16", 1, "ok"),
    ]  # fmt: skip
    for row in rows:
        assert f"| {row['step_ms']:,.2f} | {row['step_ms_std']:,.2f} |" in bench
        # every row ok: no status column (it shows where a config failed)
        assert f"| {row['warmup']} | {row['forward_ms']:,.2f} |" in bench
    comparisons = section(text, "Comparisons")
    assert "### Mixed precision\n\n#### forward ms · fp32 vs bf16 · cpu" in comparisons
    assert "### Warm-up steps\n\n#### forward ms by warm-up steps (0, 1) · cpu" in comparisons
    assert "#### step ms by warm-up steps (0, 1) · cpu · first timed step vs median" in comparisons
    assert "### torch.compile\n\n_Skipped:" in comparisons
    fp32, bf16 = (r for r in rows if r["warmup"] == 1 and r["dtype"] in ("fp32", "bf16"))
    speedup = fp32["step_ms"] / bf16["step_ms"]
    assert (
        f"| bf16 autocast vs fp32 | tiny · warmup 1 | train step | {fp32['step_ms']:,.2f} |"
        in comparisons
    )
    # Two timed steps are too few to know the spread: the ratio is printed as "unstable",
    # not as a speed-up finding, and the section says why.
    row = next(
        line
        for line in comparisons.splitlines()
        if line.startswith("| bf16 autocast vs fp32 | tiny · warmup 1 | train step |")
    )
    # (only in its own row: another table's cell may hold the same two digits)
    assert speedup > 0 and f"| {speedup:,.2f} |" not in row
    assert f"| {fp32['step_ms']:,.2f} | {bf16['step_ms']:,.2f} | unstable |" in comparisons
    assert "speed-ups rest on unstable timings" in comparisons
    assert "_Skipped: no memory rows, snapshots or peak memory" in section(text, "Memory")
    pictures = sorted(p.name for p in out.parent.glob("*.png"))
    assert pictures == ["report-speedups.png", "report-step-time.png"]
    for name in pictures:
        assert_png(out.parent / name)


def test_run_again_measures_nothing(minimal_run: tuple[Path, Path, Any], tmp_path: Path) -> None:
    profiles, _, _ = minimal_run
    out = tmp_path / "REPORT.md"
    again = invoke("report", "--run", "--plan", "minimal", "--profiles", profiles, "--out", out)
    assert again.exit_code == 0, again.output
    assert again.stderr.count("present ") == 3, again.stderr  # bench, torch, attention
    assert len(db_rows(profiles / "results.db", "select * from bench")) == 4


def test_report_is_the_same_when_nothing_changed(
    minimal_run: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    profiles, _, _ = minimal_run
    first, second = tmp_path / "a" / "REPORT.md", tmp_path / "b" / "REPORT.md"
    for out in (first, second):
        build_report(profiles, None, out)
    assert first.read_text() == second.read_text()


# --- traces and snapshots --------------------------------------------------------------


@pytest.fixture(scope="module")
def traces_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("traces")
    profiles = root / "profiles"
    profiles.mkdir()
    for path in EXAMPLES.glob("small-ctx128-train-fp32.*"):
        shutil.copy(path, profiles)
    for name in ("torch-small-ctx128-train.json.gz", "memory-tiny-ctx64-train-fp32.pickle.xz"):
        shutil.copy(DATA / name, profiles)
    shutil.copy(DATA / "memory-tiny-ctx64-train-fp32.profkit.json", profiles)
    (profiles / "broken.sqlite").write_bytes(b"not a database at all")
    out = root / "reports" / "REPORT.md"
    result = build_report(profiles, None, out)
    assert [s.title for s in result.sections if s.skipped] == [
        "Benchmark", "Comparisons", "Attention",
    ]  # fmt: skip
    return out, out.read_text()


def test_nsys_part_has_phases_kernels_and_attention(traces_report: tuple[Path, str]) -> None:
    out, text = traces_report
    nsys = section(text, "Nsight Systems profiles")
    assert "small, ctx 128, train, fp32 · 2 captured steps · NVIDIA H100 80GB HBM3" in nsys
    assert "| backward | 2 | 2,310 | 74 | 72 | 19.39 | 19.59 | 52.21 | 51.49 | 51.50 |" in nsys
    assert "Top 10 by GPU time (kernels, memcpy, memset), all phases:" in nsys
    assert "| computing softmax | 24 | 24 | 0 | 0 | 0.10 | 0.10 | 0.51 | 3.93 | 0.95 |" in nsys
    assert "(51.4× the FLOPs), yet they take only 6.3× its GPU time" in nsys
    assert "[small-ctx128-train-fp32.md](small-ctx128-train-fp32.md)" in nsys
    assert (out.parent / "small-ctx128-train-fp32.md").read_text().startswith("# Kernels: ")
    # One unreadable export costs its own part only.
    assert "### broken\n\n_Could not read `broken.sqlite`:" in nsys


def test_torch_part_reads_the_chrome_trace(traces_report: tuple[Path, str]) -> None:
    _, text = traces_report
    torch = section(text, "torch.profiler traces")
    assert "### torch-small-ctx128-train" in torch
    assert (
        "small, ctx 128, train, fp32 · 1 captured step · 1,929 kernels, 49 memcpy, 36 memset"
        in torch
    )
    assert "| backward | 1 | 1,155 | 37 | 36 | 9.73 | 9.83 | 52.29 | 41.32 |" in torch


def test_snapshot_part_has_peak_sites_and_timeline(traces_report: tuple[Path, str]) -> None:
    out, text = traces_report
    memory = section(text, "Memory")
    assert "### Snapshot `memory-tiny-ctx64-train-fp32.pickle.xz`" in memory
    assert "Peak allocated **113.9 MiB** during **backward**, 124 allocations" in memory
    assert "| profkit/model.py:86 forward | 5 | 33.00 | 32.00 | 28.97 |" in memory
    picture = "timeline-memory-tiny-ctx64-train-fp32.png"
    assert f"]({picture})" in memory
    assert_png(out.parent / picture)


# --- a multi-rank run -------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Any]:
    """The 2-GPU DDP fixtures: one nsys export of the torchrun tree, per-rank torch traces."""
    root = tmp_path_factory.mktemp("ranks")
    profiles = root / "profiles"
    profiles.mkdir()
    export = profiles / "ddp2.sqlite"
    export.write_bytes(lzma.decompress((DATA / f"{DDP2}.sqlite.xz").read_bytes()))
    shutil.copy(DATA / f"{DDP2}.profkit.json", profiles / "ddp2.profkit.json")
    for rank in (0, 1):
        shutil.copy(DATA / f"torch-h200x2-small-ddp2-rank{rank}.json.gz", profiles)
    out = root / "reports" / "REPORT.md"
    result = build_report(profiles, None, out)
    return out, out.read_text(), result


def _kernels_per_rank(export: Path) -> list[int]:
    """Kernel launches per process, in rank order (GPU, then pid), by plain SQL."""
    rows = db_rows(
        export,
        "SELECT globalPid, min(deviceId) AS device, count(*) AS n "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY globalPid ORDER BY device, globalPid",
    )
    return [row["n"] for row in rows]


def test_a_multi_rank_export_has_its_rank_table_and_lanes(
    ranks_report: tuple[Path, str, Any],
) -> None:
    out, text, result = ranks_report
    nsys = section(text, "Nsight Systems profiles")
    assert "· 2 ranks · 3 captured steps each ·" in nsys
    counts = _kernels_per_rank(out.parent.parent / "profiles" / "ddp2.sqlite")
    assert len(counts) == 2
    for rank, count in enumerate(counts):
        assert re.search(rf"\n\| {rank} \| {rank} \| [\d,]+ \| {count:,} \|", nsys), rank
    picture = out.parent / "ranks-ddp2.png"
    assert "](ranks-ddp2.png)" in nsys
    assert picture in result.images
    assert_png(picture)
    # The full kernel report beside it ends with the same rank tables.
    assert "## Ranks — world size 2" in (out.parent / "ddp2.md").read_text()


def test_per_rank_torch_traces_are_one_part_with_lanes(ranks_report: tuple[Path, str, Any]) -> None:
    out, text, result = ranks_report
    torch = section(text, "torch.profiler traces")
    assert torch.count("\n### ") == 1 and "### torch-h200x2-small-ddp2\n" in torch
    assert "· 2 ranks · 1 captured step each ·" in torch
    for rank in (0, 1):
        doc = json.loads(
            gzip.decompress((DATA / f"torch-h200x2-small-ddp2-rank{rank}.json.gz").read_bytes())
        )
        count = sum(e.get("cat") == "kernel" for e in doc["traceEvents"])
        assert re.search(rf"\n\| {rank} \| {rank} \| [\d,]+ \| {count:,} \|", torch), rank
    picture = out.parent / "ranks-torch-h200x2-small-ddp2.png"
    assert "](ranks-torch-h200x2-small-ddp2.png)" in torch
    assert picture in result.images
    assert_png(picture)


def test_per_rank_torch_traces_of_two_hosts_are_put_on_one_clock(tmp_path: Path) -> None:
    """Rank 1 written as if by another host whose clock runs 3 ms ahead: the report reads
    the ranks as `profkit kernels` does, the offset taken out and the hosts listed."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for rank in (0, 1):
        name = f"torch-h200x2-small-ddp2-rank{rank}.json.gz"
        doc = json.loads(gzip.decompress((DATA / name).read_bytes()))
        if rank == 1:
            doc["profkit"]["host"] = "node1"
            doc["baseTimeNanoseconds"] += 3_000_000
        (profiles / name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    out = tmp_path / "reports" / "REPORT.md"
    build_report(profiles, None, out)
    torch = section(out.read_text(), "torch.profiler traces")
    assert "· 2 ranks · 1 captured step each ·" in torch
    assert "| 1 | node1 | 1 |" in torch  # the rank table names each rank's host
    row = re.search(
        r"\n\| torch-h200x2-small-ddp2-rank1\.json\.gz \| node1 \| 1 \| [\d.,]+ \| ([-\d.,]+) \|"
        r"[^\n]* \| yes \|",
        torch,
    )
    assert row is not None, torch
    # µs; the two GPUs' own clocks differ by a few µs (tests/test_nodes.py has the exact value)
    assert float(row.group(1).replace(",", "")) == pytest.approx(3000, abs=20)


# --- bad input -------------------------------------------------------------------------


def test_nothing_to_report_is_one_line(tmp_path: Path) -> None:
    result = invoke("report", "--profiles", tmp_path, "--out", tmp_path / "r" / "REPORT.md")
    assert result.exit_code == 2
    assert "nothing to report: no bench, attention or memory rows" in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert not (tmp_path / "r" / "REPORT.md").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--db", "NOTDB"], "is not a SQLite database"),
        (["--profiles", "AFILE"], "is a file; give the directory of profiles"),
        (["--plan", "minimal"], "--plan chooses what --run measures; add --run"),
        (["--run", "--plan", "huge"], "unknown --plan 'huge'"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "NOTDB").write_text("hello")
    (tmp_path / "AFILE").write_text("hello")
    args = [str(tmp_path / a) if a in ("NOTDB", "AFILE") else a for a in args]
    result = invoke("report", *args, "--out", tmp_path / "r" / "REPORT.md")
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.fixture(scope="module")
def attention_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real attention table: `profkit attention` on this CPU, two cells."""
    db = tmp_path_factory.mktemp("attention") / "results.db"
    args = ["--d-head", "4", "--seq", "8", "16", "--iters", "1", "--warmup", "0"]
    result = invoke("attention", *args, "--device", "cpu", "--threads", "1", "--db", db)
    assert result.exit_code == 0, result.output
    return db


@pytest.fixture(scope="module")
def memory_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A memory table written by profkit's own writer (result_row, then record, as
    `profkit memory` does); the child's result is made up: capturing needs CUDA."""
    from profkit.memory.capture import result_row
    from profkit.run.results import record

    db = tmp_path_factory.mktemp("memory") / "results.db"
    for ctx, peak_mib in ((64, 100), (128, 180)):
        config = WorkloadConfig(size="tiny", ctx=ctx, device="cuda")
        memory = {"max_memory_allocated_bytes": peak_mib * 2**20, "device_name": GPU}
        result = {"config": config.to_dict(), "status": "ok", "device": "cuda", "memory": memory}
        record(db, "memory", result_row(result, db.parent / f"m{ctx}.pickle"))
    return db


def damaged_report(tmp_path: Path, db: Path, *sql: str) -> tuple[Any, str]:
    """``profkit report`` on a copy of ``db`` with ``sql`` applied; its result and markdown."""
    copy = tmp_path / "results.db"
    shutil.copy(db, copy)
    with sqlite3.connect(copy) as conn:
        for statement in sql:
            conn.execute(statement)
    out = tmp_path / "r" / "REPORT.md"
    result = invoke("report", "--db", copy, "--profiles", tmp_path / "none", "--out", out)
    return result, out.read_text() if out.exists() else ""


@pytest.mark.parametrize(
    ("table", "sql", "message"),
    [
        (
            "attention",
            "ALTER TABLE attention DROP COLUMN seq",
            "its attention table lacks column(s) seq",
        ),
        ("memory", "ALTER TABLE memory DROP COLUMN mode", "its memory table lacks column(s) mode"),
        ("memory", "DROP TABLE memory", "'memory' is a view, not a table of profkit rows"),
    ],
)
def test_an_attention_or_memory_table_profkit_did_not_write_is_one_line(
    attention_db: Path, memory_db: Path, tmp_path: Path, table: str, sql: str, message: str
) -> None:
    db = attention_db if table == "attention" else memory_db
    extra = ["CREATE VIEW memory AS SELECT 1 AS size"] if sql == "DROP TABLE memory" else []
    result, text = damaged_report(tmp_path, db, sql, *extra)
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {tmp_path / 'results.db'}: {message}" + (
        ": not one profkit wrote (or damaged)\n" if "lacks" in message else "\n"
    )
    assert text == ""


def test_damaged_attention_cells_cost_their_rows_only(attention_db: Path, tmp_path: Path) -> None:
    rows = db_rows(attention_db, "SELECT seq, forward_ms FROM attention ORDER BY rowid")
    assert [r["seq"] for r in rows] == [8, 16]
    result, text = damaged_report(
        tmp_path, attention_db, "UPDATE attention SET d_head = 'abc' WHERE seq = 8"
    )
    assert result.exit_code == 0, result.output
    assert (
        "warning: " + f"{tmp_path / 'results.db'}: the attention table: 1 cell(s) held values "
        "of the wrong type or range and read as empty (d_head); 1 row(s) without their d_head "
        "are left out"
    ) in result.stderr
    attention = section(text, "Attention")
    assert f"| 4 | 16 | ok | {rows[1]['forward_ms']:,.2f} |" in attention
    assert "| 4 | 8 |" not in attention


def test_damaged_memory_cells_cost_their_rows_only(memory_db: Path, tmp_path: Path) -> None:
    result, text = damaged_report(
        tmp_path,
        memory_db,
        "UPDATE memory SET size = 'huge' WHERE ctx = 64",
        "ALTER TABLE memory DROP COLUMN nproc",  # a table from before --nproc: default 1
    )
    assert result.exit_code == 0, result.output
    assert "the memory table: 1 cell(s) held values of the wrong type or range" in result.stderr
    assert "1 row(s) without their size are left out" in result.stderr
    memory = section(text, "Memory")
    assert "| tiny-ctx128-train-fp32 | ok | — | — | — | — | 0.18 | — | — |" in memory
    assert "ctx64" not in memory


def test_a_bench_row_without_its_size_is_left_out_not_a_traceback(tmp_path: Path) -> None:
    first, second = db_rows(H100_DB, "SELECT * FROM bench ORDER BY rowid LIMIT 2")
    result, text = damaged_report(tmp_path, H100_DB, "UPDATE bench SET size = NULL WHERE rowid = 1")
    assert result.exit_code == 0, result.output
    assert "the bench table: 1 row(s) without their size are left out" in result.stderr
    bench = section(text, "Benchmark")
    for row, shown in ((first, False), (second, True)):
        cells = f"| {row['ctx']} | {row['dtype']} |", f" {row['forward_ms']:,.2f} |"
        # (with `ok` between where some row of its table failed and the status is shown)
        found = any(cells[0] in line and cells[1] in line for line in bench.splitlines())
        assert found is shown, cells


def test_run_checks_the_db_before_any_piece_runs(tmp_path: Path) -> None:
    """Before: every piece ran (torch.profiler wrote its traces) and each failed on the DB."""
    export = tmp_path / "run.sqlite"
    shutil.copy(DATA / "nsys-2025.3-probe.sqlite", export)
    profiles, out = tmp_path / "profiles", tmp_path / "r" / "REPORT.md"
    args = ["--run", "--plan", "minimal", "--db", export, "--profiles", profiles, "--out", out]
    result = invoke("report", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: {export} is an Nsight Systems export, not a results database (give --db "
        f"another file; `profkit kernels {export}` reads the export)\n"
    )
    assert not profiles.exists() and not out.exists()


def test_help() -> None:
    result = runner.invoke(app, ["report", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "Usage" in result.output
    for option in ("--profiles", "--db", "--out", "--run", "--plan"):
        assert option in result.output


# --- --run -----------------------------------------------------------------------------


def test_one_failing_piece_does_not_stop_the_plan(tmp_path: Path) -> None:
    plan = [
        Piece("attention", "attention: a bad grid", attention={"d_heads": (0,), "device": "cpu"}),
        Piece("nsys", "nsys: needs CUDA", (WorkloadConfig(size="tiny", device="cuda"),)),
        Piece(
            "attention",
            "attention: one small cell",
            attention={"d_heads": (4,), "seqs": (8,), "iters": 1, "warmup": 0, "device": "cpu"},
        ),
    ]
    where = Where(tmp_path / "profiles", tmp_path / "profiles" / "results.db", tmp_path / "r")
    outcomes = run_plan(plan, where)
    assert [o.status for o in outcomes] == ["failed", "skipped", "ran"]
    assert outcomes[0].note == "--d-head values must be positive, got 0"
    assert "needs a CUDA device" in outcomes[1].note


def test_plans_are_declarative_lists() -> None:
    from profkit.report.plan import CPU_PLAN, GPU_PLAN

    assert [p.kind for p in GPU_PLAN] == [
        "bench", "bench", "bench", "nsys", "torch", "memory", "attention",
    ]  # fmt: skip
    course = GPU_PLAN[0].configs
    assert len(course) == 5 * 2 * 2 and {c.device for c in course} == {"cuda"}
    assert {c.size for c in CPU_PLAN[0].configs} == {"tiny"}
    assert all(p.kind != "nsys" or p.configs[0].device == "cuda" for p in MINIMAL_PLAN + CPU_PLAN)


def test_trace_parts_open_with_their_findings(traces_report: tuple[Path, str]) -> None:
    _, text = traces_report
    torch = section(text, "torch.profiler traces")
    part = torch[torch.index("### torch-small-ctx128-train") :]
    assert part.index("Findings:") < part.index("| backward |")
    assert "launch_bound: " in part and "unfused_optimizer (optimizer): " in part
