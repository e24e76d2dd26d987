"""``profkit diff A B`` on real H100 captures, with the expected numbers taken from plain SQL
on the exports (and the Chrome trace's own JSON), not from profkit's tables."""

from __future__ import annotations

import gzip
import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cli_run import profkit
from nsys_data import DATA, SMALL_BF16, SMALL_FP32, sql_activity_totals, sql_counts, unpack
from typer.testing import CliRunner

from profkit.analysis.diff import match_key
from profkit.cli import app

runner = CliRunner()
SMALL_COMPILED = "nsys-2025.3-h100-small-compiled"
TORCH_TRAIN = DATA / "torch-small-ctx128-train.json.gz"  # small ctx128 train, 1 step, H100
STEPS = 2  # each nsys fixture holds two captured steps
KERNELS = (
    "SELECT s.value AS name, k.end - k.start AS d "
    "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
)
# The gemm category's rules, as SQL (LIKE ignores ASCII case, as the rules do).
GEMM = " OR ".join(
    f"name LIKE '%{p}%'" for p in ("gemm", "nvjet", "xmma", "cutlass", "splitkreduce")
)


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    into = tmp_path_factory.mktemp("nsys")
    return {
        "fp32": unpack(SMALL_FP32, into),
        "bf16": unpack(SMALL_BF16, into),
        "compiled": unpack(SMALL_COMPILED, into),
    }


def sql(path: Path, query: str) -> Any:
    with sqlite3.connect(path) as conn:
        return conn.execute(query).fetchone()


def names(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute(f"SELECT DISTINCT name FROM ({KERNELS})")}


