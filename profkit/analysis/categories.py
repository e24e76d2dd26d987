"""Kernel categories by name: what kind of work each GPU activity does.

The rules run in order and the first match wins, on the full (demangled) name, case
insensitively. They were checked on real names from Hopper and Ampere runs (cuBLAS,
cuBLASLt ``nvjet``, CUTLASS, PyTorch's ATen kernels, Triton from ``torch.compile``); see
``tests/test_attribution.py`` for the names they are tested on.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

CATEGORIES = (
    "gemm",
    "attention",
    "softmax",
    "elementwise",
    "reduction",
    "normalization",
    "optimizer",
    "memory",
    "nccl",
    "triton",
    "graph",
    "other",
)

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (category, re.compile(pattern, re.IGNORECASE))
    for category, pattern in (
        # nsys names copies "[CUDA memcpy ...]" and memsets "[CUDA memset]".
        ("memory", r"^\[CUDA mem(cpy|set)"),
        # A CUDA graph traced as one activity (nsys --cuda-graph-trace=graph): its
        # kernels are not visible, so it gets a category of its own.
        ("graph", r"^\[CUDA graph"),
        ("nccl", r"nccl"),
        # torch.compile's generated kernels, whatever they compute (triton_poi/per/red/tem).
        ("triton", r"^triton_|\btriton\b"),
        # Fused attention: FlashAttention, xFormers/mem-efficient (fmha_cutlassF/B),
        # cuDNN SDPA. Before gemm: their names mention cutlass.
        ("attention", r"flash|fmha|attention|sdpa"),
        # Foreach and fused optimizer kernels (AdamW's default is foreach).
        ("optimizer", r"multi_tensor_apply|fused_?adam|adam\w*functor|fused_sgd"),
        # cuBLAS/cuBLASLt/CUTLASS matmuls and their split-K reductions.
        ("gemm", r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitkreduce|\bdot_kernel"),
        # Device-to-device copies and dtype casts (autocast) move data, they compute nothing.
        ("memory", r"copy_kernel|catarraybatchedcopy|memcpy|memset"),
        ("softmax", r"softmax"),
        (
            "normalization",
            r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|rowwisemoments|"
            r"computegradinput|gammabeta",
        ),
        ("reduction", r"reduce|reduction|devicescan|argmax|argmin"),
        (
            "elementwise",
            r"elementwise|pointwise|vectorized|functor|fill|triu|tril|masked_fill|where|arange",
        ),
    )
)


@functools.lru_cache(maxsize=1 << 14)
def categorize(name: str) -> str:
    """The category of one kernel name (``other`` when no rule matches). Remembered: a
    report asks for each name's category a few times, and a Dask worker's files (the ranks
    of one job) share most of their names."""
    for category, pattern in _RULES:
        if pattern.search(name):
            return category
    return "other"


def category_of(name: str, kind: str) -> str:
    """The category of an activity of this name and kind (``KINDS``): copies and memsets
    are ``memory``, whole CUDA graphs ``graph``, kernels by their name."""
    if kind in ("memcpy", "memset"):
        return "memory"
    if kind == "graph":
        return "graph"
    return categorize(name)


def categorize_all(names: Iterable[str]) -> list[str]:
    """Categories of many names; callers pass the distinct names only."""
    return [categorize(name) for name in names]
