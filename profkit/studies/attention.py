"""The attention micro-benchmark of the CS336 handout, one cell at a time.

A cell is one attention call shape: batch 8 (no head dimension), ``d_head`` × ``seq``,
with random Q, K, V that require grad. It runs warm-up forward passes, then ``iters``
timed forward passes; warm-up forward+backward passes, then ``iters`` timed backward
passes, the device synchronised after each pass. Right before each timed backward it
reads the memory this cell holds, and sets beside it what the analytic count says
autograd saved (:mod:`profkit.studies.attention_memory`, derived in docs/STUDIES.md).

``naive`` is :func:`profkit.workload.model.naive_attention` — matmul, softmax, matmul, as the
handout's benchmark uses it: no mask unless ``causal``. ``sdpa`` is
``F.scaled_dot_product_attention`` on a singleton head dimension, because its fused
kernels (flash, memory-efficient, cuDNN) only take 4-D inputs and a 3-D call would fall
back to the unfused math path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from profkit.errors import BadInput
from profkit.studies.attention_memory import (
    TORCH_DTYPES,
    Attention,
    analytic_memory,
    available_host_bytes,
    measure_saved_bytes,
    peak_estimate_bytes,
    sdpa_backend,
)
from profkit.workload.config import (
    DEVICES,
    DTYPES,
    MAX_BATCH,
    MAX_STEPS,
    resolve_device,
)
from profkit.workload.model import naive_attention
from profkit.workload.step import synchronize

GIB = 1024**3
IMPLS = ("naive", "sdpa")
ISOLATIONS = ("auto", "process")
DEFAULT_D_HEADS = (16, 32, 64, 128)
DEFAULT_SEQS = (256, 1024, 4096, 8192, 16384)
DEFAULT_ITERS = 100
# On a CPU the handout's grid would run for hours (seq 8192 alone is ~0.3 TFLOP a pass):
# these finish in well under a minute on one core and still show the quadratic growth.
CPU_SEQS = (256, 512, 1024)
CPU_ITERS = 10


@dataclass(frozen=True)
class Cell:
    """One point of the grid."""

    impl: str
    compile: bool
    dtype: str
    d_head: int
    seq: int

    def label(self) -> str:
        mode = "compiled" if self.compile else "eager"
        return f"{self.impl} {mode} {self.dtype} d_head {self.d_head} seq {self.seq:,}"


@dataclass(frozen=True)
class AttentionSettings:
    """The grid and how each cell runs; the one source of the benchmark's defaults."""

    d_heads: tuple[int, ...] = DEFAULT_D_HEADS
    """Head dimensions (the handout's d_model with no head split)."""
    seqs: tuple[int, ...] = DEFAULT_SEQS
    """Sequence lengths."""
    impls: tuple[str, ...] = ("naive",)
    """``naive`` (matmul + softmax + matmul) and/or ``sdpa`` (fused kernels)."""
    compile: tuple[bool, ...] = (False,)
    """Eager (False) and/or ``torch.compile`` (True)."""
    dtypes: tuple[str, ...] = ("fp32",)
    """Dtype of Q, K, V (no autocast: there are no weights to keep in fp32)."""
    batch: int = 8
    """Batch size; the handout fixes it at 8."""
    causal: bool = False
    """Apply a causal mask (the handout's benchmark does not)."""
    iters: int = 100
    """Timed forward passes, and timed backward passes."""
    warmup: int = 5
    """Untimed passes before each timed set (compilation happens here)."""
    device: str = "auto"
    """``auto``, ``cpu``, ``cuda`` or ``mps``."""
    isolate: str = "auto"
    """``auto``: cells share a process, OOM caught and freed; after any other failure the
    rest run in fresh child processes. ``process``: every cell in its own child."""
    threads: int | None = None
    """Intra-op CPU threads; None: the cores free to the process (``profkit.run.threads``)."""
    memory_guard: bool = True
    """On a CPU, skip cells whose count exceeds the memory available: Linux would grant
    the allocation and its OOM killer would then end the whole run, not one cell."""

    def __post_init__(self) -> None:
        # Past 32 bits a size overflows what is stored; below, a cell too large for the
        # device is an OOM row or a skipped cell, as the grid promises.
        _check_positive("--d-head", self.d_heads, MAX_SIZE)
        _check_positive("--seq", self.seqs, MAX_SIZE)
        _check_choices("--impl", self.impls, IMPLS)
        _check_choices("--dtype", self.dtypes, DTYPES)
        _check_choices("--isolate", (self.isolate,), ISOLATIONS)
        _check_choices("--device", (self.device,), DEVICES)
        resolve_device(self.device)  # no CUDA for --device cuda: say so before any work
        if not self.compile:
            raise BadInput("--compile needs at least one of: no, yes")
        if self.batch < 1:
            raise BadInput(f"--batch must be at least 1, got {self.batch}")
        if self.iters < 1:
            raise BadInput(f"--iters must be at least 1, got {self.iters}")
        if self.warmup < 0:
            raise BadInput(f"--warmup must be 0 or more, got {self.warmup}")
        _check_at_most("--batch", self.batch, MAX_BATCH)
        _check_at_most("--iters", self.iters, MAX_STEPS)
        _check_at_most("--warmup", self.warmup, MAX_STEPS)
        if self.threads is not None and self.threads < 1:
            raise BadInput(f"--threads must be at least 1, got {self.threads}")

    @classmethod
    def with_defaults(
        cls,
        device: str = "auto",
        d_heads: tuple[int, ...] = (),
        seqs: tuple[int, ...] = (),
        iters: int | None = None,
        **given: Any,
    ) -> AttentionSettings:
        """Settings with the defaults of the device it will run on for what is not given.

        The handout's grid (seq up to 16,384, 100 passes) on a GPU; on a CPU seq
        256/512/1024 and 10 passes (:data:`CPU_SEQS`, :data:`CPU_ITERS`), which finish.
        """
        on_cpu = resolve_device(device) == "cpu"
        return cls(
            d_heads=d_heads or DEFAULT_D_HEADS,
            seqs=seqs or (CPU_SEQS if on_cpu else DEFAULT_SEQS),
            iters=iters if iters is not None else (CPU_ITERS if on_cpu else DEFAULT_ITERS),
            device=device,
            **given,
        )

    def cells(self) -> list[Cell]:
        """The grid, shape-major so eager and compiled (or naive and sdpa) run side by side."""
        grid = itertools.product(self.d_heads, self.seqs, self.impls, self.compile, self.dtypes)
        return [Cell(impl, comp, dt, d, s) for d, s, impl, comp, dt in grid]

    def replace(self, **changes: Any) -> AttentionSettings:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttentionSettings:
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return cls(**fields)


