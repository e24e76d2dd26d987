"""The workload: modes, timings kept per step, and phase ranges visible to torch.profiler."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import profkit
from profkit.workload.config import WorkloadConfig
from profkit.workload.step import Workload


@pytest.mark.parametrize(
    ("mode", "phases"),
    [
        ("forward", {"forward"}),
        ("forward-backward", {"forward", "backward"}),
        ("train", {"forward", "backward", "optimizer"}),
    ],
)
def test_modes_time_their_phases(mode: str, phases: set[str]) -> None:
    config = WorkloadConfig(size="tiny", ctx=16, mode=mode, warmup=1, steps=3, device="cpu")
    result = Workload(config).run()
    assert len(result.warmup_steps) == 1 and len(result.steps) == 3
    for name in ("forward", "backward", "optimizer"):
        stats = result.stats(name)
        assert (stats is not None) == (name in phases)
        if stats is not None:
            assert 0 < stats.min <= stats.median <= stats.max
    step = result.steps[0]
    assert step.step_ms == pytest.approx(
        step.forward_ms + (step.backward_ms or 0) + (step.optimizer_ms or 0)
    )


def test_train_mode_updates_weights() -> None:
    workload = Workload(WorkloadConfig(size="tiny", ctx=16, warmup=0, steps=1, device="cpu"))
    before = workload.model.lm_head.weight.detach().clone()
    workload.step()
    assert not torch.equal(before, workload.model.lm_head.weight)


def test_hooks_run_around_timed_steps_only() -> None:
    calls: list[str] = []
    config = WorkloadConfig(size="tiny", ctx=16, mode="forward", warmup=2, steps=2, device="cpu")
    Workload(config).run(
        on_timed_start=lambda: calls.append("start"),
        on_step_end=lambda i, _t: calls.append(f"step{i}"),
        on_timed_end=lambda: calls.append("end"),
        on_step_start=lambda i: calls.append(f"begin{i}"),
    )
    # on_step_start precedes every step, warm-up included (a profiler schedule steps with it).
    assert calls == ["begin0", "begin1", "start", "begin2", "step0", "begin3", "step1", "end"]


def test_phase_and_attention_ranges_reach_torch_profiler() -> None:
    config = WorkloadConfig(size="tiny", ctx=16, warmup=0, steps=1, device="cpu")
    workload = Workload(config)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        workload.step()
    names = {event.name for event in prof.events()}
    assert {"forward", "backward", "optimizer"} <= names
    assert {
        "scaled dot product attention",
        "computing attention scores",
        "computing softmax",
        "final matmul",
    } <= names


def test_public_phase_helper_is_a_context_manager_and_decorator() -> None:
    @profkit.phase("my-optimizer")
    def step() -> int:
        return 7

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with profkit.phase("my-forward"):
            torch.ones(3).sum()
        assert step() == 7
    names = [event.name for event in prof.events()]
    assert "my-forward" in names and "my-optimizer" in names


def test_bf16_autocast_runs_on_cpu() -> None:
    config = WorkloadConfig(size="tiny", ctx=16, dtype="bf16", warmup=0, steps=1, device="cpu")
    assert Workload(config).run().stats("optimizer") is not None
