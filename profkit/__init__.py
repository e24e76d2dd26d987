"""profkit: profiling orchestration for PyTorch Transformer language models.

The public helper for user code lives here: ``profkit.phase`` marks a phase of a training
step (an NVTX range and a ``record_function`` range at once), so a user's own loop gets
the same per-phase tables as the built-in workload. It is imported on first use: the
trace-reading commands never need torch, and importing it costs about a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["__version__", "phase"]

if TYPE_CHECKING:
    from profkit.workload.annotate import phase


def __getattr__(name: str) -> Any:
    if name == "phase":
        from profkit.workload.annotate import phase

        return phase
    raise AttributeError(f"module 'profkit' has no attribute {name!r}")
