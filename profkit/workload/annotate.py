"""Annotation ranges: one call emits an NVTX range and a ``record_function`` range.

Nsight Systems sees the NVTX range; torch.profiler sees the ``record_function`` range;
both backends then meet in the same per-range tables. The cost when no profiler is
attached is one NVTX push/pop (tens of nanoseconds with no tool injected) and one check
of torch.profiler's enabled flag: ``record_function`` is entered only while a
torch.profiler session is recording, because entering it costs microseconds each time.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from profkit.workload.names import PHASES as PHASES  # re-exported: profkit.phase's names

try:  # the nvtx package works without CUDA; without it we still emit record_function
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - nvtx is a declared dependency
    _nvtx = None


def _profiler_enabled() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled)


def _compiling() -> bool:
    # Ranges inside a compiled region would break the graph; compiled kernels fuse anyway.
    return bool(torch.compiler.is_compiling())


class annotate(contextlib.ContextDecorator):
    """A named range for both backends; use as ``with annotate("x"):`` or ``@annotate("x")``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._record: Any = None
        self._pushed = False

    def __enter__(self) -> annotate:
        if _compiling():
            return self
        if _nvtx is not None:
            _nvtx.push_range(self.name)
            self._pushed = True
        if _profiler_enabled():
            self._record = torch.autograd.profiler.record_function(self.name)
            self._record.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._record is not None:
            self._record.__exit__(None, None, None)
            self._record = None
        if self._pushed:
            _nvtx.pop_range()
            self._pushed = False

    def _recreate_cm(self) -> annotate:
        # A decorated function may be re-entered (recursion, threads): fresh state each call.
        return annotate(self.name)


def phase(name: str) -> annotate:
    """Mark a phase of a training step (``forward``, ``backward``, ``optimizer`` or your own).

    profkit's tables attribute every kernel launched inside it (including the backward
    kernels that autograd launches from its own threads) to this phase::

        with profkit.phase("forward"):
            loss = model(x).sum()

        @profkit.phase("optimizer")
        def step(): ...
    """
    return annotate(name)