def diff(*args: str | Path) -> Any:
    result = runner.invoke(app, ["diff", *map(str, args), "-f", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def rows(table: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {row[key]: row for row in table}


def ms(ns: int) -> float:
    return ns / STEPS / 1e6


def test_fp32_vs_bf16_phases_categories_and_kernels(exports: dict[str, Path]) -> None:
    fp32, bf16 = exports["fp32"], exports["bf16"]
    out = diff(fp32, bf16, "--top", "0")
    assert out["a"]["path"] == str(fp32) and out["a"]["format"] == "nsys-sqlite"
    assert out["a"]["steps"] == out["b"]["steps"] == STEPS and out["per_step"] is True
    total = rows(out["phases"], "phase")["total"]
    (a_count, a_ns), (b_count, b_ns) = sql_activity_totals(fp32), sql_activity_totals(bf16)
    assert (a_count, a_ns, b_count, b_ns) == (4028, 37_580_731, 4424, 20_899_933)
    # kernels are kernel launches (3,858 and 4,326); the times sum every activity.
    a_kernels, b_kernels = (sql_counts(p)["kernels"][0] for p in (fp32, bf16))
    assert (a_kernels, b_kernels) == (3858, 4326)
    assert total["a_kernels"] == a_kernels / STEPS and total["b_kernels"] == b_kernels / STEPS
    assert total["a_ms"] == pytest.approx(ms(a_ns)) and total["b_ms"] == pytest.approx(ms(b_ns))
    assert total["delta_ms"] == pytest.approx(ms(b_ns - a_ns))
    assert total["delta_pct"] == pytest.approx(100 * (b_ns - a_ns) / a_ns)
    assert [r["phase"] for r in out["phases"]] == ["forward", "backward", "optimizer", "total"]
    # The category view compares gemm fp32 with gemm bf16 directly: 84.7% less gemm time.
    gemm = rows(out["categories"], "category")["gemm"]
    a_gemm, b_gemm = (
        sql(fp32, f"SELECT COUNT(*), SUM(d) FROM ({KERNELS}) WHERE {GEMM}"),
        sql(bf16, f"SELECT COUNT(*), SUM(d) FROM ({KERNELS}) WHERE {GEMM}"),
    )
    assert (
        (gemm["a_kernels"], gemm["b_kernels"])
        == (a_gemm[0] / STEPS, b_gemm[0] / STEPS)
        == (508, 328)
    )
    assert gemm["a_ms"] == pytest.approx(ms(a_gemm[1])) and gemm["b_ms"] == pytest.approx(
        ms(b_gemm[1])
    )
    assert gemm["delta_pct"] == pytest.approx(100 * (b_gemm[1] - a_gemm[1]) / a_gemm[1])
    assert round(gemm["delta_pct"], 1) == -84.7
    # Kernels matched by full name: 30 names only in bf16; 23 only in fp32, plus the memset.
    groups = out["kernels"]
    appeared, vanished = names(bf16) - names(fp32), names(fp32) - names(bf16)
    assert {r["name"] for r in groups["appeared"]} == appeared and len(appeared) == 30
    assert {r["name"] for r in groups["vanished"]} == vanished | {"[CUDA memset]"}
    both = ("faster", "slower", "fewer_calls", "more_calls")
    assert sum(out["counts"][g] for g in (*both, "unchanged")) == len(names(fp32) & names(bf16)) + 1
    top = groups["vanished"][0]  # the fp32 gemm with the most time
    name = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas"
    count, total_ns = sql(fp32, f"SELECT COUNT(*), SUM(d) FROM ({KERNELS}) WHERE name = '{name}'")
    assert top["name"] == name and top["category"] == "gemm"
    assert top["a_instances"] == count / STEPS == 73 and top["b_instances"] == 0
    assert top["a_total_ms"] == pytest.approx(ms(total_ns))
    assert top["a_avg_us"] == pytest.approx(total_ns / count / 1e3) and top["b_avg_us"] is None
    nvjet = rows(groups["appeared"], "name")["nvjet_sm90_tst_48x64_64x15_2x1_v_bz_TNN"]
    count, total_ns = sql(
        bf16,
        f"SELECT COUNT(*), SUM(d) FROM ({KERNELS}) WHERE name LIKE 'nvjet_sm90_tst_48x64_64x15_2x1_v_bz_TNN'",
    )
    assert nvjet["b_instances"] == count / STEPS == 60 and nvjet["a_total_ms"] == 0
    assert nvjet["b_total_ms"] == pytest.approx(ms(total_ns)) and nvjet["delta_pct"] is None
    slower = [r["per_call_delta_ms"] for r in groups["slower"]]
    assert all(d > 0 for d in slower) and slower == sorted(slower, reverse=True)
    assert all(r["per_call_delta_ms"] < 0 for r in groups["faster"])
    assert all(r["avg_delta_pct"] > 5 for r in groups["slower"])
    assert all(r["avg_delta_pct"] < -5 for r in groups["faster"])


def per_call(path: Path, name: str) -> tuple[int, float]:
    """A kernel's launches and mean µs per launch in an export, by plain SQL."""
    count, total_ns = sql(path, f"SELECT COUNT(*), SUM(d) FROM ({KERNELS}) WHERE name = '{name}'")
    return count, total_ns / count / 1e3


def test_fewer_calls_is_not_faster(exports: dict[str, Path]) -> None:
    """The issue's cases: a kernel that runs fewer times per step but takes longer each
    time is slower per call, not "faster in B"; the Δ ms splits into its two parts."""
    fp32, bf16 = exports["fp32"], exports["bf16"]
    out = diff(fp32, bf16, "-n", "0")
    slower = rows(out["kernels"]["slower"], "name")
    faster = {r["name"] for r in out["kernels"]["faster"]}
    mul = "void at::native::elementwise_kernel<(int)128, (int)2, void at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float>>>(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)"
    fill = next(n for n in slower if "FillFunctor<float>" in n)
    for name in (mul, fill):
        (a_n, a_us), (b_n, b_us) = per_call(fp32, name), per_call(bf16, name)
        row = slower[name]
        assert name not in faster and b_n < a_n and b_us > a_us * 1.05
        assert row["a_instances"] == a_n / STEPS and row["b_instances"] == b_n / STEPS
        assert isinstance(row["a_instances"], int)  # a whole count is an integer in JSON
        assert row["a_avg_us"] == pytest.approx(a_us) and row["b_avg_us"] == pytest.approx(b_us)
        assert row["avg_delta_pct"] == pytest.approx(100 * (b_us / a_us - 1))
        assert row["delta_ms"] < 0  # less time in all: fewer calls ...
        assert row["calls_delta_ms"] == pytest.approx((b_n - a_n) / STEPS * a_us / 1e3)
        assert row["per_call_delta_ms"] == pytest.approx(b_n / STEPS * (b_us - a_us) / 1e3)
        assert row["calls_delta_ms"] + row["per_call_delta_ms"] == pytest.approx(row["delta_ms"])
    assert (a_n, b_n) == (102, 6) and round(a_us, 1) == 1.5 and round(b_us, 1) == 5.9  # fill
    assert per_call(fp32, mul)[0] == 584 and per_call(bf16, mul)[0] == 200
    assert out["noise_pct"] == 5.0
    # Within the noise, a kernel is neither faster nor slower.
    noisy = diff(fp32, bf16, "-n", "0", "--noise", "1000")
    assert noisy["kernels"]["faster"] == noisy["kernels"]["slower"] == []
    fewer = rows(noisy["kernels"]["fewer_calls"], "name")
    assert mul in fewer and fill in fewer
    # Piped, as a script would read it, at the width COLUMNS asks for.
    text = profkit("diff", str(fp32), str(bf16), "-n", "3", cwd=fp32.parent, env={"COLUMNS": "80"})
    assert "Slower per call in B" in text.stdout
    assert "more than ±5% (--noise" in text.stdout
    assert "292→100" in text.stdout and "2.53→2.78" in text.stdout
    assert max(len(line) for line in text.stdout.splitlines()) <= 80
    bad = runner.invoke(app, ["diff", str(fp32), str(bf16), "--noise", "-1"])
    assert bad.exit_code == 2 and "--noise must be >= 0" in bad.output


def test_eager_vs_compiled_triton_appears(exports: dict[str, Path]) -> None:
    eager, compiled = exports["fp32"], exports["compiled"]
    out = diff(eager, compiled, "-n", "3")
    triton = rows(out["categories"], "category")["triton"]
    count, total_ns = sql(
        compiled, f"SELECT COUNT(*), SUM(d) FROM ({KERNELS}) WHERE name LIKE 'triton%'"
    )
    assert triton["a_kernels"] == 0 and triton["b_kernels"] == count / STEPS == 258
    assert triton["b_ms"] == pytest.approx(ms(total_ns)) and triton["delta_pct"] is None
    assert all(  # --top per group
        len(group) == min(3, out["counts"][g]) for g, group in out["kernels"].items()
    )
    assert all(r["category"] == "triton" for r in out["kernels"]["appeared"])
    result = runner.invoke(app, ["diff", str(eager), str(compiled), "-n", "0"])
    appeared = len(names(compiled) - names(eager))
    vanished = len(names(eager) - names(compiled)) + 1  # the copies: none in the compiled run
    assert f"kernels: {appeared} appeared, {vanished} vanished" in result.stdout
    assert "The runs differ in: compile False → True." in result.stdout


def test_nsys_against_torch_profiler_changes_nothing_much(exports: dict[str, Path]) -> None:
    out = diff(exports["fp32"], TORCH_TRAIN, "-n", "0")
    assert (out["a"]["steps"], out["b"]["steps"], out["b"]["format"]) == (2, 1, "chrome")
    # Same kernels under both spellings: every one matched, none appeared or vanished.
    groups = out["kernels"]
    assert groups["appeared"] == [] and groups["vanished"] == []
    matched = ("faster", "slower", "fewer_calls", "more_calls", "unchanged")
    assert sum(out["counts"][g] for g in matched) == len(names(exports["fp32"])) + 2 == 59
    # B's per-step total is the trace's own: the one step's GPU events summed.
    with gzip.open(TORCH_TRAIN) as handle:
        events = json.load(handle)["traceEvents"]
    gpu_ns = sum(
        round(e["dur"] * 1000)
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    total = rows(out["phases"], "phase")["total"]
    assert (
        total["b_ms"] == pytest.approx(gpu_ns / 1e6, rel=1e-12)
        and total["a_kernels"] == total["b_kernels"] == 1929
    )
    assert all(abs(r["delta_pct"]) < 0.2 for r in out["phases"])
    assert all(abs(r["delta_pct"]) < 1.5 for r in out["categories"])
    totals = diff(exports["fp32"], TORCH_TRAIN, "--total")  # two steps against one
    assert rows(totals["phases"], "phase")["total"]["a_ms"] == pytest.approx(
        sql_activity_totals(exports["fp32"])[1] / 1e6
    )
    assert totals["per_step"] is False
    result = runner.invoke(app, ["diff", str(exports["fp32"]), str(TORCH_TRAIN), "--total"])
    assert "A and B hold different numbers of steps" in result.stdout


def test_a_file_against_itself(exports: dict[str, Path]) -> None:
    out = diff(exports["bf16"], exports["bf16"])
    assert all(out["kernels"][g] == [] for g in out["kernels"])
    for table in (out["phases"], out["categories"]):
        assert all(r["delta_ms"] == 0 and r["delta_pct"] == 0 for r in table)
        assert all(r["a_ms"] == r["b_ms"] and r["a_kernels"] == r["b_kernels"] for r in table)
    result = runner.invoke(app, ["diff", str(exports["bf16"]), str(exports["bf16"])])
    same = len(names(exports["bf16"])) + 1  # and its one kind of copy
    assert (
        "kernels: 0 appeared, 0 vanished, 0 faster, 0 slower, 0 fewer calls, 0 more calls, "
        f"{same} unchanged." in result.stdout
    )
    assert "Per step:" in result.stdout and "Faster per call" not in result.stdout


def test_formats_and_out(exports: dict[str, Path], tmp_path: Path) -> None:
    a, b = str(exports["fp32"]), str(exports["bf16"])
    table = runner.invoke(app, ["diff", a, b, "-n", "2"])
    assert table.exit_code == 0, table.output
    for text in ("Phases — kernel launches; GPU ms per step (kernels, memcpy, memset)",
                 "Categories — kernel launches; GPU ms per step", "Appeared (only in B) — 2 of 30",
                 "Vanished (only in A) — 2 of 24", "Δ ms", "bfloat16_copy_kernel_cuda", "GPU time per step: 18.790 ms → 10.450 ms"):  # fmt: skip
        assert text in table.stdout, text
    md = runner.invoke(app, ["diff", a, b, "-f", "md", "--total"])
    assert (
        md.stdout.startswith("# profkit diff")
        and "## Phases — kernel launches; GPU ms total" in md.stdout
    )
    assert "| phase | A kernels | B kernels | A ms | B ms | Δ ms | Δ % |" in md.stdout
    csv = runner.invoke(app, ["diff", a, b, "-f", "csv"])
    # csv is data for scripts: the JSON's names, machine table names, integer counts
    assert csv.stdout.startswith("table,phase,a_kernels,b_kernels,a_ms,b_ms,delta_ms,delta_pct,")
    assert "\nphases,forward,718,877," in csv.stdout and "\nslower," in csv.stdout
    out = tmp_path / "d" / "diff.md"
    written = runner.invoke(app, ["diff", a, b, "--out", str(out)])
    assert (
        written.exit_code == 0
        and written.stdout == ""
        and out.read_text().startswith("# profkit diff")
    )
    assert runner.invoke(app, ["diff", "--help"]).exit_code == 0
    assert "--per-step" in runner.invoke(app, ["diff", "--help"]).output


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("(int)128, (bool)0, (bool)1, std::array<char *, (unsigned long)3>", "128, false, true, std::array<char*, 3ul>"),
        ("void <unnamed>::k<float>(const T1 *, long)", "void (anonymous namespace)::k<float>(float const*, long)"),
        ("f<void at::g<x::[lambda() (instance 2)]>>(T1)", "f<at::g<x::{lambda()#2}> >(at::g<x>)"),
        ("f<h(at::TensorIterator &, const c10::Scalar &)::[lambda(bool) (instance 1)]>", "f<h(at::TensorIterator&, c10::Scalar const&)::{lambda(bool)#1}>"),
        ("[CUDA memcpy Device-to-Host]", "[memcpy DtoH]"),
        ("[CUDA memset]", "[memset]"),
    ],
)  # fmt: skip
def test_one_name_in_both_spellings_matches(a: str, b: str) -> None:
    assert match_key(a) == match_key(b)


def test_different_kernels_stay_apart() -> None:
    pairs = [
        ("k<(int)4>(T1)", "k<(int)8>(T1)"),
        ("f<x::[lambda() (instance 1)]>", "f<x::[lambda() (instance 2)]>"),
        ("[CUDA memcpy Host-to-Device]", "[CUDA memcpy Device-to-Host]"),
        ("triton_poi_fused_add_0", "triton_poi_fused_add_1"),
    ]
    assert all(match_key(a) != match_key(b) for a, b in pairs)


def test_bad_input_exits_2_with_one_line(exports: dict[str, Path], tmp_path: Path) -> None:
    good = str(exports["fp32"])
    cpu_only = tmp_path / "cpu.json"  # a range, no GPU activity: what a CPU run records
    event = {
        "ph": "X",
        "cat": "user_annotation",
        "name": "forward",
        "ts": 0,
        "dur": 10,
        "pid": 1,
        "tid": 1,
    }
    cpu_only.write_text(json.dumps({"traceEvents": [event]}))
    cases = {
        (good, str(tmp_path / "missing.sqlite")): "no such file",
        (good,): "takes two profiles, A and B; got 1",
        (): "takes two profiles, A and B; got 0",
        (good, good, good): "got 3",
        (good, str(DATA / "results-h100.db")): "not an Nsight Systems SQLite export",
        (str(DATA / "memory-tiny-ctx64-forward-fp32.pickle.xz"), good): "is not a supported trace",
        (good, str(tmp_path)): "is a directory",
        (str(cpu_only), good): "has no GPU activities",
        (good, good, "--top", "-1"): "--top must be 0 (all) or more",
        (good, good, "-f", "xml"): "unknown --format 'xml'",
    }
    for args, message in cases.items():
        result = runner.invoke(app, ["diff", *args])
        assert result.exit_code == 2, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert message in result.stderr and "Traceback" not in result.output, (args, result.stderr)
        assert result.stdout == ""


def test_per_step_nan_free_when_a_side_lacks_a_category(exports: dict[str, Path]) -> None:
    out = diff(exports["compiled"], exports["fp32"])
    categories = rows(out["categories"], "category")
    assert categories["triton"]["b_ms"] == 0 and categories["triton"]["delta_pct"] == -100
    assert not any(
        isinstance(v, float) and math.isnan(v) for r in out["phases"] for v in r.values()
    )


def test_per_step_counts_stay_fractional(tmp_path: Path) -> None:
    # A user's program, 5 steps: 94 optimizer kernels are 18.8 per step, not 18.
    user = unpack("nsys-2025.3-h100-user_train", tmp_path)
    per_step = rows(diff(user, user)["phases"], "phase")
    total = rows(diff(user, user, "--total")["phases"], "phase")
    assert diff(user, user)["a"]["steps"] == 5 and total["optimizer"]["a_kernels"] == 94
    assert per_step["optimizer"]["a_kernels"] == pytest.approx(94 / 5)
    assert per_step["optimizer"]["a_ms"] == pytest.approx(total["optimizer"]["a_ms"] / 5)
    # Activities outside every phase belong to no step: they are not divided (1 kernel; the
    # other 32 activities there are copies).
    assert per_step["unattributed"]["a_kernels"] == total["unattributed"]["a_kernels"] == 1
    assert per_step["total"]["a_kernels"] == pytest.approx(
        sum(r["a_kernels"] for r in per_step.values() if r["phase"] != "total")
    )


def test_a_two_rank_side_says_its_steps_are_per_rank(data_dir: Path) -> None:
    """Against a 2-rank DDP export, B's 6 phase instances are 3 steps of 2 ranks: the
    header and notes say so, and the ranks lead what differs between the runs."""
    a = str(data_dir / "nsys-2025.3-h100-small-fp32.sqlite.xz")
    b = str(data_dir / "nsys-2025.3-h200x2-small-ddp2.sqlite.xz")
    result = runner.invoke(app, ["diff", a, b, "-f", "json"])
    assert result.exit_code == 0, result.output
    value = json.loads(result.stdout)
    assert (value["a"]["ranks"], value["a"]["steps"]) == (1, 2)
    assert (value["b"]["ranks"], value["b"]["steps"]) == (2, 6)
    text = runner.invoke(app, ["diff", a, b, "--top", "1"]).stdout
    assert "(nsys-sqlite, 6 steps over 2 ranks)" in text
    assert "B holds 2 ranks, each step counted per rank: its per-step numbers are one" in text
    assert "The runs differ in: ranks 1 → 2, steps 2 → 3." in text


def test_device_auto_against_cuda_is_no_difference(data_dir: Path) -> None:
    """`--device auto` ran on whatever the machine had (cuda there): not a change."""
    from profkit.analysis import diff as diff_lib
    from profkit.analysis import kernel_report
    from profkit.traces.job import load

    a = kernel_report(load([data_dir / "nsys-2025.3-h100-small-fp32.sqlite.xz"]))
    b = kernel_report(load([data_dir / "nsys-2025.3-h100-small-bf16.sqlite.xz"]))
    assert a.source["config"]["device"] == b.source["config"]["device"] == "auto"
    b.source["config"] = {**b.source["config"], "device": "cuda"}
    assert diff_lib._notes(a, b, True)[-1] == "The runs differ in: dtype fp32 → bf16."
    b.source["config"]["device"] = "cpu"
    assert "device auto → cpu" not in diff_lib._notes(a, b, True)[-1]  # auto: unknown
