"""The workload options are declared once: every command that runs the model shows the same.

``bench``, ``nsys``, ``torch`` and ``memory capture`` take them with WorkloadConfig's
defaults (a command may lower a default: torch and memory record one step); ``compare``
takes them as filters, where an option left out matches any value.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from profkit.cli import app
from profkit.cli._common import WORKLOAD_OPTIONS, WorkloadOptions, command, workload_options
from profkit.workload.config import WorkloadConfig

runner = CliRunner()

RUNS = {  # the command, and the defaults it changes
    ("bench",): {},
    ("nsys",): {},
    ("torch",): {"steps": 1},
    ("memory", "capture"): {"steps": 1, "warmup": 1},
}
COMMANDS = [*RUNS, ("compare",)]
FLAGS = [
    "--size", "--ctx", "--batch", "--mode", "--dtype", "--bf16", "--compile", "--attention",
    "--warmup", "--steps", "--device", "--nproc", "--parallel", "--threads",
]  # fmt: skip


def _id(path: tuple[str, ...]) -> str:
    return "profkit " + " ".join(path)  # not bare "nsys": that keyword means "needs nsys"


def _click_command(path: tuple[str, ...]) -> Any:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def _workload_params(path: tuple[str, ...]) -> list[Any]:
    return [p for p in _click_command(path).params if p.name in WORKLOAD_OPTIONS]


@pytest.mark.parametrize("path", COMMANDS, ids=_id)
def test_every_workload_command_lists_the_same_options_in_help(path: tuple[str, ...]) -> None:
    assert [p.opts[0] for p in _workload_params(path)] == FLAGS
    text = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output
    for flag in FLAGS:
        assert f" {flag} " in text, flag
    assert "tiny small medium large xl 2.7B 10B" in text
    assert "forward | forward-backward | train" in text


SINGLE = {("torch",)}  # runs one config: one value per option (nsys: "medium" would be its program)
SWEEPS = ("size", "ctx", "batch", "mode", "dtype", "attention", "warmup", "nproc", "parallel")


def test_help_texts_are_the_same_in_every_run_command() -> None:
    helps = {path: [p.help for p in _workload_params(path)] for path in RUNS}
    sweeps = {tuple(h) for path, h in helps.items() if path not in SINGLE}
    singles = {tuple(h) for path, h in helps.items() if path in SINGLE}
    assert len(sweeps) == 1 and len(singles) <= 1
    for single in singles:  # the same words, for one value: `Model size:`, `no | yes.`
        (sweep,) = sweeps
        assert [h.replace("(s)", "") for h in sweep if "both" not in h] == [
            h for h in single if "no | yes." not in h
        ]


@pytest.mark.parametrize("path", list(RUNS), ids=_id)
def test_defaults_come_from_workload_config(path: tuple[str, ...]) -> None:
    config = {**dataclasses.asdict(WorkloadConfig()), **RUNS[path]}
    defaults = {p.name: p.default for p in _workload_params(path)}
    if path in SINGLE:  # one value per option: the same defaults, not in lists
        defaults = {k: [v] if k in SWEEPS else v for k, v in defaults.items()}
    assert defaults == {
        "size": ["small"],
        "ctx": [config["ctx"]],
        "batch": [config["batch"]],
        "mode": [config["mode"]],
        "dtype": [config["dtype"]],
        "bf16": False,
        "compile": "no",
        "attention": [config["attention"]],
        "warmup": [config["warmup"]],
        "steps": config["steps"],
        "device": "auto",
        "nproc": [1],
        "parallel": ["ddp"],
        "threads": None,
    }


def test_compare_filters_have_no_defaults_and_all_take_lists() -> None:
    params = _workload_params(("compare",))
    assert {p.name: p.default for p in params} == {
        name: (False if name == "bf16" else None if name == "compile" else [])
        for name in WORKLOAD_OPTIONS
    }
    assert [p.name for p in params if p.multiple] == [
        "size", "ctx", "batch", "mode", "dtype", "attention", "warmup", "steps", "device",
        "nproc", "parallel", "threads",
    ]  # fmt: skip


# A command of a throwaway app, parsed by the real Typer/click, prints what it was given.
probe = typer.Typer()
filters_probe = typer.Typer()


def _show(workload: WorkloadOptions) -> None:
    value = dataclasses.asdict(workload)
    value["configs"] = [c.label() for c in workload.configs()] if workload.size else None
    print(json.dumps(value))


@command(probe, "run")
@workload_options()
def _run(*, workload: WorkloadOptions) -> None:
    _show(workload)


@command(filters_probe, "filter")
@workload_options(filters=True)
def _filter(*, workload: WorkloadOptions) -> None:
    _show(workload)


def _probe(app_: typer.Typer, *args: str) -> dict[str, Any]:
    result = runner.invoke(app_, list(args))
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_defaults_make_one_config() -> None:
    value = _probe(probe)
    assert value["configs"] == ["small-ctx256-train-fp32"]
    assert value["given"] == [] and value["compile"] == [False] and value["steps"] == [10]


def test_lists_after_one_flag_sweep_in_order() -> None:
    value = _probe(probe, "--size", "tiny", "small", "--ctx", "64", "128", "--compile", "both")
    assert value["configs"] == [
        "tiny-ctx64-train-fp32", "tiny-ctx64-train-fp32-compiled",
        "tiny-ctx128-train-fp32", "tiny-ctx128-train-fp32-compiled",
        "small-ctx64-train-fp32", "small-ctx64-train-fp32-compiled",
        "small-ctx128-train-fp32", "small-ctx128-train-fp32-compiled",
    ]  # fmt: skip
    assert value["given"] == ["size", "ctx", "compile"]


def test_one_process_has_no_parallelism_to_sweep() -> None:
    value = _probe(probe, "--size", "tiny", "--nproc", "1", "2", "--parallel", "ddp", "fsdp")
    assert value["configs"] == [
        "tiny-ctx256-train-fp32", "tiny-ctx256-train-fp32-ddp2", "tiny-ctx256-train-fp32-fsdp2",
    ]  # fmt: skip


def test_parallel_without_several_processes_is_refused() -> None:
    result = runner.invoke(probe, ["--size", "tiny", "--nproc", "1", "--parallel", "fsdp"])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --parallel fsdp needs several processes: add --nproc 2 (or more), "
        "or leave --parallel out\n"
    )
    defaulted = _probe(probe, "--size", "tiny", "--nproc", "1")  # not typed: nothing to refuse
    assert defaulted["configs"] == ["tiny-ctx256-train-fp32"]


@pytest.mark.parametrize(
    ("args", "dtypes"),
    [
        (["--bf16"], ["bf16"]),
        (["--dtype", "fp32", "--bf16"], ["fp32", "bf16"]),
        (["--dtype", "bf16", "--bf16"], ["bf16"]),
        (["--dtype", "fp16"], ["fp16"]),
    ],
)
def test_bf16_is_shorthand_for_dtype_bf16(args: list[str], dtypes: list[str]) -> None:
    assert _probe(probe, *args)["dtype"] == dtypes


def test_filters_left_out_match_anything() -> None:
    value = _probe(filters_probe)
    assert all(
        value[name] == [] for name in WorkloadOptions.__dataclass_fields__ if name != "given"
    )
    value = _probe(filters_probe, "--bf16", "--compile", "both", "--steps", "5", "10")
    assert value["dtype"] == ["bf16"] and value["compile"] == [False, True]
    assert value["steps"] == [5, 10] and value["size"] == []


def test_a_bad_value_is_one_line_exit_2() -> None:
    result = runner.invoke(probe, ["--mode", "backward"])
    assert result.exit_code == 2
    assert result.output == (
        "error: unknown --mode 'backward'; choose one of: forward, forward-backward, train\n"
    )


def test_workload_options_with_a_program_are_refused() -> None:
    result = runner.invoke(
        app, ["nsys", "--dry-run", "--size", "tiny", "--bf16", "--", "python", "train.py"]
    )
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --size, --bf16: workload options apply to the built-in model, not a program\n"
    )


def _leaf_commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if hasattr(command, "commands"):
        return [
            leaf
            for name, sub in command.commands.items()
            for leaf in _leaf_commands(sub, (*path, name))
        ]
    return [(path, command)]


def test_every_written_file_is_out_and_every_format_is_f() -> None:
    commands = _leaf_commands(typer.main.get_command(app))
    assert len(commands) == 18  # cache info and cache clear too
    for path, cmd in commands:
        opts = {p.name: p.opts for p in cmd.params}
        assert not any("--output" in o for o in opts.values()), path
        if "out" in opts:
            assert opts["out"][:2] == ["--out", "-o"], path
        if "fmt" in opts:
            assert opts["fmt"] == ["--format", "-f"], path


@pytest.mark.parametrize("path", [("bench",), ("memory", "capture")], ids=_id)
def test_timeout_is_checked_once_for_every_command(path: tuple[str, ...]) -> None:
    result = runner.invoke(app, [*path, "--size", "tiny", "--timeout", "0"])
    assert result.exit_code == 2
    assert result.output == "error: --timeout must be a positive number of seconds, got 0\n"
