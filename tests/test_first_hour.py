"""What a new user sees in the first hour (issue 27), as they type it: narrow terminals,
csv and json a script reads, markdown that renders, and help that says what to type."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from cli_run import profkit
from nsys_data import PROBE, SMALL_FP32, unpack
from rich.console import Console
from typer.testing import CliRunner

from profkit.cli import app
from profkit.cli.render import rich_table
from profkit.run import bench as bench_lib
from profkit.workload.config import WorkloadConfig

runner = CliRunner()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(SMALL_FP32, tmp_path_factory.mktemp("nsys"))


def invoke(*args: str | Path) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_kernels_csv_has_machine_table_names_and_integer_counts(small: Path) -> None:
    frame = pd.read_csv(io.StringIO(invoke("kernels", small, "-f", "csv", "-n", "3")))
    assert list(dict.fromkeys(frame["table"])) == ["phases", "top_kernels", "ranges", "categories"]
    phases = frame[frame["table"] == "phases"].set_index("phase")
    assert phases.loc["forward", "kernels"] == 1436
    text = invoke("kernels", small, "-f", "csv")  # blank where a table has no such column,
    assert "phases,forward,2,1436,24,0," in text and ".0," not in text.split("\n")[1]
    # One name per quantity: `share`, a fraction, as in the JSON (people read `share %`).
    assert "time_%" not in frame and "share %" not in frame
    assert phases["share"].sum() == pytest.approx(1.0)
    top = frame[frame["table"] == "top_kernels"]
    assert set(top["phase"]) == {"all", "forward", "backward", "optimizer"}
    assert top["name"].str.startswith("sm80_xmma_gemm").any()  # full names for scripts


def test_kernels_json_carries_every_column(small: Path) -> None:
    out = json.loads(invoke("kernels", small, "-f", "json", "-n", "3"))
    forward = out["phases"][0]
    assert (forward["instances"], forward["kernels"]) == (2, 1436)
    assert forward["cpu_time_ms"] > 0 and forward["python_ms"] > 0
    kernel = out["kernels"][0]
    assert {"grid", "block", "short_name", "instances", "avg_us"} <= set(kernel)
    softmax = next(r for r in out["ranges"] if r["range"] == "computing softmax")
    assert softmax["cpu_time_ms"] > 0 and softmax["mflop"] == pytest.approx(3.93216)


def test_markdown_shows_template_names_as_code(small: Path) -> None:
    md = invoke("kernels", small, "-f", "md")
    assert "&lt;" not in md
    assert "| `elementwise_kernel<128, 2, BinaryFunctor<float, MulFunctor<float>>>` |" in md
    assert "| share % |" in md or " share % |" in md


def test_sizes_use_one_name_everywhere() -> None:
    rows = json.loads(invoke("sizes", "-f", "json"))
    csv = pd.read_csv(io.StringIO(invoke("sizes", "-f", "csv")))
    assert list(csv.columns) == list(rows[0])  # non_embedding_params in both
    assert "non_embedding_params" in invoke("sizes", "-f", "md")


def test_diff_csv_is_data_not_display(small: Path, tmp_path: Path) -> None:
    frame = pd.read_csv(io.StringIO(invoke("diff", small, small, "-f", "csv", "-n", "0")))
    assert set(frame["table"]) == {"phases", "categories"}  # the same file: nothing moved
    assert {"a_kernels", "b_kernels", "a_ms", "delta_pct"} <= set(frame.columns)
    assert frame["a_kernels"].dtype.kind == "i"


def test_piped_output_follows_columns(small: Path) -> None:
    """A script that asks for 80 columns through a pipe gets them (it was fixed at 200)."""
    for args in (("kernels", str(small), "-n", "5"), ("sizes",)):
        narrow = profkit(*args, cwd=small.parent, env={"COLUMNS": "80"})
        assert narrow.returncode == 0, narrow.stderr
        assert max(map(len, narrow.stdout.splitlines())) <= 80
    wide = profkit("kernels", str(small), "-n", "5", cwd=small.parent, drop=("COLUMNS",))
    assert max(map(len, wide.stdout.splitlines())) > 80  # no COLUMNS: as wide as it needs


def _row(mode: str, step_ms: list[float]) -> bench_lib.Row:
    config = WorkloadConfig(size="tiny", ctx=128, steps=len(step_ms), mode=mode, device="cpu")
    phases = ("forward_ms", "backward_ms", "optimizer_ms") if mode == "train" else ("forward_ms",)
    steps = [{p: t / len(phases) for p in phases} for t in step_ms]
    return bench_lib.bench_row(config, {"status": "ok", "steps": steps, "threads": 1}, {})


def test_bench_at_80_columns_keeps_the_phase_split() -> None:
    rows = [_row("forward", [40.0, 60.0, 50.0]), _row("train", [120.0, 121.0, 119.0])]
    console = Console(width=80, record=True, color_system=None)
    console.print(rich_table(bench_lib.table(rows), bench_lib.title(rows), width=80))
    text = console.export_text()
    header = next(line for line in text.splitlines() if "fwd ms" in line)
    for column in ("size", "ctx", "mode", "fwd ms", "bwd ms", "opt ms", "step ms", "cv %"):
        assert column in header, column
    assert "status" not in header  # every row ok: the column says nothing
    assert max(map(len, text.splitlines())) <= 80


def test_help_reads_as_a_user_types() -> None:
    top = invoke("--help")
    assert "<bool>" not in top
    diff = invoke("diff", "--help")
    assert "diff [OPTIONS] A B" in " ".join(diff.split()) and "[A B]..." not in diff
    assert "list[" not in diff and "--noise" in diff
    bench = invoke("bench", "--help")
    assert "list[" not in bench and "SIZE..." in bench and "both" in bench
    torch_help = " ".join(invoke("torch", "--help").split())
    # torch runs one config: no lists, no `--compile both` that it would then refuse.
    assert "SIZE..." not in torch_help and "Model size:" in torch_help
    assert "no | yes." in torch_help and "yes | both" not in torch_help
    assert "kernels [OPTIONS] TRACE..." in " ".join(invoke("kernels", "--help").split())
    refused = runner.invoke(app, ["torch", "--size", "tiny", "small"])
    assert refused.exit_code == 2


def test_the_cache_is_capped_shown_and_cleared(
    small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`profkit cache` lists what it holds; a cap keeps the most recently used; `clear`
    empties it (the traces themselves stay)."""
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PROFKIT_CACHE", raising=False)
    copies = []
    for index in range(3):
        copy = tmp_path / f"t{index}.sqlite"
        copy.write_bytes(small.read_bytes())
        copies.append(copy)
    invoke("kernels", copies[0], "-n", "1")
    invoke("kernels", copies[1], "-n", "1")
    held = json.loads(invoke("cache", "info", "-f", "json"))
    assert held["entries"] == 2 and held["dir"] == str(tmp_path / "cache")
    assert [t["trace"] for t in held["traces"]] == [str(copies[1]), str(copies[0])]
    one = max(t["size_bytes"] for t in held["traces"])
    # A cap of a bit more than one entry: reading a third keeps only it, the newest.
    monkeypatch.setenv("PROFKIT_CACHE_MAX_MB", str(1.5 * one / (1 << 20)))
    invoke("kernels", copies[2], "-n", "1")
    held = json.loads(invoke("cache", "-f", "json"))
    assert [t["trace"] for t in held["traces"]] == [str(copies[2])]
    assert held["size_bytes"] <= held["max_bytes"]
    assert "t2.sqlite" in invoke("cache")  # the table names the trace (cut to fit)
    cleared = runner.invoke(app, ["cache", "clear", "--yes"])
    assert cleared.exit_code == 0 and "removed 1 cached trace(s)" in cleared.stderr
    assert json.loads(invoke("cache", "-f", "json"))["entries"] == 0
    assert all(c.exists() for c in copies)
    monkeypatch.setenv("PROFKIT_CACHE_MAX_MB", "lots")
    bad = runner.invoke(app, ["cache"])
    assert bad.exit_code == 2 and "PROFKIT_CACHE_MAX_MB must be a number" in bad.stderr


