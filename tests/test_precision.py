"""``profkit precision``: exact accumulation values and the dtypes autocast really produces."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from profkit.cli import app
from profkit.studies.precision import accumulate, autocast_dtypes, dtypes_table

runner = CliRunner()

# IEEE arithmetic, the same on every machine: fp16(0.01) = 0.01000213623046875.
EXACT = {
    "fp32": 10.000133514404297,
    "fp16": 9.953125,
    "fp16 into fp32": 10.00213623046875,
    "fp16 upcast to fp32": 10.00213623046875,
}
PRINTED = {"fp32": "10.0001", "fp16": "9.9531", "fp16 into fp32": "10.0021"}


def test_accumulate_values_are_exact() -> None:
    rows = accumulate("cpu")
    assert {r["case"]: r["value"] for r in rows} == EXACT
    fp16 = next(r for r in rows if r["case"] == "fp16")
    assert fp16["abs_error"] == 10 - 9.953125
    assert fp16["rel_error"] == pytest.approx(0.0046875)


def test_accumulate_command_prints_the_handout_values() -> None:
    result = runner.invoke(app, ["precision", "accumulate", "-f", "md"])
    assert result.exit_code == 0, result.output
    lines = {line.split("|")[1].strip(): line for line in result.stdout.splitlines()[4:]}
    for case, printed in PRINTED.items():
        assert f"| {printed} |" in lines[case]
    assert "| 10.0021 | 10.00213623046875 |" in lines["fp16 upcast to fp32"]
    assert "| 4.688e-02 | 0.4688% |" in lines["fp16"]


def test_accumulate_json_is_only_json() -> None:
    result = runner.invoke(app, ["precision", "accumulate", "-f", "json"])
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert [r["value"] for r in rows] == list(EXACT.values())
    assert rows[2]["addend_value"] == 0.01000213623046875


# Observed on torch 2.13 CPU: CPU autocast runs LayerNorm in the low dtype (CUDA's runs it
# in fp32), and keeps cross-entropy and the gradients in fp32.
CPU_OBSERVED = [
    ("parameters", "float32"),
    ("fc1 (Linear) output", "{low}"),
    ("relu (ReLU) output", "{low}"),
    ("ln (LayerNorm) output", "{low}"),
    ("fc2 (Linear) output = logits", "{low}"),
    ("loss", "float32"),
    ("gradients", "float32"),
]


@pytest.mark.parametrize(("autocast", "low"), [("bf16", "bfloat16"), ("fp16", "float16")])
def test_dtypes_on_cpu_are_observed(autocast: str, low: str) -> None:
    rows = autocast_dtypes(["cpu"], [autocast])
    assert [(r["tensor"], r["dtype"]) for r in rows] == [
        (tensor, dtype.format(low=low)) for tensor, dtype in CPU_OBSERVED
    ]
    assert all(r["device"] == "cpu" and r["note"] is None for r in rows)


def test_dtypes_without_autocast_stay_fp32() -> None:
    rows = autocast_dtypes(["cpu"], ["fp32"])
    assert {r["dtype"] for r in rows} == {"float32"}


def test_dtypes_table_puts_variants_side_by_side() -> None:
    table = dtypes_table(autocast_dtypes(["cpu"], ["fp16", "bf16"]))
    assert list(table.columns) == ["tensor", "cpu fp16", "cpu bf16"]
    logits = table.set_index("tensor").loc["fc2 (Linear) output = logits"]
    assert list(logits) == ["float16", "bfloat16"]


def test_dtypes_command() -> None:
    result = runner.invoke(app, ["precision", "dtypes", "--device", "cpu", "--dtype", "bf16"])
    assert result.exit_code == 0, result.output
    assert "ToyModel under autocast" in result.stdout
    assert "bfloat16" in result.stdout
    result = runner.invoke(app, ["precision", "dtypes", "--device", "cpu", "-f", "json"])
    rows = json.loads(result.stdout)
    assert {(r["autocast"], r["tensor"], r["dtype"]) for r in rows} >= {
        ("fp16", "loss", "float32"),
        ("bf16", "ln (LayerNorm) output", "bfloat16"),
    }


@pytest.mark.gpu
def test_dtypes_on_cuda_follow_the_autocast_op_lists() -> None:
    rows = autocast_dtypes(["cuda"], ["fp16"])
    assert {r["tensor"]: r["dtype"] for r in rows} == {
        "parameters": "float32",
        "fc1 (Linear) output": "float16",
        "relu (ReLU) output": "float16",
        "ln (LayerNorm) output": "float32",
        "fc2 (Linear) output = logits": "float16",
        "loss": "float32",
        "gradients": "float32",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["dtypes", "--dtype", "fp8"], "unknown --dtype 'fp8'"),
        (["dtypes", "--device", "tpu"], "unknown --device 'tpu'"),
        (["accumulate", "--device", "tpu"], "unknown --device 'tpu'"),
        (["accumulate", "-f", "xml"], "unknown --format 'xml'"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["precision", *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
@pytest.mark.parametrize("sub", ["accumulate", "dtypes"])
def test_cuda_without_cuda_is_one_line(sub: str) -> None:
    result = runner.invoke(app, ["precision", sub, "--device", "cuda"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --device cuda: no CUDA device is visible here (try --device cpu)"
    )


@pytest.mark.parametrize(
    "args", [["precision"], ["precision", "accumulate"], ["precision", "dtypes"]]
)
def test_help(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.stdout
