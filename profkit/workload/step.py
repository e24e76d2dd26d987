"""One training step of the built-in model, split into annotated, timed phases.

Timing uses ``synchronize`` + ``time.perf_counter`` around each phase rather than CUDA
events: it measures what the user waits for (Python and launch overhead included, which
dominates small models), it works the same on CPU, MPS and CUDA, and the phases need a
synchronisation at their boundaries anyway for the split to mean anything. The cost is
one device round trip per phase (microseconds), which ``benchmarks/timing_overhead.py``
measures against a bare loop.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from profkit.workload import parallel
from profkit.workload.annotate import phase
from profkit.workload.config import WorkloadConfig, resolve_device
from profkit.workload.model import BasicsTransformerLM, build_model
from profkit.workload.names import BACKWARD, FORWARD, OPTIMIZER

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@dataclass
class StepTimes:
    """Wall-clock milliseconds of each phase of one step (``None`` where the mode has none)."""

    forward_ms: float
    backward_ms: float | None = None
    optimizer_ms: float | None = None

    @property
    def step_ms(self) -> float:
        return self.forward_ms + (self.backward_ms or 0.0) + (self.optimizer_ms or 0.0)


@dataclass
class Stats:
    mean: float
    std: float
    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        return cls(
            mean=statistics.fmean(values),
            std=statistics.stdev(values) if len(values) > 1 else 0.0,
            min=min(values),
            median=statistics.median(values),
            max=max(values),
        )


@dataclass
class RunResult:
    """What a run of warm-up plus timed steps measured."""

    config: WorkloadConfig
    device: str
    warmup_steps: list[StepTimes] = field(default_factory=list)
    steps: list[StepTimes] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    model_build_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the child's JSON result: every step's times, kept per step."""
        return {
            "device": self.device,
            "warmup_steps": [asdict(s) for s in self.warmup_steps],
            "steps": [asdict(s) for s in self.steps],
            "peak_memory_bytes": self.peak_memory_bytes,
            "model_build_s": self.model_build_s,
        }

    def stats(self, phase_name: str) -> Stats | None:
        values = [getattr(s, f"{phase_name}_ms") for s in self.steps]
        if not values or values[0] is None:
            return None
        return Stats.of(values)


class Workload:
    """The model, a random batch, AdamW, and a step function with phase ranges."""

    def __init__(self, config: WorkloadConfig, device: str | None = None) -> None:
        self.config = config
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        self.ranks, self.device = parallel.init(
            torch.device(device or resolve_device(config.device))
        )
        torch.manual_seed(config.seed)  # the same weights on every rank
        started = time.perf_counter()
        self.model: BasicsTransformerLM = build_model(
            config.size, config.ctx, config.attention, config.vocab_size, self.device
        )
        self.model_build_s = time.perf_counter() - started
        wrapped: torch.nn.Module = self.model
        if self.ranks.distributed:
            wrapped = parallel.wrap(self.model, config.parallel, self.device)
        self.forward_fn: Callable[[torch.Tensor], torch.Tensor] = (
            torch.compile(wrapped) if config.compile else wrapped  # type: ignore[assignment]
        )
        # Each rank its own batch (data parallel): the seed plus the rank.
        generator = torch.Generator(device="cpu").manual_seed(config.seed + self.ranks.rank)
        shape = (config.batch, config.ctx)
        self.inputs = torch.randint(0, config.vocab_size, shape, generator=generator).to(
            self.device
        )
        self.targets = torch.randint(0, config.vocab_size, shape, generator=generator).to(
            self.device
        )
        self.optimizer = (
            torch.optim.AdamW(self.model.parameters(), lr=1e-4) if config.has_optimizer else None
        )
        self.on_phase_end: Callable[[str], None] | None = None
        """Called with the phase name after each phase, outside its timing (memory probes)."""

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        dtype = AUTOCAST_DTYPES.get(self.config.dtype)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _timed(self, name: str, fn: Callable[[], Any]) -> tuple[Any, float]:
        with phase(name):
            started = time.perf_counter()
            result = fn()
            synchronize(self.device)
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if self.on_phase_end is not None:
            self.on_phase_end(name)
        return result, elapsed_ms

    def _forward(self) -> torch.Tensor:
        with self._autocast():
            logits = self.forward_fn(self.inputs)
            return F.cross_entropy(logits.flatten(0, 1), self.targets.flatten())

    def _optimizer_step(self) -> None:
        assert self.optimizer is not None
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> StepTimes:
        """One step: forward, then backward and optimizer as the mode asks; each phase timed."""
        if self.config.mode == "forward-backward":
            self.model.zero_grad(set_to_none=True)  # untimed: keep grads from accumulating
        synchronize(self.device)
        loss, forward_ms = self._timed(FORWARD, self._forward)
        times = StepTimes(forward_ms)
        if self.config.has_backward:
            _, times.backward_ms = self._timed(BACKWARD, loss.backward)
        if self.optimizer is not None:
            _, times.optimizer_ms = self._timed(OPTIMIZER, self._optimizer_step)
        return times

    def run(
        self,
        on_timed_start: Callable[[], None] | None = None,
        on_step_end: Callable[[int, StepTimes], None] | None = None,
        on_timed_end: Callable[[], None] | None = None,
        on_step_start: Callable[[int], None] | None = None,
    ) -> RunResult:
        """Warm-up steps, then timed steps. The hooks let profilers capture only timed steps;
        ``on_step_start(i)`` runs before every step, warm-up ones included (``i`` counts
        them all, warm-up first), for a profiler schedule that steps with the run."""
        result = RunResult(self.config, str(self.device), model_build_s=self.model_build_s)
        for index in range(self.config.warmup):
            if on_step_start:
                on_step_start(index)
            result.warmup_steps.append(self.step())
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if on_timed_start:
            on_timed_start()
        for index in range(self.config.steps):
            if on_step_start:
                on_step_start(self.config.warmup + index)
            times = self.step()
            result.steps.append(times)
            if on_step_end:
                on_step_end(index, times)
        if on_timed_end:
            on_timed_end()
        if self.device.type == "cuda":
            result.peak_memory_bytes = torch.cuda.max_memory_allocated(self.device)
        return result
