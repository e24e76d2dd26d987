"""``profkit torch`` end to end on the CPU, through the CLI, and its tables against torch's."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.profiler import ProfilerActivity, profile
from typer.testing import CliRunner

from profkit.cli import app
from profkit.errors import BadInput
from profkit.torchprof.profile import default_name
from profkit.torchprof.result import TorchOptions
from profkit.torchprof.tables import averages_table
from profkit.traces.chrome import read_chrome_columns
from profkit.workload.config import WorkloadConfig
from profkit.workload.step import Workload

TINY = [
    "torch",
    "--size",
    "tiny",
    "--ctx",
    "16",
    "--steps",
    "1",
    "--warmup",
    "1",
    "--device",
    "cpu",
]
COURSE_COLUMNS = [
    "Name", "Self CPU %", "Self CPU (ms)", "CPU total %", "CPU total (ms)",
    "CPU time avg (µs)", "# of Calls",
]  # fmt: skip
runner = CliRunner()


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # profiles/ and reports/ land here
    return tmp_path


@pytest.fixture(scope="module")
def json_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One real run with --format json, shared by the tests that read what it wrote."""
    root = tmp_path_factory.mktemp("torch-json")
    out_dir = root / "traces"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # nothing may land here: --out-dir holds every file
        result = runner.invoke(
            app, [*TINY, "--format", "json", "--out-dir", str(out_dir), "--row-limit", "5"]
        )
    assert result.exit_code == 0, result.output
    return root, json.loads(result.stdout)


def test_table_run_writes_traces_and_report(in_tmp: Path) -> None:
    result = runner.invoke(app, [*TINY, "--row-limit", "8"])
    assert result.exit_code == 0, result.output
    assert "Forward only — tiny, ctx 16, fp32, cpu, 1 step," in result.stdout
    assert "Full step: forward + backward + optimizer" in result.stdout
    assert "aten::mm" in result.stdout and "Self CPU %" in result.stdout
    assert "CUDA" not in result.stdout  # CPU run: CPU columns only
    forward = in_tmp / "profiles" / "torch-tiny-ctx16-forward.json.gz"
    train = in_tmp / "profiles" / "torch-tiny-ctx16-train.json.gz"
    report = in_tmp / "reports" / "torch-tiny-ctx16.md"
    assert forward.exists() and train.exists() and report.exists()
    assert "wrote profiles/torch-tiny-ctx16-forward.json.gz" in result.stderr
    text = report.read_text()
    assert "## Forward only" in text and "## Full step: forward + backward + optimizer" in text
    assert "| " + " | ".join(COURSE_COLUMNS) + " |" in text
    assert text.count("| aten::") >= 8
    assert not list((in_tmp / "profiles").glob(".*"))  # no temporary files left behind


def test_json_output_is_the_contract(json_run: tuple[Path, dict]) -> None:
    root, data = json_run
    assert data["name"] == "torch-tiny-ctx16" and data["device"] == "cpu"
    assert data["config"]["size"] == "tiny" and data["config"]["steps"] == 1
    assert [run["mode"] for run in data["runs"]] == ["forward", "train"]
    for run in data["runs"]:
        assert len(run["rows"]) == 5 and run["rows_total"] > 5
        assert run["sort"] == "self_cpu" and run["self_cuda_total_ms"] is None
        assert set(run["rows"][0]) == {
            "name", "self_cpu_pct", "self_cpu_ms", "cpu_total_pct", "cpu_total_ms",
            "cpu_avg_us", "calls",
        }  # fmt: skip
        assert len(run["step_ms"]) == 1 and run["step_ms"][0] > 0
        times = [row["self_cpu_ms"] for row in run["rows"]]
        assert times == sorted(times, reverse=True)
        assert Path(run["trace_path"]).parent == root / "traces"
    # --out-dir is obeyed by every file the command writes, the report included.
    assert (root / "traces" / "torch-tiny-ctx16.md").exists()
    assert sorted(p.name for p in root.iterdir()) == ["traces"]


