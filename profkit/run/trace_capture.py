"""torch.profiler inside the child: one Chrome trace per rank of the timed steps.

``profkit torch --nproc N`` cannot profile in its own process as the one-GPU path does:
every rank is a process of its own under torchrun. Each rank records its timed steps
and writes ``STEM-rank{R}.json.gz`` (Kineto adds ``distributedInfo``: rank, world size,
backend), with profkit's header (config, rank, pid, host) beside it, so that
``profkit kernels STEM-rank*.json.gz`` reads them as the ranks of one run.

Both paths step the profiler with the run on one schedule (:func:`timed_schedule`): the
last warm-up step is the profiler's own warm-up (tracing on, results dropped), so
CUPTI's start-up lands there and not in the first recorded step; the recorded steps are
exactly the timed ones, each a ``ProfilerStep#N`` window in the trace.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import socket
import tempfile
import warnings
from pathlib import Path
from typing import Any

from profkit import __version__
from profkit.run import teardown
from profkit.run.quiet import Quietly
from profkit.workload.config import WorkloadConfig

RANK_SUFFIX = re.compile(r"-rank(?P<rank>\d+)\.json\.gz$")


def rank_trace_path(stem: str | Path, rank: int) -> Path:
    """``profiles/torch-small-ctx128-train-rank0.json.gz`` for stem ``...-train``."""
    stem = Path(stem)
    return stem.with_name(f"{stem.name}-rank{rank}.json.gz")


def rank_trace_stem(path: Path) -> tuple[str, int] | None:
    """``("torch-small-ctx128-train", 0)`` for a file named as :func:`rank_trace_path`
    names one; None for any other name."""
    found = RANK_SUFFIX.search(path.name)
    if found is None or not found.start():
        return None
    return path.name[: found.start()], int(found["rank"])


def timed_schedule(warmup: int, steps: int) -> Any:
    """The torch.profiler schedule that records exactly the timed steps of a run.

    ``wait`` covers the warm-up steps but the last, which is the profiler's ``warmup``
    (tracing on, results dropped: CUPTI's start-up cost stays out), then ``active`` the
    timed steps, once. The profiler must be stepped after every step, warm-up included.
    """
    from torch.profiler import schedule

    with warnings.catch_warnings():
        # --warmup 0 is the user's choice; the commands say what it costs.
        warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
        return schedule(wait=max(warmup - 1, 0), warmup=min(warmup, 1), active=steps, repeat=1)


class RankTracer:
    """Hooks that step torch.profiler with the run (:func:`timed_schedule`), then the trace
    of the timed steps written (gzip) per rank."""

    def __init__(self, stem: str, config: dict[str, Any] | None = None) -> None:
        self.stem = stem
        self.config = config
        self.profiler: Any = None
        self.path: Path | None = None

    def hooks(self, config: WorkloadConfig, rank: int) -> tuple[Any, Any]:
        """``(step_start, stop)``: before every step (``Workload.run``'s ``on_step_start``),
        and after the last timed one (its ``on_timed_end``)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
            teardown.cuda_profiled()  # the child ends without the teardown (run.teardown)
        self.path = rank_trace_path(self.stem, rank)
        self.config = config.to_dict()
        self.profiler = profile(
            activities=activities,
            schedule=timed_schedule(config.warmup, config.steps),
            on_trace_ready=lambda _prof: self._write(rank),
        )
        stepped = Quietly(self.profiler)  # Kineto's lines would crowd a failure's stderr tail

        def step_start(index: int) -> None:
            if index == 0:
                stepped.__enter__()
            else:
                stepped.step()  # the previous step ended: the schedule moves on

        def stop() -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            stepped.step()  # the last timed step ended: its cycle is saved
            stepped.__exit__(None, None, None)

        return step_start, stop

    def _write(self, rank: int) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="profkit-trace-") as tmp:
            raw = Path(tmp) / "trace.json"
            self.profiler.export_chrome_trace(str(raw))
            doc = json.loads(raw.read_text())
            doc["profkit"] = {
                "command": "torch",
                "version": __version__,
                "config": self.config,
                "rank": rank,
                "world_size": int(os.environ.get("WORLD_SIZE", 1)),
                "pid": os.getpid(),
                "host": socket.gethostname(),
            }
            partial = self.path.with_name(self.path.name + ".tmp")
            with gzip.open(partial, "wt") as out:
                json.dump(doc, out)
            shutil.move(partial, self.path)
