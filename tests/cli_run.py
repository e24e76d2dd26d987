"""``python -m profkit ...`` as a real subprocess, running this checkout's code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def profkit(
    *args: str, cwd: Path, env: dict[str, str] | None = None, drop: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run profkit in ``cwd``; ``env`` adds variables, ``drop`` removes inherited ones."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    for name in drop:
        full.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "profkit", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
