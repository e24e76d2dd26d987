"""Ending the process without the interpreter's teardown once torch.profiler ran on CUDA.

torch 2.11 (CUDA 13) can free CUPTI's activity buffers twice while the interpreter shuts
down: ``double free or corruption`` and exit status 134 in 1 of 5 and 2 of 8 runs of
``profkit torch --size small --ctx 128`` on an H100, every time *after* the command had
written its traces and report and said so (upstream: pytorch/pytorch pull request 195207,
"Do not free activity buffers libcupti still holds in reset()"). A script that checks the
status then fails a run that succeeded.

So once a process has run torch.profiler on CUDA (:func:`cuda_profiled`: ``profkit
torch`` in profkit's own process, or a rank's trace under ``--nproc``), :func:`leave`
ends it with ``os._exit`` after flushing stdout and stderr, called by ``profkit.cli.main``
and by the child's ``__main__`` once its result is written: the status is the command's
(a rank's, which torchrun reads), and the teardown that aborts never runs.
Everything profkit writes is closed (and the results DB committed) before a command
returns, so nothing waits for that teardown.
"""

from __future__ import annotations

import contextlib
import os
import sys

_state = {"cuda_profiled": False}


def cuda_profiled() -> None:
    """Say that torch.profiler recorded CUDA activity in this process."""
    _state["cuda_profiled"] = True


def leave(status: int) -> None:
    """End the process now with ``status`` if torch.profiler ran on CUDA here; else return."""
    if not _state["cuda_profiled"]:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to say
            stream.flush()
    os._exit(status)
