"""Findings of a new user's pass over every command: bad input is caught early and said once.

Each bad input must exit 2 with exactly one line on stderr (no blank line before it, no
traceback, no half-done work), checked through the real CLI on real files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from profkit.cli import app

runner = CliRunner()
DATA = Path(__file__).parent / "data"
SNAPSHOT = DATA / "memory-tiny-ctx64-train-fp32.pickle.xz"
NSYS_SQLITE = DATA / "nsys-2025.3-probe.sqlite"


def invoke(*args: str | Path) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def one_error(result: Any, *needles: str) -> str:
    """Assert exit 2, nothing on stdout and exactly one ``error:`` line on stderr."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == "", result.stdout
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return str(result.stderr)


def test_memory_summarize_unknown_device() -> None:
    one_error(invoke("memory", "summarize", SNAPSHOT, "--device", "5"), "no device 5; devices: 0")
    one_error(invoke("memory", "summarize", SNAPSHOT, "--device", "-1"), "no device -1")
    assert invoke("memory", "summarize", SNAPSHOT, "--device", "0").exit_code == 0