def test_written_traces_read_back_with_phases_and_config(json_run: tuple[Path, dict]) -> None:
    _, data = json_run
    forward_run, train_run = data["runs"]
    forward = read_chrome_columns(forward_run["trace_path"])
    train = read_chrome_columns(train_run["trace_path"])
    assert set(forward.ranges.query("depth == 0")["name"]) == {"forward"}
    assert set(train.ranges.query("depth == 0")["name"]) == {"forward", "backward", "optimizer"}
    assert (train.ranges["name"] == "computing softmax").sum() == 2  # tiny: 2 layers, 1 step
    assert len(train.meta["profiler_steps"]) == 1  # only the timed step was recorded
    assert train.meta["config"]["mode"] == "train" and train.meta["config"]["size"] == "tiny"
    assert train.meta["profkit"]["command"] == "torch"
    with gzip.open(train_run["trace_path"]) as fh:  # plain gzip JSON, as the viewers expect
        assert "traceEvents" in json.load(fh)


def test_options_shapes_memory_stack_and_sort(in_tmp: Path) -> None:
    result = runner.invoke(
        app,
        [*TINY, "--mode", "forward", "--group-by-shape", "--profile-memory", "--with-stack",
         "--sort", "self_cpu_mem", "--row-limit", "3", "--format", "csv", "--name", "opts"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0].split(",")
    assert header[:3] == ["Name", "Source Location", "Input Shapes"]
    assert "Self CPU Mem (MiB)" in header and "CUDA Mem (MiB)" not in header
    rows = result.stdout.strip().splitlines()[1:]
    assert len(rows) == 3
    assert "profkit/workload/model.py(" in result.stdout  # call sites, not torch internals
    assert (in_tmp / "profiles" / "opts-forward.json.gz").exists()
    assert not (in_tmp / "profiles" / "opts-train.json.gz").exists()  # --mode forward: one run


def test_cuda_sort_on_cpu_falls_back_with_a_note() -> None:
    result = runner.invoke(app, [*TINY, "--mode", "forward", "--sort", "self_cuda", "-f", "md"])
    assert result.exit_code == 0, result.output
    assert "sorted by self_cpu" in result.stdout
    assert "--sort self_cuda: no device time on cpu" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sort", "bogus"], "unknown --sort 'bogus'"),
        (["--sort", "self_cpu_mem"], "--sort self_cpu_mem needs --profile-memory"),
        (["--row-limit", "-1"], "--row-limit must be 0"),
        (["--name", "../escape"], "--name '../escape'"),
        (["--size", "tiny", "small"], "unexpected extra argument"),  # one value: --help says so
        (["--compile", "both"], "runs one config"),
        (["--format", "xml"], "unknown --format 'xml'"),
        (["--ctx", "0"], "--ctx must be between"),
        (["--device", "cuda"], "no CUDA device"),
    ],
)
def test_bad_options_are_one_line_errors(in_tmp: Path, args: list[str], message: str) -> None:
    if "--device" in args:
        pytest.importorskip("torch")
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    base = [a for a in TINY if a != "cpu" and a != "--device"] if "--device" in args else TINY
    if "--size" in args:
        base = ["torch", "--ctx", "16", "--device", "cpu"]
    result = runner.invoke(app, [*base, *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output
    assert not (in_tmp / "profiles").exists() or not any((in_tmp / "profiles").iterdir())


def test_unwritable_out_dir_is_a_one_line_error(in_tmp: Path) -> None:
    (in_tmp / "blocker").write_text("a file where a directory should be")
    result = runner.invoke(app, [*TINY, "--out-dir", "blocker/profiles"])
    assert result.exit_code == 2
    assert "cannot create blocker/profiles" in result.stderr


def test_out_file_gets_the_rendered_tables(in_tmp: Path) -> None:
    result = runner.invoke(app, [*TINY, "--mode", "forward", "-f", "md", "-o", "tables.md"])
    assert result.exit_code == 0, result.output
    assert (in_tmp / "tables.md").read_text().startswith("### Forward only")
    assert result.stdout == ""


def test_help() -> None:
    result = runner.invoke(app, ["torch", "--help"])
    assert result.exit_code == 0
    for flag in ("--record-shapes", "--with-stack", "--profile-memory", "--sort", "--row-limit",
                 "--group-by-shape", "--name", "--out-dir", "--format"):  # fmt: skip
        assert flag in result.stdout


def test_table_matches_torch_own_key_averages() -> None:
    workload = Workload(WorkloadConfig(size="tiny", ctx=16, warmup=0, steps=1, device="cpu"))
    workload.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        workload.step()
    averages = prof.key_averages()
    table = averages_table(averages, sort="self_cpu")
    printed = averages.table(sort_by="self_cpu_time_total", row_limit=3)
    for row in table.top(3).itertuples():
        line = next(ln for ln in printed.splitlines() if ln.strip().startswith(row.name + " "))
        assert f"{row.self_cpu_pct:.2f}%" in line and f"{row.cpu_total_pct:.2f}%" in line
        assert str(row.calls) == line.split()[-1]
    total = printed.strip().splitlines()[-1]
    assert total.startswith("Self CPU time total:")
    assert table.self_cpu_total_ms == pytest.approx(
        sum(e.self_cpu_time_total for e in averages) / 1e3
    )


def test_default_names_and_option_checks() -> None:
    assert default_name(WorkloadConfig(size="large", ctx=256)) == "torch-large-ctx256"
    assert (
        default_name(WorkloadConfig(size="small", ctx=128, batch=8, dtype="bf16", compile=True))
        == "torch-small-ctx128-b8-bf16-compiled"
    )
    with pytest.raises(BadInput):
        TorchOptions(sort="self_cuda_mem")
    assert TorchOptions(sort="self_device_time_total").sort == "self_device_time_total"


def fake_average(
    key: str, device: bool = False, annotation: bool = False, old: bool = False, **times: float
) -> SimpleNamespace:
    """A stand-in for torch's FunctionEventAvg of a CUDA run (none can be recorded here).

    ``old`` spells the device fields as torch < 2.4 did (``self_cuda_time_total``...).
    """
    fields = {"key": key, "count": int(times.pop("count", 1)), "is_user_annotation": annotation,
              "device_type": "DeviceType.CUDA" if device else "DeviceType.CPU",
              "self_cpu_time_total": times.get("self_cpu", 0.0), "cpu_time_total": times.get("cpu", 0.0)}  # fmt: skip
    prefix = "cuda" if old else "device"
    fields[f"self_{prefix}_time_total"] = times.get("self_dev", 0.0)
    fields[f"{prefix}_time_total"] = times.get("dev", 0.0)
    return SimpleNamespace(**fields)


@pytest.mark.parametrize("old", [False, True])
def test_cuda_columns_and_torch_denominators(old: bool) -> None:
    averages = [
        fake_average("aten::mm", self_cpu=300.0, cpu=400.0, dev=9000.0, count=3, old=old),
        fake_average("ampere_sgemm_128x64_tn", device=True, self_dev=9000.0, dev=9000.0, count=3, old=old),
        fake_average("vectorized_elementwise_kernel", device=True, self_dev=1000.0, dev=1000.0, count=10, old=old),
        # Kineto's gpu_user_annotation row: shown, but not in the Self CUDA % denominator.
        fake_average("forward", device=True, annotation=True, self_dev=10000.0, dev=10000.0, old=old),
        fake_average("cudaLaunchKernel", self_cpu=100.0, cpu=100.0, count=13, old=old),
    ]  # fmt: skip
    table = averages_table(averages)
    assert table.sort == "self_cuda"
    assert table.self_cuda_total_ms == pytest.approx(10.0)  # 9 + 1 ms, the annotation left out
    assert table.self_cpu_total_ms == pytest.approx(0.4)
    rows = table.rows.set_index("name")
    assert rows.loc["ampere_sgemm_128x64_tn", "self_cuda_pct"] == pytest.approx(90.0)
    assert rows.loc["forward", "self_cuda_pct"] == pytest.approx(100.0)
    assert rows.loc["ampere_sgemm_128x64_tn", "cuda_avg_us"] == pytest.approx(3000.0)
    assert rows.loc["aten::mm", "cpu_total_pct"] == pytest.approx(100.0)
    assert table.rows["name"].tolist()[:2] == ["forward", "ampere_sgemm_128x64_tn"]
    assert list(table.display(2).columns) == [
        "Name", "Self CPU %", "Self CPU (ms)", "CPU total %", "CPU total (ms)", "CPU time avg (µs)",
        "Self CUDA (ms)", "Self CUDA %", "CUDA total (ms)", "CUDA time avg (µs)", "# of Calls",
    ]  # fmt: skip
    by_total = averages_table(averages, sort="cuda_total").rows["name"].tolist()
    # aten::mm has 9 ms of kernels below it: tied with its kernel, ties go by name
    assert by_total[:3] == ["forward", "ampere_sgemm_128x64_tn", "aten::mm"]
    assert averages_table(averages, sort="calls").rows["name"].iloc[0] == "cudaLaunchKernel"
