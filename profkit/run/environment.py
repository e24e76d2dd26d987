"""Where a measurement was taken: GPU, software versions, code version, host and time.

Every results row carries this record so that a number can always be traced back to the
machine and the code that produced it.
"""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import profkit

_REPO_ROOT = Path(profkit.__file__).resolve().parents[1]


def utc_now() -> str:
    """The current time in UTC, ISO 8601 to the second (``2025-05-01T12:00:00Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(_REPO_ROOT), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str | None, bool | None]:
    """profkit's commit and whether its tracked files have changes, when run from a checkout."""
    if not (_REPO_ROOT / ".git").exists():  # an installed wheel: the version says it all
        return None, None
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, (bool(status) if status is not None else None)


def gpu_name() -> str | None:
    """Name of CUDA device 0 (``NVIDIA H100 80GB HBM3``), or None without CUDA.

    Reading device properties needs no CUDA context, so the parent of a sweep should take no
    GPU memory from its children by asking (``benchmarks/gpu_bench.sh`` checks this).
    """
    import torch

    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name(0))


def environment() -> dict[str, Any]:
    """The environment record stored with every result row (flat, JSON-friendly)."""
    import torch

    commit, dirty = git_state()
    return {
        "gpu_name": gpu_name(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "profkit_version": profkit.__version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "platform": platform.platform(terse=True),
        "timestamp_utc": utc_now(),
    }
