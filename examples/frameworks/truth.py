"""What the framework programs share: the truth marks and the profiling window.

The truth marks are NVTX start/end ranges in a domain of their own, ``truth``, named
``forward``, ``backward`` and ``optimizer``. Each program opens and closes them from the
framework's own hooks, on the main thread, so a trace says exactly when each phase ran;
profkit, which looks for phases in the default domain and inside the frameworks' code,
must not read them as its phases: they are the answer its phases are checked against.
torch.profiler does not record NVTX, so with ``--truth-record-function`` the same marks
are also ``record_function`` ranges named ``truth:forward`` and so on (Chrome traces).

The window is the steps a profiler sees: the last ``--profile-steps`` optimizer steps of
``--steps``. ``--capture-range`` calls cudaProfilerStart/Stop around it (for
``nsys --capture-range=cudaProfilerApi``); ``--torch-profiler`` records it with a
torch.profiler schedule and writes ``TRACE_DIR/NAME-rank{r}.json.gz``. Every program ends
by printing one JSON line per rank: the steps and the marks closed inside the window.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nvtx
import torch

DOMAIN = "truth"


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """The flags every framework program takes."""
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps in all")
    parser.add_argument(
        "--profile-steps", type=int, default=3, help="the last N optimizer steps are profiled"
    )
    parser.add_argument("--batch", type=int, default=8, help="sequences per micro-batch and rank")
    parser.add_argument("--ctx", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    parser.add_argument(
        "--checkpointing", action="store_true", help="activation checkpointing on the blocks"
    )
    parser.add_argument(
        "--capture-range",
        action="store_true",
        help="cudaProfilerStart/Stop around the profiled steps (nsys cudaProfilerApi)",
    )
    parser.add_argument("--torch-profiler", action="store_true", help="record the profiled steps")
    parser.add_argument("--trace-dir", type=Path, default=Path("traces"))
    parser.add_argument("--name", default=name, help="trace file name stem")
    parser.add_argument(
        "--truth-record-function",
        action="store_true",
        help="also emit the truth marks as record_function ranges truth:NAME",
    )


def gpt2_config(ctx: int) -> Any:
    """A two-block GPT-2, built from its config (nothing downloaded)."""
    from transformers import GPT2Config

    return GPT2Config(
        n_layer=2,
        n_embd=128,
        n_head=4,
        vocab_size=1000,
        n_positions=ctx,
        bos_token_id=0,
        eos_token_id=0,
    )


def random_tokens(count: int, ctx: int, vocab: int = 1000) -> torch.Tensor:
    """Synthetic training data: the same on every rank (the samplers split it)."""
    return torch.randint(0, vocab, (count, ctx), generator=torch.Generator().manual_seed(0))


class Truth:
    """Opens and closes the truth marks; counts those closed inside the profiling window."""

    def __init__(self, record_function: bool = False) -> None:
        self.record_function = record_function
        self.in_window = False
        self.closed: Counter[str] = Counter()
        self.closed_in_window: Counter[str] = Counter()
        self._open: dict[str, tuple[Any, Any]] = {}

    def start(self, name: str) -> None:
        if name in self._open:
            raise RuntimeError(f"truth mark {name!r} opened twice")
        handle = nvtx.start_range(message=name, domain=DOMAIN)
        record = None
        if self.record_function:
            record = torch.autograd.profiler.record_function(f"{DOMAIN}:{name}")
            record.__enter__()
        self._open[name] = (handle, record)

    def end(self, name: str) -> None:
        handle, record = self._open.pop(name)
        if record is not None:
            record.__exit__(None, None, None)
        nvtx.end_range(handle)
        self.closed[name] += 1
        if self.in_window:
            self.closed_in_window[name] += 1

    def end_if_open(self, name: str) -> None:
        if name in self._open:
            self.end(name)

    @contextlib.contextmanager
    def mark(self, name: str) -> Iterator[None]:
        self.start(name)
        try:
            yield
        finally:
            self.end(name)

    def mark_forward(self, model: torch.nn.Module) -> None:
        """``forward`` from the model's forward pre-hook to its forward hook."""
        model.register_forward_pre_hook(lambda *_: self.start("forward"))
        model.register_forward_hook(lambda *_: self.end("forward"))


class Window:
    """The profiled steps: the last ``profile_steps`` of ``steps`` optimizer steps.

    The framework's callbacks call ``step_begin(done)`` before each (micro-)batch and
    ``step_end(done)`` after it, ``done`` being the optimizer steps finished so far.
    """

    def __init__(self, args: argparse.Namespace, truth: Truth) -> None:
        self.args, self.truth = args, truth
        self.first = max(args.steps - args.profile_steps, 0)
        self.last_end = args.steps
        self.cuda = args.device == "cuda"
        self.rank = 0
        self.profiler: torch.profiler.profile | None = None
        self._done = 0
        self._state = "before"  # "before", "open", "after"

    def train_begin(self, rank: int) -> None:
        self.rank = rank
        if not self.args.torch_profiler:
            return
        self.args.trace_dir.mkdir(parents=True, exist_ok=True)
        path = self.args.trace_dir / f"{self.args.name}-rank{rank}.json.gz"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        warmup = min(self.first, 1)
        self.profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=self.first - warmup, warmup=warmup, active=self.args.profile_steps, repeat=1
            ),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
        )
        self.profiler.start()

    def step_begin(self, done: int) -> None:
        if self._state == "before" and done >= self.first:
            self._state = "open"
            self.truth.in_window = True
            if self.args.capture_range and self.cuda:
                torch.cuda.synchronize()  # earlier steps' kernels stay out of the capture
                torch.cuda.cudart().cudaProfilerStart()

    def step_end(self, done: int) -> None:
        if done == self._done:
            return  # a micro-batch that did not step the optimizer
        self._done = done
        if self.profiler is not None:
            self.profiler.step()
        if self._state == "open" and done >= self.last_end:
            self._close()

    def train_end(self) -> None:
        if self._state == "open":
            self._close()
        if self.profiler is not None:
            self.profiler.stop()  # writes the trace if the schedule has not yet

    def _close(self) -> None:
        self._state = "after"
        self.truth.in_window = False
        if self.args.capture_range and self.cuda:
            torch.cuda.synchronize()  # the last step's kernels finish inside the capture
            torch.cuda.cudart().cudaProfilerStop()

    def report(self, program: str, world_size: int, **extra: Any) -> None:
        """One JSON line for this rank: what ran and the marks inside the window."""
        row = {
            "program": program,
            "name": self.args.name,
            "rank": self.rank,
            "world_size": world_size,
            "device": self.args.device,
            "steps": self.args.steps,
            "profile_steps": self.args.profile_steps,
            "accumulate": self.args.accumulate,
            "optimizer_steps_done": self._done,
            "truth_marks": dict(self.truth.closed),
            "truth_marks_in_window": dict(self.truth.closed_in_window),
            **extra,
        }
        print("TRUTH " + json.dumps(row, sort_keys=True), flush=True)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))