def _check_positive(option: str, values: tuple[int, ...], most: int) -> None:
    if not values:
        raise BadInput(f"{option} needs at least one value")
    bad = [v for v in values if v < 1]
    if bad:
        raise BadInput(f"{option} values must be positive, got {bad[0]}")
    _check_at_most(option, max(values), most)


MAX_SIZE = 2**31 - 1


def _check_at_most(option: str, value: int, most: int) -> None:
    """Larger values are typos, and past 64 bits the results DB cannot store them."""
    if value > most:
        raise BadInput(f"{option} must be at most {most:,}, got {value:,}")


def _check_choices(option: str, values: tuple[str, ...], choices: tuple[str, ...]) -> None:
    if not values:
        raise BadInput(f"{option} needs at least one value")
    for value in values:
        if value not in choices:
            raise BadInput(f"unknown {option} {value!r}; choose one of: {', '.join(choices)}")


def _attention_fn(cell: Cell, causal: bool, device: torch.device) -> Attention:
    if cell.impl == "sdpa":

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = F.scaled_dot_product_attention(
                q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), is_causal=causal
            )
            return out.squeeze(1)

    else:
        mask = (
            torch.ones(cell.seq, cell.seq, dtype=torch.bool, device=device).tril()
            if causal
            else None
        )

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return naive_attention(q, k, v, mask)

    if not cell.compile:
        return attend
    # A fresh dynamo state per cell: each shape compiles statically for itself, and the
    # per-function recompile limit (8) never silently sends later cells back to eager.
    torch._dynamo.reset()
    return torch.compile(attend, dynamic=False)  # type: ignore[return-value]


def _timed_ms(device: torch.device, run: Callable[[], Any]) -> float:
    started = time.perf_counter()
    run()
    synchronize(device)
    return (time.perf_counter() - started) * 1e3


def _mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


def _run_cell(settings: AttentionSettings, cell: Cell, device: torch.device, row: dict) -> None:
    """Fill ``row`` as the cell proceeds, so a failure keeps what was measured before it."""
    cuda = device.type == "cuda"
    baseline = torch.cuda.memory_allocated(device) if cuda else 0
    row["stage"] = "inputs"
    torch.manual_seed(0)
    shape = (settings.batch, cell.seq, cell.d_head)
    dtype = TORCH_DTYPES[cell.dtype]
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    if cell.impl == "sdpa":
        row["sdpa_backend"] = sdpa_backend(q, settings.causal)
    row.update(
        analytic_memory(
            settings.batch,
            cell.seq,
            cell.d_head,
            cell.dtype,
            cell.impl,
            settings.causal,
            row.get("sdpa_backend"),
        )
    )
    row["stage"] = "build"
    fn = _attention_fn(cell, settings.causal, device)
    if not cell.compile:
        row["stage"] = "forward"  # the first forward also counts what autograd saves
        row["saved_measured_bytes"] = measure_saved_bytes(fn, q, k, v)

    row["stage"] = "forward"
    for _ in range(settings.warmup):
        fn(q, k, v)
    synchronize(device)
    forward = [_timed_ms(device, lambda: fn(q, k, v)) for _ in range(settings.iters)]
    row["forward_ms"], row["forward_ms_std"] = _mean_std(forward)

    row["stage"] = "backward"
    dout = torch.randn_like(q)

    def forward_backward(timed: bool) -> float:
        q.grad = k.grad = v.grad = None  # hold no gradients while measuring memory
        out = fn(q, k, v)
        synchronize(device)
        if cuda:
            row["memory_before_backward_bytes"] = torch.cuda.memory_allocated(device) - baseline
        if not timed:
            out.backward(dout)
            return 0.0
        return _timed_ms(device, lambda: out.backward(dout))

    for _ in range(settings.warmup):
        forward_backward(timed=False)
    backward = [forward_backward(timed=True) for _ in range(settings.iters)]
    row["backward_ms"], row["backward_ms_std"] = _mean_std(backward)
    row["stage"] = None


