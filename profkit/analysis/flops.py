"""Analytic FLOPs of the naive attention's annotated sub-ranges, beside their measured times.

One call of ``naive_attention`` on a batch of B sequences of T tokens, d_model d and H heads
(d_head = d / H) does, in the forward pass:

- ``computing attention scores``: Q Kᵀ, 2·B·T²·d, plus the 1/√d_head scaling, B·H·T²;
- ``computing softmax``: about 5 per score (max, subtract, exp, sum, divide), 5·B·H·T²;
- ``final matmul``: weights · V, 2·B·T²·d.

So the matmuls do ~2·d_head/5 times the softmax's FLOPs (25.6× at d_head = 64), while the
softmax, being memory-bound, often takes a comparable time: the handout's question.
"""

from __future__ import annotations

from typing import Any

SCORES = "computing attention scores"
SOFTMAX = "computing softmax"
FINAL = "final matmul"
ATTENTION = "scaled dot product attention"
SOFTMAX_FLOPS_PER_SCORE = 5


def attention_flops(config: dict[str, Any]) -> dict[str, float] | None:
    """Forward FLOPs of one call of each attention range, or None if they don't apply.

    ``config`` is a ``WorkloadConfig`` as a dict (the ``profkit nsys`` sidecar's ``config``).
    """
    if config.get("attention", "naive") != "naive" or config.get("compile"):
        return None
    from profkit.specs import SIZES

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
