"""profkit: profiling orchestration for PyTorch Transformer language models.

The public helpers for user code live here: ``profkit.phase`` marks a phase of a
training step (an NVTX range and a ``record_function`` range at once), so a
user's own loop gets the same per-phase tables as the built-in workload.
"""

from profkit.annotate import annotate, phase

__version__ = "0.1.0"

__all__ = ["__version__", "annotate", "phase"]
