"""Analytic FLOPs of a workload step, per-device peak throughput, and MFU.

The FLOP count is the usual "model FLOPs" of a dense Transformer (Kaplan et al. 2020;
PaLM appendix B), written out for this model in ``docs/FLOPS.md``:

* forward: ``2 · tokens · matmul_params`` (every Linear, the LM head included; the
  embedding is a lookup, not a matmul) plus, per layer, the attention matmuls
  ``QKᵀ`` and ``weights · V``: ``2 · 2 · batch · ctx² · d_model``. The naive attention
  computes the full ``ctx × ctx`` square (the causal mask is applied after the matmul),
  so the square is counted, not the triangle.
* backward: twice the forward (a gradient for the input and one for the weight of each
  matmul).
* optimizer: AdamW costs about a dozen element-wise FLOPs per parameter, under 0.3% of a
  step at batch 4 × ctx 256 and shrinking with more tokens; it is not counted.

Peak throughput comes from NVIDIA's datasheets and architecture whitepapers (dense
numbers, never the 2:4-sparsity ones); sources per row in ``docs/FLOPS.md``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from profkit.workload.config import WorkloadConfig
from profkit.workload.names import ATTENTION, FINAL, SCORES, SOFTMAX
from profkit.workload.specs import SIZES, get_spec


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one step of a config, split by phase (optimizer: not counted, see module doc)."""

    forward: int
    backward: int

    @property
    def step(self) -> int:
        return self.forward + self.backward


def matmul_params(size: str, vocab_size: int = 10_000) -> int:
    """Weights that take part in matmuls: q, k, v, o and w1, w2, w3 per layer, and the LM head."""
    spec = get_spec(size, vocab_size)
    d, f = spec.d_model, spec.d_ff
    return spec.num_layers * (4 * d * d + 3 * d * f) + d * spec.vocab_size


def forward_flops(size: str, ctx: int, batch: int, vocab_size: int = 10_000) -> int:
    """FLOPs of one forward pass: the matmuls of every Linear plus the attention square."""
    spec = get_spec(size, vocab_size)
    tokens = batch * ctx
    attention = spec.num_layers * 4 * batch * ctx * ctx * spec.d_model
    return 2 * tokens * matmul_params(size, vocab_size) + attention


def step_flops(config: WorkloadConfig) -> StepFlops:
    """FLOPs of one step of ``config`` in its mode (forward only, or forward + 2× backward)."""
    forward = forward_flops(config.size, config.ctx, config.batch, config.vocab_size)
    return StepFlops(forward=forward, backward=2 * forward if config.has_backward else 0)


@dataclass(frozen=True)
class DevicePeak:
    """Dense peak TFLOP/s of one GPU model (``None`` where it has no such tensor path)."""

    name: str
    pattern: str
    """Regex searched (case-insensitive) in ``torch.cuda.get_device_name()``."""
    fp32: float
    """FP32 on the CUDA cores (no tensor cores): PyTorch's default for fp32 matmuls."""
    tf32: float | None
    bf16: float | None
    """BF16 tensor cores with FP32 accumulation (what PyTorch's matmuls use)."""
    fp16: float | None
    """FP16 tensor cores with FP32 accumulation."""

    def tflops(self, precision: str) -> float | None:
        return {"fp32": self.fp32, "tf32": self.tf32, "bf16": self.bf16, "fp16": self.fp16}[
            precision
        ]


# Most specific patterns first: "H100 NVL" and "H100 PCIe" before the SXM part, "L40S"
# before "L40", "A100" before "A10". GeForce cards run FP16/BF16 with FP32 accumulation at
# half their FP16-accumulate rate; the table holds the FP32-accumulate number.
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("H100 NVL", r"H100 NVL", 60.0, 417.5, 835.5, 835.5),
    DevicePeak("H100 PCIe", r"H100 PCIe", 51.0, 378.0, 756.0, 756.0),
    DevicePeak("H100 SXM", r"H100", 66.9, 494.7, 989.4, 989.4),
    DevicePeak("GH200", r"GH200", 66.9, 494.7, 989.4, 989.4),
    DevicePeak("H200 NVL", r"H200 NVL", 60.0, 417.5, 835.5, 835.5),
    DevicePeak("H200 SXM", r"H200", 66.9, 494.7, 989.4, 989.4),
    DevicePeak("B200", r"\bB200", 75.0, 1125.0, 2250.0, 2250.0),
    DevicePeak("A100", r"A100", 19.5, 156.0, 312.0, 312.0),
    DevicePeak("A40", r"\bA40\b", 37.4, 74.8, 149.7, 149.7),
    DevicePeak("A10", r"\bA10G?\b", 31.2, 62.5, 125.0, 125.0),
    DevicePeak("L40S", r"L40S", 91.6, 183.0, 362.1, 362.1),
    DevicePeak("L4", r"\bL4\b", 30.3, 60.0, 121.0, 121.0),
    DevicePeak("RTX 6000 Ada", r"RTX 6000 Ada", 91.1, 182.1, 364.2, 364.2),
    DevicePeak("RTX 5090", r"RTX 5090", 104.8, 104.8, 209.5, 209.5),
    DevicePeak("RTX 4090", r"RTX 4090", 82.6, 82.6, 165.2, 165.2),
    DevicePeak("RTX 3090", r"RTX 3090", 35.6, 35.6, 71.0, 71.0),
    DevicePeak("V100", r"V100", 15.7, None, None, 125.0),
    DevicePeak("T4", r"\bT4\b", 8.1, None, None, 65.0),
)