def is_oom(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or an allocation the CPU allocator (or the OS) refused."""
    text = str(exc)
    return isinstance(exc, torch.OutOfMemoryError) or (
        "out of memory" in text or "can't allocate memory" in text
    )


def new_row(settings: AttentionSettings, cell: Cell, device: torch.device) -> dict[str, Any]:
    """A row with every field present (null until measured): the JSON contract."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return {
        "impl": cell.impl,
        "compile": cell.compile,
        "dtype": cell.dtype,
        "d_head": cell.d_head,
        "seq": cell.seq,
        "batch": settings.batch,
        "causal": settings.causal,
        "iters": settings.iters,
        "warmup": settings.warmup,
        "threads": settings.threads,
        "device": device.type,
        "device_name": name,
        "status": "ok",
        "error": None,
        "stage": None,
        "forward_ms": None,
        "forward_ms_std": None,
        "backward_ms": None,
        "backward_ms_std": None,
        "memory_before_backward_bytes": None,
        "peak_memory_bytes": None,
        "inputs_bytes": None,
        "saved_bytes": None,
        "mask_bytes": None,
        "expected_bytes": None,
        "saved_measured_bytes": None,
        "sdpa_backend": None,
        "wall_s": None,
        "pid": os.getpid(),
    }


def measure_cell(settings: AttentionSettings, cell: Cell, device: torch.device) -> dict[str, Any]:
    """Run one cell; an OOM or any other failure becomes the row's status, never a raise.

    After the cell everything it allocated is released (the exception, which holds the
    frames that hold the tensors, is dropped first), so the next cell starts clean.
    """
    row = new_row(settings, cell, device)
    if device.type == "cpu" and settings.memory_guard and _too_big_for_host(settings, cell, row):
        return row
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
    started = time.perf_counter()
    try:
        _run_cell(settings, cell, device, row)
    except Exception as exc:
        row["status"] = "oom" if is_oom(exc) else "error"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        prefix = "" if row["status"] == "oom" else f"{type(exc).__name__}: "
        row["error"] = f"{row['stage']}: {prefix}{first}"
    row["wall_s"] = time.perf_counter() - started
    # After a CUDA error the context may refuse every call; the row already says why, and
    # the runner moves the remaining cells to a fresh process.
    with contextlib.suppress(Exception):
        if cuda:
            row["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device) - baseline
        release(device)
    return row


def _too_big_for_host(settings: AttentionSettings, cell: Cell, row: dict[str, Any]) -> bool:
    memory = analytic_memory(
        settings.batch, cell.seq, cell.d_head, cell.dtype, cell.impl, settings.causal, None
    )
    need = peak_estimate_bytes(memory, settings.batch, cell.seq, cell.dtype, cell.impl)
    available = available_host_bytes()
    if available is None or need <= available:
        return False
    row.update(memory)
    row.update(
        status="skipped",
        error=f"needs about {need / GIB:,.1f} GiB by the count, {available / GIB:,.1f} GiB "
        "is available (skipped rather than risk the OOM killer ending the whole run)",
    )
    return True


def release(device: torch.device) -> None:
    """Return what a finished (or failed) cell held to the device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def prime_device(device: torch.device, dtypes: tuple[str, ...]) -> None:
    """Allocate what a process keeps for good (cuBLAS workspaces of the main and autograd
    threads) before the first cell's baseline, so no cell's memory counts them."""
    for name in dtypes:
        a = torch.randn(64, 64, device=device, dtype=TORCH_DTYPES[name], requires_grad=True)
        (a @ a).sum().backward()
    synchronize(device)
    release(device)


def warm_up_grid(settings: AttentionSettings, device: torch.device) -> None:
    """Once per process, before the first cell: every impl and dtype of the grid forward and
    backward on a small shape. The first call of a process pays for lazy set-up (the
    autograd engine's threads, kernel dispatch, library handles); without this the first
    cell measured that, up to 100x slower than its neighbours. Per-cell warm-up passes
    (``warmup``) still run for each shape."""
    small = settings.replace(iters=1, warmup=1, memory_guard=False)
    for impl in settings.impls:
        for dtype in settings.dtypes:
            measure_cell(small, Cell(impl, False, dtype, min(settings.d_heads), 16), device)
