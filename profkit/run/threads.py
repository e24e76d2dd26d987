"""How many intra-op CPU threads a measurement uses: chosen from the cores free to us.

torch starts as many OpenMP threads as the machine has cores. On a shared machine that is
wrong: threads that outnumber the free cores wait for each other at every parallel region,
and a train step measured 577 ± 391 ms with default threads against 69 ± 10 ms with one
thread on a busy 2-core CI machine. So a sweep picks, once, the cores this process may use
(its CPU affinity, capped by a cgroup CPU quota) minus those other work keeps busy (the
1-minute load average), at least 1. ``--threads N`` or ``OMP_NUM_THREADS`` set it
explicitly. Every row records the count it ran with (``threads``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


@dataclass(frozen=True)
class ThreadChoice:
    """A thread count and where it came from (shown to the user)."""

    threads: int
    reason: str


def usable_cores() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def busy_cores() -> int:
    """Cores other work keeps busy: the 1-minute load average, rounded down (0 if unknown)."""
    try:
        return math.floor(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0


def choose_threads(requested: int | None = None) -> ThreadChoice:
    """``requested`` if given, else ``$OMP_NUM_THREADS`` if set, else the free cores (>= 1)."""
    if requested is not None:
        return ThreadChoice(requested, "--threads")
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return ThreadChoice(int(env), "OMP_NUM_THREADS")
    usable, busy = usable_cores(), busy_cores()
    free = max(1, usable - busy)
    return ThreadChoice(free, f"{usable} usable cores, {busy} busy (load average)")


def thread_env(threads: int) -> dict[str, str]:
    """Environment for a child that must use ``threads`` (read when torch loads OpenMP)."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
