"""``unfused_optimizer``: foreach (or per-parameter) optimizer kernels where a fused one exists."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from profkit.analysis.findings.model import Finding, kernel_evidence

if TYPE_CHECKING:
    from profkit.analysis.report_types import KernelReport

FOREACH = re.compile(r"multi_tensor_apply_kernel", re.IGNORECASE)
FUSED = re.compile(r"fused_?adam|FusedAdam|FusedSgd|fused_sgd", re.IGNORECASE)
DEPTH = re.compile(r"TensorList(?:ScalarList)?Metadata<(?:float, )?(?:\(int\))?(\d+)>")
MIN_FOREACH_KERNELS = 3
"""A foreach AdamW/Adam/SGD step launches several distinct foreach kernels (lerp, mul,
sqrt, div, ...); one or two (a step counter's ``+1``) are not an unfused optimizer."""
FUSED_ADAMW_PASSES = 7
"""Fused AdamW reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg,
exp_avg_sq once per element: 7 passes over parameter-sized tensors."""
MIN_SHARE = 0.01
"""No finding below this share of the GPU time."""


def unfused_optimizer(report: KernelReport) -> list[Finding]:
    """Foreach optimizer kernels without a fused one beside them (whole trace, rank null).

    recoverable_ms: their time × (1 − 7 / passes), passes being the per-element tensor
    reads and writes of one step's foreach kernels (each distinct kernel reads its
    ``TensorListMetadata<N>`` lists and writes one), memory-bound kernels taking time in
    proportion to bytes moved."""
    table = report.overall
    if not len(table) or "name" not in table:
        return []
    names = table["name"].astype(str)
    if names.str.contains(FUSED).any():
        return []
    rows = table[names.str.contains(FOREACH)]
    if len(rows) < MIN_FOREACH_KERNELS:
        return []
    passes = 0
    for name in rows["name"].astype(str):
        depth = DEPTH.search(name)
        passes += (int(depth.group(1)) if depth else 1) + 1
    time_ms = float(rows["total_ms"].sum())
    total_ms = float(report.totals.get("gpu_time_ms") or 0.0)
    recoverable = time_ms * max(0.0, 1.0 - FUSED_ADAMW_PASSES / passes)
    if not total_ms or recoverable / total_ms < MIN_SHARE:
        return []
    evidence = kernel_evidence(rows, time_ms, total_ms)
    evidence |= {"passes_per_element": passes, "fused_passes": FUSED_ADAMW_PASSES}
    evidence["rows"] = evidence.pop("rows")  # last, as in every finding
    return [Finding(
        "unfused_optimizer", recoverable, recoverable / total_ms, evidence,
        f"{len(rows)} foreach optimizer kernels take {time_ms:.2f} ms: use the fused "
        "optimizer (torch.optim.AdamW(..., fused=True)), one pass over each parameter.",
        None, "optimizer",
    )]  # fmt: skip