def find_peak(gpu_name: str | None) -> DevicePeak | None:
    """The peak-table row for a ``torch.cuda.get_device_name()``, or None if it is unknown."""
    if not gpu_name:
        return None
    for peak in PEAKS:
        if re.search(peak.pattern, gpu_name, re.IGNORECASE):
            return peak
    return None


def tf32_enabled() -> bool:
    """Whether fp32 matmuls run on TF32 tensor cores in a fresh process with this environment.

    PyTorch's default is no (full-precision fp32 on the CUDA cores), so fp32 MFU is measured
    against the fp32 peak unless ``torch.backends.cuda.matmul.allow_tf32`` (or
    ``set_float32_matmul_precision("high")``, or ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``) is set.
    """
    import torch

    if os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1":
        return True
    return bool(torch.backends.cuda.matmul.allow_tf32)


def matmul_precision(dtype: str, tf32: bool | None = None) -> str:
    """Which peak a workload dtype is measured against: ``fp32``, ``tf32``, ``bf16`` or ``fp16``."""
    if dtype != "fp32":
        return dtype  # autocast runs the matmuls in bf16/fp16
    return "tf32" if (tf32_enabled() if tf32 is None else tf32) else "fp32"


def peak_tflops(gpu_name: str | None, dtype: str, tf32: bool | None = None) -> float | None:
    """Dense peak TFLOP/s of this GPU for the matmul precision of ``dtype`` (None if unknown)."""
    peak = find_peak(gpu_name)
    return peak.tflops(matmul_precision(dtype, tf32)) if peak else None


def mfu(
    achieved_tflops: float | None, gpu_name: str | None, dtype: str, tf32: bool | None = None
) -> float | None:
    """Model FLOPs utilisation as a fraction of the peak; None on CPU/MPS or an unknown GPU."""
    peak = peak_tflops(gpu_name, dtype, tf32)
    if achieved_tflops is None or not peak:
        return None
    return achieved_tflops / peak


# The naive attention's sub-ranges.
#
# Analytic FLOPs of the naive attention's annotated sub-ranges, beside their measured times.
#
# One call of ``naive_attention`` on a batch of B sequences of T tokens, d_model d and H heads
# (d_head = d / H) does, in the forward pass:
#
# - ``computing attention scores``: Q Kᵀ, 2·B·T²·d, plus the 1/√d_head scaling, B·H·T²;
# - ``computing softmax``: about 5 per score (max, subtract, exp, sum, divide), 5·B·H·T²;
# - ``final matmul``: weights · V, 2·B·T²·d.
#
# So the matmuls do ~2·d_head/5 times the softmax's FLOPs (25.6× at d_head = 64), while the
# softmax, being memory-bound, often takes a comparable time: the handout's question.

SOFTMAX_FLOPS_PER_SCORE = 5


def attention_flops(config: dict[str, Any]) -> dict[str, float] | None:
    """Forward FLOPs of one call of each attention range, or None if they don't apply.

    ``config`` is a ``WorkloadConfig`` as a dict (the ``profkit nsys`` sidecar's ``config``).
    """
    if config.get("attention", "naive") != "naive" or config.get("compile"):
        return None
    spec = SIZES.get(str(config.get("size")))
    if spec is None:
        return None
    batch, ctx = int(config.get("batch", 4)), int(config.get("ctx", 256))
    scores_per_head = batch * ctx * ctx
    matmul = 2.0 * scores_per_head * spec.d_model
    heads = spec.num_heads
    flops = {
        SCORES: matmul + scores_per_head * heads,
        SOFTMAX: float(SOFTMAX_FLOPS_PER_SCORE * scores_per_head * heads),
        FINAL: matmul,
    }
    flops[ATTENTION] = sum(flops.values())
    return flops
