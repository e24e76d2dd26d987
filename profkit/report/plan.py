"""What ``profkit report --run`` measures: declarative plans, one list of pieces each.

A :class:`Piece` is one run of an existing command's library function (``bench``,
``nsys``, ``torch``, ``memory``, ``attention``) with its configs. To change what a GPU
run costs, edit :data:`GPU_PLAN`: drop a piece, or shrink its grid. Every piece runs only
what ``profiles/`` and the results DB lack (see :mod:`profkit.report.run`).

Cost on one H100, estimated (each config is a fresh process): the course-size bench took
2 min 20 s for its 20 configs in the sweep behind tests/data/results-h100.db; the rest is
guessed from config counts (``torch.compile`` adds its compilation to each compiled
config) — 6-8 minutes in all from an empty DB. ``--run`` prints each piece's wall time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from profkit.errors import BadInput
from profkit.workload.config import WorkloadConfig
from profkit.workload.specs import COURSE_SIZES

KINDS = ("bench", "nsys", "torch", "memory", "attention")


@dataclass(frozen=True)
class Piece:
    """One unit of ``--run``: a kind of measurement and what to measure."""

    kind: str
    """``bench`` | ``nsys`` | ``torch`` | ``memory`` | ``attention``."""
    what: str
    """One line for the progress bar and the notes."""
    configs: tuple[WorkloadConfig, ...] = ()
    """The workload configs (bench, memory: all of them; nsys, torch: one each)."""
    attention: Mapping[str, Any] = field(default_factory=dict)
    """``AttentionSettings`` fields for an ``attention`` piece (built when it runs, since
    building one checks the device)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BadInput(f"unknown piece kind {self.kind!r}; choose one of: {', '.join(KINDS)}")


def sweep(**options: Any) -> tuple[WorkloadConfig, ...]:
    """The cross product of ``WorkloadConfig`` fields; a tuple or list value sweeps.

    ``sweep(size=("small", "medium"), mode=("forward", "train"), device="cuda")``.
    """
    names = list(options)
    values = [v if isinstance(v, tuple | list) else (v,) for v in options.values()]
    return tuple(
        WorkloadConfig(**dict(zip(names, combo, strict=True)))
        for combo in itertools.product(*values)
    )


def _gpu(**options: Any) -> tuple[WorkloadConfig, ...]:
    return sweep(device="cuda", **options)


# On a GPU: the course report. Bench configs already in the DB are not run again, so the
# compile and warm-up pieces only add their new configs (eager, warm-up 5 come from the first).
GPU_PLAN: list[Piece] = [
    Piece(
        "bench",
        "bench: course sizes, ctx 256, forward/train, fp32/bf16",
        _gpu(size=COURSE_SIZES, ctx=256, mode=("forward", "train"), dtype=("fp32", "bf16")),
    ),
    Piece(
        "bench",
        "bench: small, eager vs torch.compile",
        _gpu(size="small", ctx=256, mode=("forward", "train"), compile=(False, True)),
    ),
    Piece(
        "bench",
        "bench: small, warm-up 0 1 2 5",
        _gpu(size="small", ctx=256, mode="train", warmup=(0, 1, 2, 5)),
    ),
    Piece("nsys", "nsys: small, ctx 128, train", _gpu(size="small", ctx=128)),
    Piece("torch", "torch.profiler: small, ctx 128", _gpu(size="small", ctx=128, steps=1)),
    Piece(
        "memory",
        "memory: small, ctx 128 256, forward/train",
        _gpu(size="small", ctx=(128, 256), mode=("forward", "train"), warmup=1, steps=1),
    ),
    Piece(
        "attention",
        "attention: naive vs sdpa, d_head 16 64 128 × seq 256 … 8192",
        attention={
            "d_heads": (16, 64, 128),
            "seqs": (256, 1024, 4096, 8192),
            "impls": ("naive", "sdpa"),
            "device": "cuda",
        },
    ),
]


def _cpu(**options: Any) -> tuple[WorkloadConfig, ...]:
    return sweep(device="cpu", size="tiny", **options)


# On a CPU (2 cores: a tiny config takes ~4 s, mostly its process starting): a few minutes.
CPU_PLAN: list[Piece] = [
    Piece(
        "bench",
        "bench: tiny, ctx 128, forward/train, fp32/bf16",
        _cpu(ctx=128, mode=("forward", "train"), dtype=("fp32", "bf16"), warmup=2, steps=5),
    ),
    Piece(
        "bench",
        "bench: tiny, warm-up 0 1 2",
        _cpu(ctx=128, mode="train", warmup=(0, 1, 2), steps=5),
    ),
    Piece("nsys", "nsys: needs CUDA", _gpu(size="small", ctx=128)),
    Piece("torch", "torch.profiler: tiny, ctx 128", _cpu(ctx=128, warmup=2, steps=1)),
    Piece("memory", "memory: needs CUDA", _gpu(size="small", ctx=128, warmup=1, steps=1)),
    Piece(
        "attention",
        "attention: naive, d_head 16 64 × seq 128 512",
        attention={
            "d_heads": (16, 64),
            "seqs": (128, 512),
            "iters": 10,
            "warmup": 2,
            "device": "cpu",
        },
    ),
]

# The smallest plan that touches every piece that can run on a CPU, with pairs for the
# dtype and warm-up comparisons (the tests use it; about 25 s on 2 cores).
MINIMAL_PLAN: list[Piece] = [
    Piece(
        "bench",
        "bench: tiny, ctx 16, train, fp32/bf16, warm-up 0 1",
        _cpu(ctx=16, mode="train", dtype=("fp32", "bf16"), warmup=(0, 1), steps=2),
    ),
    Piece("torch", "torch.profiler: tiny, ctx 16", _cpu(ctx=16, warmup=1, steps=1)),
    Piece("memory", "memory: needs CUDA", _gpu(size="tiny", ctx=16, warmup=1, steps=1)),
    Piece(
        "attention",
        "attention: naive, d_head 16 × seq 32",
        attention={"d_heads": (16,), "seqs": (32,), "iters": 2, "warmup": 1, "device": "cpu"},
    ),
]

PLANS: dict[str, list[Piece]] = {"gpu": GPU_PLAN, "cpu": CPU_PLAN, "minimal": MINIMAL_PLAN}


def choose_plan(name: str, cuda: bool) -> list[Piece]:
    """``auto``: the GPU plan where CUDA is visible, else the CPU plan; or a plan by name."""
    if name == "auto":
        return GPU_PLAN if cuda else CPU_PLAN
    if name not in PLANS:
        raise BadInput(f"unknown --plan {name!r}; choose one of: auto, {', '.join(PLANS)}")
    return PLANS[name]


def total_units(plan: Iterable[Piece]) -> int:
    """Steps of the progress bar: one per config, one per attention piece."""
    return sum(max(len(p.configs), 1) for p in plan)
