"""What an attention cell should hold before its backward, and what autograd really saved.

:func:`analytic_memory` is the count derived in docs/STUDIES.md; :func:`measure_saved_bytes`
checks it on any device by watching autograd save tensors; :func:`sdpa_backend` names the
kernel (and so the count) that ``scaled_dot_product_attention`` uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# The memory-efficient kernel pads its logsumexp rows to this many entries.
EFFICIENT_LSE_ALIGN = 32
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def analytic_memory(
    batch: int, seq: int, d_head: int, dtype: str, impl: str, causal: bool, backend: str | None
) -> dict[str, int]:
    """Bytes a cell should hold right before its backward, by what autograd keeps alive.

    ``inputs_bytes``: Q, K, V, the output and the gradient fed to backward (5·B·S·D·e).
    ``saved_bytes``: what the backward saves beyond those — naive: the softmax output
    P (B·S·S·e; the pre-softmax scores are freed because dividing by a Python scalar saves
    nothing), plus the inverted causal mask (S·S bool); sdpa fused kernels: the logsumexp
    (B·S fp32; padded to 32 rows by the memory-efficient kernel); the sdpa math fallback:
    P and the scaled Q and K, upcast to fp32 (and V too when the inputs are not fp32).
    ``mask_bytes``: the causal mask the naive cell builds once (S·S bool).
    ``expected_bytes`` is their sum; allocator rounding (512 B per block) is not included.
    """
    e = TORCH_DTYPES[dtype].itemsize
    b, s, d = batch, seq, d_head
    inputs = 5 * b * s * d * e
    mask = s * s if causal and impl == "naive" else 0
    if impl == "naive":
        saved = b * s * s * e + (s * s if causal else 0)
    elif backend == "math":
        saved = 4 * (b * s * s + 2 * b * s * d + (b * s * d if dtype != "fp32" else 0))
    elif backend == "efficient_attention":
        saved = 4 * b * math.ceil(s / EFFICIENT_LSE_ALIGN) * EFFICIENT_LSE_ALIGN
    else:  # flash (CUDA or CPU) and cuDNN keep one fp32 logsumexp per query row
        saved = 4 * b * s
    return {
        "inputs_bytes": inputs,
        "saved_bytes": saved,
        "mask_bytes": mask,
        "expected_bytes": inputs + saved + mask,
    }


def sdpa_backend(q: torch.Tensor, causal: bool) -> str | None:
    """The fused kernel ``scaled_dot_product_attention`` picks for these inputs (or math)."""
    try:
        from torch.nn.attention import SDPBackend

        q4 = q.unsqueeze(1)
        choice = torch._fused_sdp_choice(q4, q4, q4, None, 0.0, causal)
        return SDPBackend(choice).name.lower()
    except Exception:  # a private API; without it the column stays empty
        return None


def measure_saved_bytes(fn: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves in one forward, beyond Q, K, V and the output.

    Counted with ``saved_tensors_hooks`` on distinct storages, so it works on any device
    (a CPU check of :func:`analytic_memory`); eager only, compiled graphs save their own.
    """
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        # Detached: softmax saves its own output, and packing that tensor itself would tie
        # it to its grad_fn in a cycle through C++ that Python's GC cannot free (one B·S·S
        # buffer leaked for the rest of the process, seen on an H100 as 2x the count).
        return tensor.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn(q, k, v)
    alive = {t.untyped_storage().data_ptr() for t in (q, k, v, out)}
    return sum(n for ptr, n in storages.items() if ptr not in alive)


def peak_estimate_bytes(memory: dict[str, int], batch: int, seq: int, dtype: str, impl: str) -> int:
    """A generous bound on a cell's peak: what it keeps plus the transients around it.

    The naive forward holds two B·S·S buffers at once and its backward about three more
    than P (dP, dS, temporaries); the fused kernels' transients are the gradients of Q, K, V.
    """
    e = TORCH_DTYPES[dtype].itemsize
    square = batch * seq * seq * e
    transients = 3 * square if impl == "naive" or memory["saved_bytes"] >= square else 0
    return memory["expected_bytes"] + transients + 3 * memory["inputs_bytes"] // 5


def available_host_bytes() -> int | None:
    """Memory the OS can hand out now (Linux ``MemAvailable``), else None (no guard)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
