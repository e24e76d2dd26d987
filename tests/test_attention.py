"""``profkit attention``: the grid, the memory count, and cells isolated from each other."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from typer.testing import CliRunner

from profkit.cli import app
from profkit.studies.attention import AttentionSettings, Cell, measure_cell, new_row
from profkit.studies.attention_memory import analytic_memory, measure_saved_bytes
from profkit.studies.attention_runner import run_attention, run_cells
from profkit.studies.attention_tables import cells_table, side_by_side

runner = CliRunner()
CPU = torch.device("cpu")
SMALL = ["--d-head", "16", "--seq", "64", "128", "--iters", "3", "--warmup", "1"]


def invoke(*args: str) -> list[dict]:
    result = runner.invoke(app, ["attention", *args, "--device", "cpu", "-f", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# By hand, batch 8, seq 64, d_head 16, fp32 (4 bytes):
#   Q, K, V, O, dO: 5 * 8*64*16 * 4   = 163,840
#   naive saves softmax(QK^T) P: 8*64*64 * 4 = 131,072
#   sdpa (flash) saves the logsumexp: 8*64 * 4 = 2,048
@pytest.mark.parametrize(
    ("impl", "dtype", "causal", "backend", "saved", "expected"),
    [
        ("naive", "fp32", False, None, 131_072, 163_840 + 131_072),
        ("naive", "bf16", False, None, 65_536, 81_920 + 65_536),
        # causal: the inverted mask is saved (64*64 bool), the mask itself is held once
        ("naive", "fp32", True, None, 131_072 + 4_096, 163_840 + 135_168 + 4_096),
        ("sdpa", "fp32", False, "flash_attention", 2_048, 163_840 + 2_048),
        ("sdpa", "fp32", False, "cudnn_attention", 2_048, 163_840 + 2_048),
        # memory-efficient pads 64 -> 64 rows (already a multiple of 32)
        ("sdpa", "fp32", False, "efficient_attention", 2_048, 163_840 + 2_048),
        # math: P and the scaled Q and K, in fp32: 4*(8*64*64 + 2*8*64*16)
        ("sdpa", "fp32", False, "math", 196_608, 163_840 + 196_608),
    ],
)
def test_analytic_memory_by_hand(
    impl: str, dtype: str, causal: bool, backend: str | None, saved: int, expected: int
) -> None:
    memory = analytic_memory(8, 64, 16, dtype, impl, causal, backend)
    assert memory["saved_bytes"] == saved
    assert memory["expected_bytes"] == expected


def test_efficient_attention_pads_logsumexp_rows_to_32() -> None:
    assert (
        analytic_memory(8, 100, 16, "fp32", "sdpa", False, "efficient_attention")["saved_bytes"]
        == 8 * 128 * 4
    )


@pytest.mark.parametrize(
    "cell",
    [
        Cell("naive", False, "fp32", 16, 64),
        Cell("naive", False, "bf16", 32, 128),
        Cell("sdpa", False, "fp32", 16, 64),
        Cell("sdpa", False, "bf16", 16, 96),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_analytic_count_matches_what_autograd_saves(cell: Cell, causal: bool) -> None:
    settings = AttentionSettings(iters=1, warmup=0, device="cpu", causal=causal)
    row = measure_cell(settings, cell, CPU)
    assert row["status"] == "ok", row["error"]
    assert row["saved_measured_bytes"] == row["saved_bytes"] > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_analytic_count_of_the_sdpa_math_fallback(dtype: torch.dtype) -> None:
    q, k, v = (torch.randn(8, 64, 16, dtype=dtype, requires_grad=True) for _ in range(3))

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.scaled_dot_product_attention(
            q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        )
        return out.squeeze(1)

    with sdpa_kernel(SDPBackend.MATH):
        saved = measure_saved_bytes(attend, q, k, v)
    name = "fp32" if dtype == torch.float32 else "bf16"
    assert saved == analytic_memory(8, 64, 16, name, "sdpa", False, "math")["saved_bytes"]


def test_small_grid_on_cpu() -> None:
    rows = invoke(*SMALL)
    assert [(r["d_head"], r["seq"], r["status"]) for r in rows] == [(16, 64, "ok"), (16, 128, "ok")]
    for r in rows:
        assert r["forward_ms"] > 0 and r["backward_ms"] > 0
        assert r["forward_ms_std"] >= 0 and r["backward_ms_std"] >= 0
        assert (r["batch"], r["iters"], r["warmup"], r["impl"], r["compile"]) == (
            8,
            3,
            1,
            "naive",
            False,
        )
        assert r["saved_bytes"] == r["saved_measured_bytes"] == 8 * r["seq"] ** 2 * 4
        assert r["memory_before_backward_bytes"] is None  # CUDA only
    assert rows[0]["expected_bytes"] == 294_912


def test_table_output_has_the_grid_and_no_cuda_columns() -> None:
    result = runner.invoke(app, ["attention", *SMALL, "--device", "cpu", "-f", "md"])
    assert result.exit_code == 0, result.output
    assert "### Attention: naive eager fp32, batch 8, 3 timed passes, cpu" in result.stdout
    header = result.stdout.splitlines()[2]
    assert header.startswith("| d_head | seq | status | fwd ms | fwd ± | bwd ms | bwd ± |")
    assert "expected MiB | saved MiB | saved (hooks) MiB |" in header
    assert "before bwd" not in header  # nothing measured it on a CPU
    assert "| 16 | 64 | ok |" in result.stdout
    assert "Side by side" not in result.stdout


def test_two_impls_side_by_side() -> None:
    args = ["--d-head", "16", "--seq", "64", "--iters", "2", "--warmup", "0", "--impl", "naive"]
    result = runner.invoke(app, ["attention", *args, "sdpa", "--device", "cpu", "-f", "md"])
    assert result.exit_code == 0, result.output
    assert "### Side by side" in result.stdout
    assert "| d_head | seq | fwd ms naive | fwd ms sdpa | fwd speed-up |" in result.stdout
    assert "flash_attention" in result.stdout


def _row(cell: Cell, status: str, forward: float | None, backward: float | None) -> dict:
    row = new_row(AttentionSettings(device="cpu"), cell, CPU)
    row.update(status=status, forward_ms=forward, backward_ms=backward)
    return row


def test_side_by_side_ratio_and_failed_cells() -> None:
    rows = [
        _row(Cell("naive", False, "fp32", 16, 256), "ok", 4.0, 9.0),
        _row(Cell("naive", True, "fp32", 16, 256), "ok", 2.0, 3.0),
        _row(Cell("naive", False, "fp32", 16, 16384), "ok", 50.0, None),
        _row(Cell("naive", True, "fp32", 16, 16384), "oom", None, None),
    ]
    rows[2]["status"] = "oom"  # the forward finished, the backward did not
    table = side_by_side(rows)
    assert table is not None
    records = table.astype(object).where(table.notna(), None).to_dict(orient="records")
    assert records == [
        {
            "d_head": 16,
            "seq": 256,
            "fwd ms eager": 4.0,
            "fwd ms compiled": 2.0,
            "fwd speed-up": 2.0,
            "bwd ms eager": 9.0,
            "bwd ms compiled": 3.0,
            "bwd speed-up": 3.0,
        },
        {
            "d_head": 16,
            "seq": 16384,
            "fwd ms eager": 50.0,
            "fwd ms compiled": "oom",
            "fwd speed-up": None,
            "bwd ms eager": "oom",
            "bwd ms compiled": "oom",
            "bwd speed-up": None,
        },
    ]
    assert list(cells_table(rows)["variant"]) == ["eager", "compiled", "eager", "compiled"]


def test_oom_cell_is_kept_and_the_next_cell_runs() -> None:
    # seq 2^22 asks for an 8 x 2^22 x 2^22 fp32 score matrix: 512 TiB, more than a 47-bit
    # address space, so the allocator refuses it at once whatever the overcommit policy
    # (Q, K, V themselves are 128 MiB each). The guard would skip it; here it must fail.
    settings = AttentionSettings(
        d_heads=(1,), seqs=(4_194_304, 64), iters=2, warmup=0, device="cpu", memory_guard=False
    )
    rows = run_cells(settings, settings.cells())
    assert [r["status"] for r in rows] == ["oom", "ok"]
    assert rows[0]["error"].startswith("forward: ")
    assert "can't allocate memory" in rows[0]["error"]
    assert rows[0]["saved_bytes"] == 8 * 4_194_304**2 * 4  # the count says why
    assert rows[1]["forward_ms"] > 0 and rows[1]["pid"] == rows[0]["pid"] == os.getpid()


def test_cells_beyond_host_memory_are_skipped_on_cpu() -> None:
    rows = invoke("--d-head", "1", "--seq", "4194304", "64", "--iters", "2", "--warmup", "0")
    assert [r["status"] for r in rows] == ["skipped", "ok"]
    assert rows[0]["error"].startswith("needs about 2,097,153.0 GiB by the count")
    assert rows[0]["forward_ms"] is None and rows[0]["wall_s"] is None


@pytest.mark.slow
def test_failure_moves_the_rest_to_a_fresh_child() -> None:
    # A negative d_head passes no validation, so the cells are built by hand: torch raises
    # a real RuntimeError, which is not an OOM, and the remaining cells leave this process.
    settings = AttentionSettings(iters=1, warmup=0, device="cpu")
    cells = [
        Cell("naive", False, "fp32", 16, 32),
        Cell("naive", False, "fp32", -1, 32),
        Cell("sdpa", False, "fp32", 16, 32),
        Cell("naive", False, "fp32", 8, 32),
    ]
    started: list[Cell] = []
    rows = run_cells(settings, cells, started.append)
    assert [r["status"] for r in rows] == ["ok", "error", "ok", "ok"]
    assert "negative dimension -1" in rows[1]["error"]
    assert rows[0]["pid"] == rows[1]["pid"] == os.getpid()
    assert rows[2]["pid"] == rows[3]["pid"] != os.getpid()
    assert rows[2]["saved_measured_bytes"] == rows[2]["saved_bytes"]
    assert started == cells


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a child that cannot start")
def test_child_that_dies_becomes_an_error_row() -> None:
    # A child told to use CUDA where there is none dies before writing any row.
    settings = AttentionSettings(iters=1, warmup=0, device="cpu", isolate="process")
    object.__setattr__(settings, "device", "cuda")  # past validation, as a stale config would be
    rows = run_cells(settings, [Cell("naive", False, "fp32", 16, 32)])
    assert len(rows) == 1 and rows[0]["status"] == "error"
    assert rows[0]["error"].startswith("child exited with status 1 without a result")
    assert "CUDA" in rows[0]["error"] and rows[0]["pid"] is None


def test_interrupt_keeps_the_finished_cells() -> None:
    settings = AttentionSettings(d_heads=(16,), seqs=(32, 64, 96), iters=1, warmup=0, device="cpu")

    def interrupt_at_the_second(cell: Cell) -> None:
        if cell.seq == 64:
            raise KeyboardInterrupt

    rows = run_attention(settings, on_start=interrupt_at_the_second)
    assert [(r["seq"], r["status"]) for r in rows] == [
        (32, "ok"),
        (64, "interrupted"),
        (96, "interrupted"),
    ]
    assert rows[0]["forward_ms"] > 0 and rows[1]["forward_ms"] is None


def test_isolate_process_runs_the_cell_in_a_child() -> None:
    rows = invoke(
        "--d-head", "16", "--seq", "32", "--iters", "2", "--warmup", "0", "--isolate", "process"
    )
    assert [r["status"] for r in rows] == ["ok"]
    assert rows[0]["pid"] != os.getpid() and rows[0]["backward_ms"] > 0


@pytest.mark.slow
def test_compiled_next_to_eager_on_cpu() -> None:
    rows = invoke(
        "--d-head", "16", "--seq", "64", "--iters", "2", "--warmup", "1", "--compile", "both"
    )
    assert [(r["compile"], r["status"]) for r in rows] == [(False, "ok"), (True, "ok")]
    assert rows[1]["saved_measured_bytes"] is None  # compiled graphs save their own set


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seq", "-5"], "--seq values must be positive, got -5"),
        (["--d-head", "0"], "--d-head values must be positive, got 0"),
        (["--impl", "flash"], "unknown --impl 'flash'; choose one of: naive, sdpa"),
        (["--dtype", "fp8"], "unknown --dtype 'fp8'"),
        (["--compile", "maybe"], "unknown --compile 'maybe'"),
        (["--iters", "0"], "--iters must be at least 1, got 0"),
        (["--warmup", "-1"], "--warmup must be 0 or more, got -1"),
        # past 64 bits: an OverflowError storing the row, before
        (["--iters", str(10**20)], "--iters must be at most 2,147,483,647, got 100,000,000,"),
        (["--seq", "8", str(10**20)], "--seq must be at most 2,147,483,647, got 100,000,000,"),
        (["--batch", "5000"], "--batch must be at most 4,096, got 5,000"),
        (["--batch", "0"], "--batch must be at least 1, got 0"),
        (["--device", "tpu"], "unknown --device 'tpu'"),
        (["--isolate", "thread"], "unknown --isolate 'thread'"),
        (["--format", "xml"], "unknown --format 'xml'"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["attention", "--seq", "64", "--d-head", "16", *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_cuda_without_cuda_is_one_line() -> None:
    result = runner.invoke(app, ["attention", "--seq", "64", "--device", "cuda"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --device cuda: no CUDA device is visible here (try --device cpu)"
    )


def test_help() -> None:
    result = runner.invoke(app, ["attention", "--help"])
    assert result.exit_code == 0
    assert "--d-head" in result.stdout and "--isolate" in result.stdout


@pytest.mark.gpu
def test_cuda_memory_before_backward_matches_the_count() -> None:
    settings = AttentionSettings(iters=3, warmup=1, device="cuda")
    device = torch.device("cuda")
    from profkit.studies.attention import prime_device

    prime_device(device, ("fp32",))
    for cell in (Cell("naive", False, "fp32", 64, 1024), Cell("sdpa", False, "fp32", 64, 1024)):
        row = measure_cell(settings, cell, device)
        assert row["status"] == "ok", row["error"]
        measured, expected = row["memory_before_backward_bytes"], row["expected_bytes"]
        assert abs(measured - expected) <= 0.02 * expected + 64 * 1024, (cell, measured, expected)


@pytest.mark.gpu
def test_cuda_oom_cell_is_kept_and_the_next_cell_runs() -> None:
    settings = AttentionSettings(
        d_heads=(16,), seqs=(1_048_576, 1024), iters=2, warmup=1, device="cuda"
    )
    rows = run_cells(settings, settings.cells())
    assert [r["status"] for r in rows] == ["oom", "ok"]
    assert rows[1]["pid"] == os.getpid()  # an OOM needs no fresh process
    assert rows[1]["memory_before_backward_bytes"] > 0


def test_rows_are_stored_in_the_results_db(tmp_path) -> None:
    import sqlite_utils

    db = tmp_path / "results.db"
    result = runner.invoke(app, ["attention", *SMALL, "--device", "cpu", "--db", str(db)])
    assert result.exit_code == 0, result.output
    rows = list(sqlite_utils.Database(db)["attention"].rows)
    assert [(r["d_head"], r["seq"], r["status"]) for r in rows] == [(16, 64, "ok"), (16, 128, "ok")]
    assert len({r["run_id"] for r in rows}) == 1 and rows[0]["torch_version"]


def test_resume_on_an_attention_table_profkit_did_not_write_is_one_line(tmp_path) -> None:
    db = tmp_path / "results.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE attention (status TEXT, batch INTEGER)")
        conn.execute("INSERT INTO attention VALUES ('ok', 8)")
    result = runner.invoke(
        app, ["attention", *SMALL, "--device", "cpu", "--db", str(db), "--resume"]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: {db}: its attention table lacks column(s) impl, compile, dtype, d_head, seq, "
        "causal, iters, warmup, device: not one profkit wrote (or damaged)\n"
    )
    with sqlite3.connect(db) as conn:  # nothing written into it
        assert conn.execute("SELECT * FROM attention").fetchall() == [("ok", 8)]


def test_counting_saved_tensors_leaks_nothing() -> None:
    """Regression: the count once kept the softmax output alive for the rest of the process."""
    import gc

    from profkit.studies.attention import _attention_fn
    from profkit.studies.attention_memory import measure_saved_bytes

    batch, seq, d_head = 8, 64, 16

    def live_squares() -> set[int]:  # real tensors only: compile tests leave FakeTensors
        gc.collect()
        return {
            id(o)
            for o in gc.get_objects()
            if type(o) is torch.Tensor and o.numel() == batch * seq**2
        }

    q, k, v = (torch.randn(batch, seq, d_head, requires_grad=True) for _ in range(3))
    fn = _attention_fn(Cell("naive", False, "fp32", d_head, seq), False, CPU)
    before = live_squares()
    assert measure_saved_bytes(fn, q, k, v) == batch * seq * seq * 4
    assert live_squares() - before == set()


def test_cpu_defaults_finish_and_help_states_them() -> None:
    cpu = AttentionSettings.with_defaults("cpu")
    assert (cpu.d_heads, cpu.seqs, cpu.iters) == ((16, 32, 64, 128), (256, 512, 1024), 10)
    given = AttentionSettings.with_defaults("cpu", seqs=(64,), iters=3)
    assert (given.seqs, given.iters) == ((64,), 3)
    text = runner.invoke(app, ["attention", "--help"], env={"COLUMNS": "300"}).stdout
    assert "(CPU: 256 512 1024)" in text and "default 100 (CPU: 10)" in text


def test_each_finished_cell_is_a_line_on_stderr_with_the_thread_count() -> None:
    result = runner.invoke(app, ["attention", *SMALL, "--device", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert [line.split()[0] for line in lines] == ["[1/2]", "[2/2]"]
    assert "naive eager fp32 d_head 16 seq 64" in lines[0] and " ok " in lines[0]
    rows = json.loads(result.stdout)
    assert {r["threads"] for r in rows} == {1}  # OMP_NUM_THREADS=1 in the tests
