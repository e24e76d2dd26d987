"""``profkit compare`` and ``profkit bench --compare``: course-report comparisons from bench rows.

Golden numbers come from a real results DB written by ``profkit bench`` on an H100
(tests/data/results-h100.db: the five course sizes at ctx 256, forward and train, fp32 and
bf16, plus a 2.7B ctx 1024 OOM and a small ctx 1024 row from a second sweep). The warm-up
comparison runs a real tiny sweep on the CPU.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from profkit.analysis import compare as compare_lib
from profkit.cli import app
from profkit.run import bench as bench_lib
from profkit.run import results

H100_DB = Path(__file__).parent / "data" / "results-h100.db"
SIZES = ["small", "medium", "large", "xl", "2.7B"]
WARMUP_SWEEP = [
    "--size", "tiny", "--ctx", "16", "--mode", "train", "--warmup", "0", "1",
    "--steps", "2", "--device", "cpu", "--compare", "warmup",
]  # fmt: skip

runner = CliRunner()


def invoke(*args: str | Path) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def by_key(records: list[dict[str, Any]]) -> dict[tuple[str, int, str, str], dict[str, Any]]:
    return {(r["size"], r["ctx"], r["mode"], r["phase"]): r for r in records}


def db_count(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return int(conn.execute("select count(*) from bench").fetchone()[0])


def add_variant(db: Path, row: dict[str, Any], **changes: Any) -> None:
    """Store a copy of a real row as another variant (what the CPU cannot produce: an OOM)."""
    copy = {**row, **changes}
    key = json.loads(row["config_key"])
    key.update({k: v for k, v in changes.items() if k in key})
    copy["config_key"] = json.dumps(key, sort_keys=True)
    with results.opened(db) as handle:
        results.insert(handle, bench_lib.TABLE, copy, bench_lib.COLUMN_TYPES)


# --- the H100 DB: fp32 vs bf16 ---------------------------------------------------------


def test_dtype_json_has_the_golden_numbers() -> None:
    result = invoke("compare", "dtype", "--db", H100_DB, "-f", "json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)  # stdout is the JSON and nothing else
    # Forward mode: one phase; train: forward, forward+backward, optimizer, step.
    assert len(records) == 5 * (1 + 4)
    assert [r["size"] for r in records if r["phase"] == "step"] == SIZES

    step = by_key(records)[("large", 256, "train", "step")]
    assert step["compare"] == "dtype" and step["baseline"] == "fp32"
    assert (step["warmup"], step["steps"], step["gpu_name"]) == (5, 10, "NVIDIA H100 80GB HBM3")
    fp32, bf16 = step["variants"]
    assert [(v["dtype"], v["status"]) for v in (fp32, bf16)] == [("fp32", "ok"), ("bf16", "ok")]
    assert fp32["mean_ms"] == 210.76878209999563 and bf16["mean_ms"] == 127.64633660000159
    assert fp32["delta_ms"] is None and fp32["change_pct"] is None
    assert bf16["delta_ms"] == pytest.approx(-83.12244549999404, abs=1e-9)
    assert round(bf16["change_pct"], 2) == -39.44
    assert bf16["first_ms"] == 121.96980699999926 and bf16["median_ms"] == 125.87503399998923

    fwd_bwd = by_key(records)[("large", 256, "train", "forward+backward")]["variants"]
    assert fwd_bwd[0]["mean_ms"] == pytest.approx(61.362451899996984 + 118.32910979999838)
    assert fwd_bwd[1]["mean_ms"] == pytest.approx(42.70998120000229 + 54.09041900000062)
    assert round(fwd_bwd[1]["change_pct"], 2) == -46.13
    forward = by_key(records)[("2.7B", 256, "forward", "forward")]["variants"]
    assert (round(forward[0]["mean_ms"], 2), round(forward[1]["mean_ms"], 2)) == (168.67, 34.84)
    assert round(forward[1]["change_pct"], 2) == -79.34

    # The rows without a bf16 twin are named, not silently dropped.
    assert "left out, no other dtype to compare with: 2.7B-ctx1024-train-fp32, " in result.stderr


def test_single_phase_means_are_the_db_values_bit_for_bit() -> None:
    rows = {(r["size"], r["ctx"], r["mode"], r["dtype"]): r for r in bench_lib.load(H100_DB)}
    comparison = compare_lib.compare(rows.values(), "dtype")
    checked = 0
    for block in comparison.blocks:
        if block.phase == "forward+backward":
            continue
        for cell in block.cells:
            row = rows[
                (block.fixed["size"], block.fixed["ctx"], block.fixed["mode"], cell["value"])
            ]
            assert cell["mean_ms"] == row[f"{block.phase}_ms"]
            assert cell["std_ms"] == row[f"{block.phase}_ms_std"]
            assert cell["median_ms"] == row[f"{block.phase}_ms_median"]
            checked += 1
    assert checked == 2 * (5 + 5 * 3)


def test_markdown_tables_read_like_the_course_report() -> None:
    result = invoke("compare", "dtype", "--db", H100_DB, "--size", "large", "xl", "-f", "md")
    assert result.exit_code == 0, result.output
    sections = result.stdout.split("### ")[1:]
    assert [s.splitlines()[0] for s in sections] == [
        f"{phase} ms · fp32 vs bf16 · NVIDIA H100 80GB HBM3"
        for phase in ("forward", "forward+backward", "optimizer", "step")
    ]
    forward, fwd_bwd, _, step = sections
    assert "| size | ctx | mode | fp32 ms | bf16 ms | Δ ms | Δ % |" in forward
    assert "| large | 256 | forward | 60.51 | 39.48 | -21.03 | -34.75 |" in forward
    assert "| xl | 256 | train | 120.82 | 52.94 | -67.89 | -56.19 |" in forward
    assert "| large | 256 | train | 179.69 | 96.80 | -82.89 | -46.13 |" in fwd_bwd
    assert step.splitlines()[4:] == [
        "| large | 256 | train | 210.77 | 127.65 | -83.12 | -39.44 |",
        "| xl | 256 | train | 414.51 | 187.04 | -227.47 | -54.88 |",
    ]
    assert "left out" not in result.stderr  # the filter left every row with a twin


def test_terminal_table_csv_and_out(tmp_path: Path) -> None:
    table = invoke("compare", "dtype", "--db", H100_DB, "--mode", "train", "--size", "large")
    assert table.exit_code == 0, table.output
    assert "step ms · fp32 vs bf16" in table.stdout and "-39.44" in table.stdout

    csv = invoke("compare", "dtype", "--db", H100_DB, "-f", "csv", "--size", "large")
    lines = csv.stdout.splitlines()
    assert lines[0] == "phase,size,ctx,mode,fp32 ms,bf16 ms,Δ ms,Δ %"  # one header, one table
    assert len(lines) == 1 + 5 and lines[-1].startswith("step,large,256,train,210.768782")

    out = tmp_path / "reports" / "bf16.md"
    written = invoke("compare", "dtype", "--db", H100_DB, "-f", "md", "--out", out)
    assert written.exit_code == 0 and written.stdout == ""
    assert "| 2.7B | 256 | train | 612.60 | 202.80 | -409.80 | -66.90 |" in out.read_text()


def test_mode_comparison_keeps_only_the_phases_both_modes_have() -> None:
    result = invoke("compare", "mode", "--db", H100_DB, "--size", "large", "-f", "json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert [(r["dtype"], r["phase"], r["baseline"]) for r in records] == [
        ("fp32", "forward", "forward"),
        ("bf16", "forward", "forward"),
    ]
    forward_mode, train_mode = records[0]["variants"]
    assert (forward_mode["mode"], train_mode["mode"]) == ("forward", "train")
    assert round(train_mode["change_pct"], 2) == 1.41  # 60.51 -> 61.36 ms


# --- OOM and failed cells ----------------------------------------------------------------


@pytest.fixture
def oom_db(tmp_path: Path) -> Path:
    """The H100 DB, plus a bf16 twin of its 2.7B ctx 1024 OOM (an OOM too) and a failed
    bf16 twin of its small ctx 1024 row."""
    db = tmp_path / "results.db"
    shutil.copy(H100_DB, db)
    db.chmod(0o644)
    rows = {(r["size"], r["ctx"]): r for r in bench_lib.load(db)}
    add_variant(db, rows[("2.7B", 1024)], dtype="bf16", label="2.7B-ctx1024-train-bf16")
    times = dict.fromkeys(
        [f"{p}_ms{s}" for p in bench_lib.PHASES for s in ("", "_std", "_min", "_median", "_max")]
    )
    add_variant(
        db, rows[("small", 1024)], dtype="bf16", status="error", error="crashed", **times,
        **{field: [] for field in bench_lib.LIST_FIELDS},
    )  # fmt: skip
    return db


def test_oom_and_failed_cells_are_shown_as_such(oom_db: Path) -> None:
    result = invoke("compare", "dtype", "--db", oom_db, "--ctx", "1024", "-f", "md")
    assert result.exit_code == 0, result.output
    forward = result.stdout.split("### ")[1]
    assert forward.splitlines()[4:6] == [
        "| small | 1,024 | train | 38.83 | failed | — | — |",
        "| 2.7B | 1,024 | train | OOM | OOM | — | — |",
    ]
    assert "left out" not in result.stderr

    as_json = invoke("compare", "dtype", "--db", oom_db, "--ctx", "1024", "-f", "json")
    records = json.loads(as_json.stdout)
    statuses = {(r["size"], r["phase"]): [v["status"] for v in r["variants"]] for r in records}
    assert statuses[("2.7B", "step")] == ["oom", "oom"]
    assert statuses[("small", "optimizer")] == ["ok", "error"]
    oom = by_key(records)[("2.7B", 1024, "train", "step")]["variants"][1]
    assert oom["mean_ms"] is None and oom["delta_ms"] is None and oom["change_pct"] is None


def test_a_later_error_row_does_not_hide_a_finished_one(oom_db: Path) -> None:
    rows = bench_lib.load(oom_db)
    large_bf16 = next(r for r in rows if r["label"] == "large-ctx256-train-bf16")
    crashed = {**large_bf16, "status": "error", "step_ms": None, "step_times_ms": []}
    comparison = compare_lib.compare([*rows, crashed], "dtype")
    blocks = {(b.fixed["size"], b.fixed["mode"], b.phase): b for b in comparison.blocks}
    step = blocks[("large", "train", "step")]
    assert step.cells[1]["status"] == "ok" and step.cells[1]["mean_ms"] == 127.64633660000159


def test_three_variants_show_each_against_the_baseline() -> None:
    rows = bench_lib.load(H100_DB)
    bf16 = next(r for r in rows if r["label"] == "large-ctx256-train-bf16")
    fp16 = {**bf16, "dtype": "fp16", "config_key": None}
    frame = compare_lib.table(compare_lib.compare([fp16, *rows], "dtype"))
    assert list(frame.columns)[4:] == [
        "fp32 ms", "bf16 ms", "fp16 ms", "Δ ms bf16", "Δ % bf16", "Δ ms fp16", "Δ % fp16",
        "stability",
    ]  # fmt: skip
    # Steps of small forward fp32 on the H100 spread 13.4% (> 10%): its rows say so.
    flagged = frame[frame["stability"].notna()]
    assert set(zip(flagged["size"], flagged["mode"], flagged["stability"], strict=True)) == {
        ("small", "forward", "unstable: fp32")
    }
    step = frame[(frame["phase"] == "step") & (frame["size"] == "large")].iloc[0]
    assert step["Δ % fp16"] == step["Δ % bf16"] == pytest.approx(-39.43774057609633)
    assert pd.isna(frame[(frame["phase"] == "step") & (frame["size"] == "xl")].iloc[0]["fp16 ms"])


# --- nothing to compare, bad input ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compile"], "nothing to compare: every bench row has the same compile (no); "
                      "run two, e.g. profkit bench --compile both"),
        (["attention"], "every bench row has the same attention (naive)"),
        (["warmup"], "nothing to compare: no two bench rows differ only in warmup "
                     "(its values 2 5 come with other settings that differ too)"),
        (["dtype", "--ctx", "1024", "--size", "small"],
         "every bench row has the same dtype (fp32); run two, e.g. profkit bench --dtype fp32 bf16"),
        (["dtype", "--size", "huge"],
         "nothing to compare: no bench row has --size huge (there are: small medium large xl 2.7B)"),
        (["dtype", "--compile", "yes"], "no bench row has --compile yes (there are: no)"),
        (["dtype", "--compile", "maybe"], "unknown --compile 'maybe'"),
        (["size"], "cannot compare 'size'; choose one of: dtype, compile, warmup, attention, mode"),
        (["dtype", "-f", "xml"], "unknown --format 'xml'"),
    ],
)  # fmt: skip
def test_nothing_to_compare_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = invoke("compare", *args, "--db", H100_DB)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_missing_empty_and_wrong_kind_dbs(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"  # a results DB without a bench table
    results.record(empty, "notes", {"x": 1})
    text = tmp_path / "notes.db"
    text.write_text("not a database")
    for db, message in [
        (tmp_path / "none.db", f"no results database at {tmp_path / 'none.db'}"),
        (empty, f"nothing to compare: {empty} holds no bench rows"),
        (text, "is not a SQLite database"),
    ]:
        result = invoke("compare", "dtype", "--db", db)
        assert result.exit_code == 2 and message in result.stderr, result.output
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "none.db").exists()  # reading never creates a DB


# --- bench --compare: a real tiny CPU sweep ---------------------------------------------------


@pytest.fixture(scope="module")
def warmup_sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """`profkit bench ... --warmup 0 1 --compare warmup`, for real, one process per config."""
    db = tmp_path_factory.mktemp("warmup") / "results.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # see test_bench: 2 busy cores
        result = invoke("bench", *WARMUP_SWEEP, "--db", db, "-f", "json")
        assert result.exit_code == 0, result.output
        yield db, json.loads(result.stdout)


def test_bench_compare_warmup_from_a_real_sweep(warmup_sweep: tuple[Path, Any]) -> None:
    db, records = warmup_sweep
    cold, warm = bench_lib.load(db)
    assert (cold["warmup"], warm["warmup"]) == (0, 1)
    assert [r["phase"] for r in records] == ["forward", "forward+backward", "optimizer", "step"]
    step = records[-1]
    assert step["baseline"] == 0 and [v["warmup"] for v in step["variants"]] == [0, 1]
    for variant, row in zip(step["variants"], (cold, warm), strict=True):
        assert variant["mean_ms"] == row["step_ms"] and variant["std_ms"] == row["step_ms_std"]
        assert variant["median_ms"] == row["step_ms_median"]
        assert variant["first_ms"] == row["step_times_ms"][0]
    assert step["variants"][1]["change_pct"] == pytest.approx(
        100 * (warm["step_ms"] - cold["step_ms"]) / cold["step_ms"]
    )
    fwd_bwd = records[1]["variants"][0]
    assert fwd_bwd["first_ms"] == cold["forward_times_ms"][0] + cold["backward_times_ms"][0]


def test_warmup_table_shows_the_first_step_next_to_the_median(
    warmup_sweep: tuple[Path, Any],
) -> None:
    db, _ = warmup_sweep
    cold = bench_lib.load(db)[0]
    result = invoke("compare", "warmup", "--db", db, "-f", "md")
    assert result.exit_code == 0, result.output
    step = result.stdout.split("### ")[-1]
    assert step.startswith("step ms by warm-up steps (0, 1) · cpu · first timed step vs median")
    header = "| size | ctx | mode | warmup | mean ms | std ms | Δ % | median ms | first ms | first ÷ median |"  # fmt: skip
    assert header in step
    first, median = cold["step_times_ms"][0], cold["step_ms_median"]
    assert (
        f"| tiny | 16 | train | 0 | {cold['step_ms']:,.2f} | {cold['step_ms_std']:,.2f} | — | "
        f"{median:,.2f} | {first:,.2f} | {first / median:,.2f} |"
    ) in step


def test_bench_compare_with_resume_runs_nothing(warmup_sweep: tuple[Path, Any]) -> None:
    db, records = warmup_sweep
    again = invoke("bench", *WARMUP_SWEEP, "--db", db, "--resume", "-f", "json")
    assert again.exit_code == 0, again.output
    assert again.stderr.count("in the DB already (ok), skipped") == 2 and db_count(db) == 2
    assert json.loads(again.stdout) == records


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compare", "dtype"],
         "--compare dtype needs two dtype values in the sweep, e.g. --dtype fp32 bf16"),
        (["--warmup", "0", "1", "--compare", "steps"], "cannot compare 'steps'"),
    ],
)  # fmt: skip
def test_bench_compare_fails_before_the_sweep(
    tmp_path: Path, args: list[str], message: str
) -> None:
    db = tmp_path / "results.db"
    result = invoke("bench", "--size", "tiny", "--device", "cpu", *args, "--db", db)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert result.stderr.count("\n") == 1 and not db.exists()


def test_help() -> None:
    compare_help = invoke("compare", "--help")
    assert compare_help.exit_code == 0 and "Usage" in compare_help.output
    assert "FIELD" in compare_help.output
    bench_help = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert "--compare" in bench_help.output
