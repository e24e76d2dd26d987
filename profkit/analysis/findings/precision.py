"""``fp32_gemm``: matrix multiplies in full fp32 on the CUDA cores of a GPU that has bf16
tensor cores.

The kernel names say the precision: cuBLAS's ``sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma``
and CUTLASS's ``simt_sgemm`` run FFMA on the CUDA cores, where bf16 (``nvjet_*``,
``*_bf16*``) and TF32 (``*tf32*``) GEMMs run on the tensor cores. PyTorch runs fp32
matmuls that way by default (``torch.backends.cuda.matmul.allow_tf32`` is False).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from profkit.analysis.findings.model import Finding, kernel_evidence
from profkit.workload.flops import find_peak

if TYPE_CHECKING:
    from profkit.analysis.report_types import KernelReport

FP32_GEMM = re.compile(r"sgemm|_ffma_|gemm_f32f32_f32f32_f32", re.IGNORECASE)
"""GEMM kernels in full fp32 on the CUDA cores (FFMA); TF32 kernels (``f32f32_tf32f32``)
run on the tensor cores and do not match."""
MIN_SHARE = 0.01
"""No finding below this share of the GPU time."""


def fp32_gemm(report: KernelReport, gpu: str | None, notes: list[str]) -> list[Finding]:
    """fp32 GEMMs on a GPU with bf16 tensor cores (``gpu``: its name, as the trace gives it).

    recoverable_ms: their time × (1 − fp32 peak / bf16 peak) of that GPU
    (:data:`profkit.workload.flops.PEAKS`): the same GEMMs at the tensor cores' rate, with
    the same efficiency — at best, since small GEMMs reach neither peak."""
    table = report.overall
    if not len(table) or "name" not in table:
        return []
    names = table["name"].astype(str)
    chosen = names.str.contains(FP32_GEMM) & (table["category"] == "gemm")
    rows = table[chosen]
    if not len(rows):
        return []
    peak = find_peak(gpu)
    if peak is None or not peak.bf16:
        notes.append(
            "finding fp32_gemm needs a GPU with bf16 tensor cores that profkit knows "
            f"(docs/FLOPS.md); this trace names {gpu or 'none'}"
        )
        return []
    time_ms = float(rows["total_ms"].sum())
    total_ms = float(report.totals.get("gpu_time_ms") or 0.0)
    recoverable = time_ms * (1.0 - peak.fp32 / peak.bf16)
    if not total_ms or recoverable / total_ms < MIN_SHARE:
        return []
    by_phase = report.kernels[report.kernels["name"].astype(str).isin(set(rows["name"]))]
    phase = str(by_phase.groupby("phase")["total_ms"].sum().idxmax()) if len(by_phase) else None
    evidence = kernel_evidence(rows, time_ms, total_ms)
    evidence |= {"gpu": gpu, "peak_tflops": {"fp32": peak.fp32, "bf16": peak.bf16}}
    evidence["rows"] = evidence.pop("rows")  # last, as in every finding
    return [Finding(
        "fp32_gemm", recoverable, recoverable / total_ms, evidence,
        f"{len(rows)} GEMM kernels ({time_ms:.2f} ms) run in fp32 on the CUDA cores of a "
        f"{peak.name}, whose bf16 tensor cores are {peak.bf16 / peak.fp32:.0f}× faster: train "
        "in bf16 (torch.autocast('cuda', dtype=torch.bfloat16)), or at least allow TF32 "
        "(torch.set_float32_matmul_precision('high')).",
        None, phase,
    )]  # fmt: skip
