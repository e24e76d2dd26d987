"""The analytic FLOP count (checked against torch's own counter), the peak table and MFU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from profkit.workload import flops
from profkit.workload.config import WorkloadConfig
from profkit.workload.model import Linear, build_model


@pytest.mark.parametrize("size", ["tiny", "small", "2.7B"])
def test_matmul_params_are_the_linear_weights(size: str) -> None:
    model = build_model(size, 16, device="meta")
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, Linear))
    assert flops.matmul_params(size) == linear


def test_forward_and_backward_match_torch_flop_counter() -> None:
    torch.manual_seed(0)
    model = build_model("tiny", 48)
    tokens = torch.randint(0, 10_000, (3, 48))
    with FlopCounterMode(display=False) as forward:
        loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    expected = flops.step_flops(WorkloadConfig(size="tiny", ctx=48, batch=3, mode="train"))
    assert forward.get_total_flops() == expected.forward
    assert backward.get_total_flops() == expected.backward


def test_small_at_ctx_256_golden() -> None:
    # 2 * 1024 tokens * 120,926,208 matmul params + 12 layers * 4 * 4 * 256^2 * 768
    assert flops.forward_flops("small", 256, 4) == 257_320_550_400
    forward_only = flops.step_flops(WorkloadConfig(size="small", mode="forward"))
    assert forward_only.step == 257_320_550_400 and forward_only.backward == 0
    assert flops.step_flops(WorkloadConfig(size="small")).step == 3 * 257_320_550_400


@pytest.mark.parametrize(
    ("gpu", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A10G", "A10"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 5090", "RTX 5090"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce GTX 1080", None),
        (None, None),
    ],
)
def test_peak_table_matches_device_names(gpu: str | None, peak: str | None) -> None:
    found = flops.find_peak(gpu)
    assert (found.name if found else None) == peak


def test_mfu_uses_the_matmul_precision_of_the_dtype() -> None:
    h100 = "NVIDIA H100 80GB HBM3"
    assert flops.mfu(98.94, h100, "bf16") == pytest.approx(0.1)
    assert flops.mfu(6.69, h100, "fp32", tf32=False) == pytest.approx(0.1)
    assert flops.mfu(49.47, h100, "fp32", tf32=True) == pytest.approx(0.1)
    assert flops.mfu(10.0, None, "fp32") is None  # CPU
    assert flops.mfu(10.0, "Some Future GPU", "bf16") is None
    assert flops.mfu(None, h100, "bf16") is None
    assert flops.peak_tflops("Tesla T4", "bf16") is None  # no bf16 tensor cores


def test_tf32_follows_torch_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", raising=False)
    assert flops.matmul_precision("fp32") == "fp32"  # PyTorch's default: no TF32
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    assert flops.matmul_precision("fp32") == "tf32"
    assert flops.matmul_precision("bf16") == "bf16"
