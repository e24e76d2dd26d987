"""The README's examples that write files leave the checkout clean.

Each example runs as a user would type it, from the root of a fresh clone of this checkout
(the code under test is this checkout's, through PYTHONPATH); afterwards ``git status
--porcelain`` in the clone must be empty: every file a command writes lands in an ignored
output folder (profiles/, reports/), never on a committed file such as the H100 results in
docs/results/.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()

# Every example here is quoted from the README (checked below), so the two cannot drift.
EXAMPLES = [
    "profkit demo",
    "profkit bench --size tiny --warmup 0 1 5 --device cpu --format md --out reports/warmup.md",
    "profkit kernels profiles/examples/small-ctx128-train-fp32.sqlite --format md --out reports/small.md",
    "profkit torch --size tiny --ctx 64 --device cpu",
    "profkit report",
]


def test_every_example_is_in_the_readme() -> None:
    for example in EXAMPLES:
        assert example in README, example


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    target = tmp_path_factory.mktemp("readme") / "profkit"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(target)], check=True
    )
    return target


@pytest.mark.slow
def test_readme_examples_leave_the_checkout_clean(clone: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PROFKIT_DB", None)  # the README's commands use the default DB, in the clone
    for example in EXAMPLES:
        argv = [sys.executable, "-m", *shlex.split(example)]
        done = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{example}: {done.stderr[-2000:]}"
    # Each example wrote something, and all of it is in ignored output folders.
    assert (clone / "reports" / "warmup.md").exists()
    assert (clone / "reports" / "small.md").exists()
    assert (clone / "reports" / "REPORT.md").exists()
    assert (clone / "profiles" / "results.db").exists()
    assert _git("status", "--porcelain", "--untracked-files=all", cwd=clone) == ""
