"""How much does profkit's measurement itself cost? Two checks, run on the GPU.

(a) profkit's ``Workload`` (phase ranges, a synchronize at every phase boundary) against a
    minimal hand-written timing loop of the same model, batch and optimizer in the same
    process (synchronize, ``perf_counter``, the step, synchronize): forward time and whole
    train-step time. Target: within 3%.
(b) profkit's annotations (NVTX push/pop + the record_function check) on against off (the
    ``annotate`` context manager made a no-op), with no profiler attached. Target: within 1%.

Variants are interleaved round by round (ABAB..., the order alternating each round) so
drift in clocks and temperature hits both alike; each row reports the median over every
timed step. Usage::

    python benchmarks/timing_overhead.py                    # small and large, fp32 and bf16
    python benchmarks/timing_overhead.py --size tiny --device cpu --rounds 2   # smoke test

Writes a markdown table to stdout and, when ``$OUT`` is set, to ``$OUT/timing_overhead.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from profkit.workload.annotate import annotate
from profkit.workload.config import WorkloadConfig
from profkit.workload.step import Workload, synchronize

Timer = Callable[[], float]


def hand_forward(w: Workload) -> Timer:
    """The loop a user writes by hand: synchronize, start the clock, forward, synchronize."""
    autocast = w._autocast  # same autocast as profkit: the comparison is the timing only

    def run() -> float:
        synchronize(w.device)
        started = time.perf_counter()
        with autocast():
            logits = w.model(w.inputs)
            F.cross_entropy(logits.flatten(0, 1), w.targets.flatten())
        synchronize(w.device)
        return (time.perf_counter() - started) * 1e3

    return run


def hand_step(w: Workload) -> Timer:
    """Forward, backward and AdamW step with one synchronize at each end."""
    autocast, optimizer = w._autocast, w.optimizer
    assert optimizer is not None

    def run() -> float:
        synchronize(w.device)
        started = time.perf_counter()
        with autocast():
            logits = w.model(w.inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), w.targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(w.device)
        return (time.perf_counter() - started) * 1e3

    return run


@contextmanager
def annotations_off() -> Iterator[None]:
    """Make every profkit range (phases and attention sub-ranges) a no-op while inside."""
    enter, exit_ = annotate.__enter__, annotate.__exit__
    annotate.__enter__ = lambda self: self  # type: ignore[method-assign]
    annotate.__exit__ = lambda self, *exc: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        annotate.__enter__, annotate.__exit__ = enter, exit_  # type: ignore[method-assign]


@contextmanager
def nothing() -> Iterator[None]:
    yield


def interleave(
    a: Timer, b: Timer, rounds: int, per_round: int, b_context: Callable = nothing
) -> tuple[float, float]:
    """Median step time of ``a`` and of ``b``, run alternately (order flipped every round)."""
    times: dict[str, list[float]] = {"a": [], "b": []}
    for _ in range(3):  # warm both paths (allocator, cuBLAS heuristics)
        a()
        with b_context():
            b()
    for index in range(rounds):
        order = ("a", "b") if index % 2 == 0 else ("b", "a")
        for name in order:
            if name == "a":
                times["a"] += [a() for _ in range(per_round)]
            else:
                with b_context():
                    times["b"] += [b() for _ in range(per_round)]
    return statistics.median(times["a"]), statistics.median(times["b"])


def measure(size: str, dtype: str, device: str, rounds: int, per_round: int) -> list[dict]:
    base = WorkloadConfig(size=size, ctx=256, dtype=dtype, warmup=0, steps=1, device=device)
    rows = _forward_rows(base, rounds, per_round) + _train_rows(base, rounds, per_round)
    if device == "cuda":
        torch.cuda.empty_cache()  # the workloads are gone; give their memory back
    return rows


def _forward_rows(base: WorkloadConfig, rounds: int, per_round: int) -> list[dict]:
    w = Workload(base.replace(mode="forward"))
    ours, hand = interleave(lambda: w.step().forward_ms, hand_forward(w), rounds, per_round)
    return [row("forward: profkit vs hand loop", base, ours, hand, 3.0)]


def _train_rows(base: WorkloadConfig, rounds: int, per_round: int) -> list[dict]:
    w = Workload(base.replace(mode="train"))
    ours, hand = interleave(lambda: w.step().step_ms, hand_step(w), rounds, per_round)
    on, off = interleave(
        lambda: w.step().step_ms,
        lambda: w.step().step_ms,
        rounds,
        per_round,
        b_context=annotations_off,
    )
    return [
        row("train step: profkit vs hand loop", base, ours, hand, 3.0),
        row("train step: annotations on vs off", base, on, off, 1.0),
    ]


def row(what: str, config: WorkloadConfig, ours: float, reference: float, target: float) -> dict:
    diff = (ours - reference) / reference * 100
    return {
        "comparison": what,
        "size": config.size,
        "dtype": config.dtype,
        "measured_ms": ours,
        "reference_ms": reference,
        "difference_pct": diff,
        "target_pct": target,
        "within": abs(diff) <= target,
    }


def markdown(rows: list[dict], header: str) -> str:
    lines = [
        header,
        "",
        "| comparison | size | dtype | profkit ms (median) | reference ms (median) "
        "| difference | target | within |",
        "|:---|:---|:---|---:|---:|---:|---:|:---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['comparison']} | {r['size']} | {r['dtype']} | {r['measured_ms']:.3f} "
            f"| {r['reference_ms']:.3f} | {r['difference_pct']:+.2f}% "
            f"| ±{r['target_pct']:g}% | {'yes' if r['within'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", nargs="+", default=["small", "large"])
    parser.add_argument("--dtype", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=5)
    args = parser.parse_args()

    started = time.perf_counter()
    rows = []
    for size in args.size:
        for dtype in args.dtype:
            rows += measure(size, dtype, args.device, args.rounds, args.per_round)
            print(f"measured {size} {dtype} ({time.perf_counter() - started:.0f} s)", flush=True)
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    header = (
        f"Timing overhead on {where}, torch {torch.__version__}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d}: ctx 256, batch 4; {args.rounds} interleaved "
        f"rounds of {args.per_round} steps per variant; medians over all timed steps. "
        "Reference = the hand-written loop, or annotations off."
    )
    text = markdown(rows, header)
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, "timing_overhead.md").write_text(text)
    failed = [r for r in rows if not r["within"]]
    print(
        f"summary: {len(rows) - len(failed)}/{len(rows)} comparisons within target "
        f"in {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