def test_a_sweep_reports_each_step_and_a_slow_cpu_run_says_so(tmp_path: Path) -> None:
    config = WorkloadConfig(size="tiny", ctx=16, warmup=1, steps=2, mode="train", device="cpu")
    seen: list[tuple[int, int, int]] = []
    rows = bench_lib.bench([config], tmp_path / "r.db", on_step=lambda *step: seen.append(step))
    assert rows[0]["status"] == "ok"
    assert seen and seen[-1] == (0, 3, 3)  # the 3rd of 1 warm-up + 2 timed steps
    assert [s[1] for s in seen] == sorted(s[1] for s in seen)
    # Anything but tiny on a CPU: a note before the sweep (here cut short by --timeout).
    slow = profkit(
        "bench", "--size", "small", "--ctx", "16", "--device", "cpu", "--timeout", "1",
        "--db", str(tmp_path / "s.db"), cwd=tmp_path,
    )  # fmt: skip
    assert "note: on a CPU, small takes seconds to minutes per step" in slow.stderr
    assert "`--size tiny`" in slow.stderr
    assert "[1/1] small-ctx16-train-fp32: running" in slow.stderr  # a log sees the start


def test_memory_plot_says_what_it_is_doing(tmp_path: Path) -> None:
    from nsys_data import DATA

    from profkit.memory.plot import plot_file

    stages: list[str] = []
    snapshot = DATA / "memory-tiny-ctx64-train-fp32.pickle.xz"
    plot_file(snapshot, tmp_path / "t.png", stage=stages.append)
    assert stages == [
        f"reading {snapshot.name}",
        "rebuilding allocated memory at every event",
        "drawing t.png",
    ]


