"""What a report says about where its phases came from, and the training patterns it saw.

Frameworks put phases where a plain loop does not: Lightning runs forward and backward
inside ``optimizer.step(closure)``, accelerate accumulates gradients over ``no_sync``
micro-steps, DDP and FSDP launch collectives from autograd hooks, activation checkpointing
recomputes the forward inside backward, the Hugging Face Trainer clips gradients between
backward and the step. :func:`phase_story` names those a report's tables show (from the
kernels' names, phases and instances, and the inference's own findings) and says in one
sentence what the phases were found from; both go into the notes and ``source`` of the
JSON (``phases_from``, ``patterns``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from profkit.analysis.phase_marks import spelled_in_domain

# Forward-only kernels: launched in backward only when the forward is recomputed there.
_FORWARD_ONLY = re.compile(
    r"layer_norm_kernel|rms_norm_kernel|cutlassF|flash_fwd|fmha_fwd|softmax_warp_forward|"
    r"SoftMaxForward"
)
_BACKWARD_NAME = re.compile(r"grad|backward|bwd|Backward", re.IGNORECASE)
_CLIPPING = re.compile(r"LpNorm|lpnorm_cleanup|NormTwoOps")
_UNSCALE = re.compile(r"non_finite_check_and_unscale|amp_update_scale")

PATTERNS = {
    "optimizer.step(closure)": "forward and backward ran inside Optimizer.step (Lightning's "
    "optimizer.step(closure)): only what follows the last backward pass in it is optimizer",
    "gradient accumulation": "{backward} backward passes for {optimizer} optimizer steps "
    "(gradient accumulation, e.g. accelerate's no_sync micro-steps): every micro-batch's "
    "forward and backward count in their phases",
    "activation checkpointing": "forward kernels ran in backward ({example}): activation "
    "checkpointing recomputes the forward inside backward, and that time is backward's",
    "DDP/FSDP collectives": "NCCL kernels in {phases} ({kernels} kernels): DDP's gradient "
    "all-reduce and FSDP's reduce-scatter are launched by autograd hooks (backward), FSDP's "
    "all-gathers and DDP's broadcasts by the main thread (forward)",
    "gradient clipping / GradScaler": "gradient clipping or GradScaler unscaling ran between "
    "backward and the optimizer step ({kernels} kernels); counted as optimizer",
    "torch.compile": "torch.compile'd kernels (triton, {kernels} launches): the compiled "
    "forward runs on the main thread, the compiled backward on autograd's thread",
}


@dataclass
class PhaseStory:
    """What the phases came from (one sentence) and the patterns recognized (ids, notes)."""

    phases_from: str
    patterns: list[str]
    notes: list[str]


def phase_story(
    kernels: pd.DataFrame,
    phases: pd.DataFrame,
    phase_ranges: pd.DataFrame,
    source: str,
    domain: str,
    closures: int,
) -> PhaseStory:
    """The story of one report: ``kernels`` per (name, phase) with ``category`` and
    ``instances``, ``phases`` with ``instances``, the phase ranges used, the phase source,
    the plan's domain (``--phase-ranges ...`` where the user's marks were mapped) and how
    many forward/backward passes the inference found inside ``Optimizer.step`` ranges."""
    found: dict[str, dict[str, object]] = {}
    if closures and source != "annotated":
        found["optimizer.step(closure)"] = {}
    counts = _instances(phases)
    if counts.get("backward", 0) > counts.get("optimizer", 0) > 0:
        found["gradient accumulation"] = {
            "backward": counts["backward"],
            "optimizer": counts["optimizer"],
        }
    backward = kernels[kernels["phase"] == "backward"]
    recomputed = backward[
        backward["name"].astype(str).str.contains(_FORWARD_ONLY)
        & ~backward["name"].astype(str).str.contains(_BACKWARD_NAME)
    ]
    if len(recomputed):
        example = str(recomputed["name"].iloc[0])
        found["activation checkpointing"] = {"example": example[:60]}
    nccl = kernels[kernels["category"] == "nccl"]
    if len(nccl):
        where = nccl.groupby("phase", sort=False)["instances"].sum()
        found["DDP/FSDP collectives"] = {
            "phases": ", ".join(str(p) for p in where.index),
            "kernels": int(where.sum()),
        }
    clipping = kernels[
        (kernels["phase"] == "optimizer")
        & kernels["name"].astype(str).str.contains(f"{_CLIPPING.pattern}|{_UNSCALE.pattern}")
    ]
    if len(clipping):
        found["gradient clipping / GradScaler"] = {"kernels": int(clipping["instances"].sum())}
    triton = kernels[kernels["category"] == "triton"]
    if len(triton):
        found["torch.compile"] = {"kernels": int(triton["instances"].sum())}
    notes = [f"Recognized: {PATTERNS[p].format(**found[p])}." for p in found]
    return PhaseStory(_phases_from(phase_ranges, source, domain), list(found), notes)


def _instances(phases: pd.DataFrame) -> dict[str, int]:
    if "instances" not in phases:
        return {}
    return {str(p): int(n) for p, n in zip(phases["phase"], phases["instances"], strict=True)}


def _phases_from(phase_ranges: pd.DataFrame, source: str, domain: str) -> str:
    if domain.startswith("--phase-ranges"):
        found = f"the ranges mapped by {domain}"
    else:
        phase_ranges = spelled_in_domain(phase_ranges)
        domains = sorted({str(d) for d in phase_ranges["domain"].fillna("").astype(str)})
        where = ", ".join(f"NVTX domain {d!r}" if d else "the default domain" for d in domains)
        found = f"the phase ranges in {where}" if domains else ""
    inferred = "inferred (autograd's threads, optimizer kernels and Optimizer.step ranges)"
    if source == "inferred" or not found:
        return f"Phases {inferred}; library ranges (NCCL, CUB, cuDNN, op ranges) are never phases."
    if source == "mixed":
        return f"Phases from {found} where a step has them, else {inferred}."
    return f"Phases from {found}; library ranges (NCCL, CUB, cuDNN, op ranges) are never phases."
