"""torch.profiler's start and stop without Kineto's log lines on stderr, or torch's
warning about cycles.

Kineto (torch 2.13's profiler backend) writes lines such as
``USDT:2026-11-23 17:41:35 4154:4154 SyncActivityProfilerHandler.cpp:52] profiler_start``
straight to file descriptor 2 whenever a profiler starts or stops, whatever
``KINETO_LOG_LEVEL`` says. They tell a user nothing, and in ``profkit torch`` or
``profkit demo`` they land between the progress bar and the tables.

:func:`kineto_quiet` points descriptor 2 at a temporary file for the duration of a start
or stop only (redirecting the whole run would make stderr a pipe, and rich would stop
drawing its progress bar), then writes back whatever else was written meanwhile.

It also hides torch's ``Profiler clears events at the end of each cycle`` warning (torch
2.11 gave it in ``profkit torch`` on CUDA): profkit's schedules record one cycle
(``repeat=1``), so what a cycle's end clears is nothing profkit keeps.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

KINETO_LINE = re.compile(rb"^(?:USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\] ")
"""A Kineto log line: kind, date and time, pid:tid, source file and line."""
CYCLE_WARNING = "Warning: Profiler clears events at the end of each cycle"


def without_kineto_lines(text: bytes) -> bytes:
    """``text`` less its Kineto log lines (every other byte kept, in order)."""
    return b"".join(line for line in text.splitlines(keepends=True) if not KINETO_LINE.match(line))


@contextlib.contextmanager
def kineto_quiet() -> Iterator[None]:
    """Drop Kineto's log lines written to descriptor 2 inside the block; keep the rest.

    Where that cannot be arranged (no descriptor 2, no temporary file), the block runs
    as it is: the lines are noise, never a reason to fail a run."""
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        warnings.filterwarnings("ignore", message=CYCLE_WARNING)
        try:
            caught = stack.enter_context(tempfile.TemporaryFile())
            saved = os.dup(2)
        except OSError:
            yield
            return
        stack.callback(os.close, saved)
        sys.stderr.flush()
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            caught.seek(0)
            kept = without_kineto_lines(caught.read())
            if kept:
                os.write(2, kept)


class Quietly:
    """A torch.profiler whose enter, step and exit (where its schedule starts and stops
    it) run under :func:`kineto_quiet`; ``inner`` is the profiler itself."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __enter__(self) -> Any:
        with kineto_quiet():
            return self.inner.__enter__()

    def step(self) -> None:
        with kineto_quiet():
            self.inner.step()

    def __exit__(self, *exc: object) -> Any:
        with kineto_quiet():
            return self.inner.__exit__(*exc)