def test_version_answers_without_the_heavy_imports(tmp_path: Path) -> None:
    code = (
        "import sys; sys.argv = ['profkit', '--version']; "
        "from profkit.__main__ import main; main(); "
        "print(sorted(m for m in ('pandas', 'numpy', 'pyarrow', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["profkit 0.1.0", "[]"]
    assert profkit("--version", cwd=tmp_path).stdout == "profkit 0.1.0\n"


def test_the_packaged_example_is_the_checkouts() -> None:
    """One export, two places: profiles/examples/ for the checkout's README commands, its
    xz inside the package for an installed wheel's demo."""
    import lzma

    from profkit.report.demo import EXAMPLE_EXPORT

    checkout = Path(__file__).parents[1] / "profiles" / "examples"
    assert (
        lzma.decompress(EXAMPLE_EXPORT.read_bytes())
        == (checkout / "small-ctx128-train-fp32.sqlite").read_bytes()
    )
    sidecar = EXAMPLE_EXPORT.with_name("small-ctx128-train-fp32.profkit.json")
    assert sidecar.read_bytes() == (checkout / sidecar.name).read_bytes()


@pytest.mark.slow
def test_a_wheel_runs_the_whole_demo(tmp_path: Path) -> None:
    """Built as a wheel and installed elsewhere, the demo still shows the kernel step, and
    its report names paths that exist there (not profiles/examples/)."""
    import shutil

    root = Path(__file__).parents[1]
    source = tmp_path / "src"
    shutil.copytree(
        root / "profkit", source / "profkit", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = tmp_path / "wheel"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(built), str(source)],
        check=True, capture_output=True, cwd=source,
    )  # fmt: skip
    (wheel,) = built.glob("profkit-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "COLUMNS": "80"}
    ran = subprocess.run(
        [sys.executable, "-m", "profkit", "demo", "--device", "cpu"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (
        "Top 10 kernels by GPU time" in ran.stdout and "not in this installation" not in ran.stdout
    )
    report = (work / "reports" / "demo.md").read_text()
    assert "profiles/examples" not in report and "| forward | 1,436 |" in report
    shown = re.search(r"`profkit kernels (\S+)`", report)
    assert shown is not None and Path(shown[1]).exists() and str(site) in shown[1]
    assert (work / "reports" / "demo-step.png").exists()


def test_report_plot_says_what_it_draws_and_what_it_leaves_out(tmp_path: Path) -> None:
    from profkit.report import figures, plots

    def row(ctx: int, warmup: int, ms: float) -> bench_lib.Row:
        config = WorkloadConfig(size="tiny", ctx=ctx, warmup=warmup, steps=3, device="cpu")
        steps = [
            {"forward_ms": t, "backward_ms": t, "optimizer_ms": 1.0} for t in (ms, ms + 2, ms - 2)
        ]
        return bench_lib.bench_row(config, {"status": "ok", "steps": steps, "threads": 1}, {})

    rows = [row(64, 0, 90.0), row(64, 1, 30.0), row(128, 1, 60.0)]
    (bars,) = figures.step_bars(rows)
    assert bars.ctx == 64 and bars.cells[("tiny", "fp32")]["warmup"] == 1  # warm, not cold
    assert "1 warm-up" in bars.caption and "bars ± std of the step" in bars.caption
    assert "also in the DB, not drawn: ctx 128; warm-up 0" in bars.caption
    assert plots.step_time(bars, tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_docs_are_short_and_name_files_the_repo_has() -> None:
    root = Path(__file__).parents[1]
    readme = (root / "README.md").read_text()
    assert len(readme.splitlines()) <= 250  # a newcomer reads it in five minutes
    missing = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = doc.read_text()
        pattern = r"(?<![\w/.])((?:profkit|docs|tests|examples|benchmarks|\.device)/[\w./-]+\.\w+)(?![\w*-])"
        for match in re.finditer(pattern, text):
            if text[match.end() : match.end() + 1] == "*":
                continue  # a pattern (tests/data/nsys-2025.3-h100-*), not a file
            path = match[1].rstrip(".")
            if not ((root / path).exists() or (doc.parent / path).exists()):
                missing.append(f"{doc.name}: {path}")
    assert not missing  # run outputs (profiles/, reports/) are the user's, not checked


def test_a_snapshot_of_older_code_says_its_sites_moved() -> None:
    from nsys_data import DATA

    snapshot = DATA / "memory-2.7B-ctx512-train-fp32.pickle.xz"
    result = runner.invoke(app, ["memory", "summarize", str(snapshot), "-n", "3", "-f", "json"])
    assert result.exit_code == 0, result.output
    sites = [s["site"] for s in json.loads(result.stdout)["top_allocations"]]
    assert "profkit/model.py:82 __init__" in sites  # the code it was captured from
    assert "profkit/model.py, profkit/workload.py are not in this installation" in " ".join(
        result.stderr.split()
    )


def test_clearing_or_trimming_the_cache_never_removes_a_users_own_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PROFKIT_CACHE_DIR pointed at a project that has a ``columns/`` folder of its own:
    `cache clear` listed its subfolders as traces ("?") and removed them, and trimming
    to the cap would have too. Only folders named as entries are the cache's."""
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PROFKIT_CACHE", raising=False)
    mine = tmp_path / "columns" / "mydata"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("precious\n")
    assert json.loads(invoke("cache", "info", "-f", "json"))["entries"] == 0
    trace = tmp_path / "t.sqlite"
    trace.write_bytes(PROBE.read_bytes())
    monkeypatch.setenv("PROFKIT_CACHE_MAX_MB", "0.000001")  # every older entry goes
    invoke("kernels", trace, "-n", "1")
    held = json.loads(invoke("cache", "info", "-f", "json"))
    assert [t["trace"] for t in held["traces"]] == [str(trace)]
    cleared = runner.invoke(app, ["cache", "clear", "--yes"])
    assert cleared.exit_code == 0 and "removed 1 cached trace(s)" in cleared.stderr
    assert (mine / "notes.txt").read_text() == "precious\n"
