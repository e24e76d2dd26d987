"""The built-in model: shapes and parameter counts of every size, attention correctness."""

from __future__ import annotations

import math

import pytest
import torch

from profkit.errors import BadInput
from profkit.workload.config import WorkloadConfig
from profkit.workload.model import SIZES, build_model, naive_attention

# The CS336 handout's sizes: (total params, params without the LM head).
EXPECTED = {
    "small": (128_625_408, 120_945_408),
    "medium": (423_183_360, 412_943_360),
    "large": (969_411_840, 956_611_840),
    "xl": (1_998_235_200, 1_982_235_200),
    "2.7B": (3_406_809_600, 3_381_209_600),
}


@pytest.mark.parametrize("size", list(SIZES))
def test_analytic_counts_match_a_meta_model(size: str) -> None:
    model = build_model(size, 256, device="meta")
    spec = SIZES[size]
    assert sum(p.numel() for p in model.parameters()) == spec.params
    assert spec.params - model.lm_head.weight.numel() == spec.non_embedding_params
    if size in EXPECTED:
        assert (spec.params, spec.non_embedding_params) == EXPECTED[size]


def test_layer_shapes_of_small() -> None:
    model = build_model("small", 128, device="meta")
    assert len(model.layers) == 12
    block = model.layers[0]
    assert tuple(block.attn.q_proj.weight.shape) == (768, 768)
    assert tuple(block.ffn.w1.weight.shape) == (3072, 768)
    assert tuple(block.ffn.w2.weight.shape) == (768, 3072)
    assert tuple(model.lm_head.weight.shape) == (10_000, 768)
    assert tuple(model.token_embeddings.weight.shape) == (10_000, 768)


def test_init_is_truncated_at_three_std() -> None:
    torch.manual_seed(0)
    model = build_model("tiny", 16)
    w = model.layers[0].ffn.w1.weight
    std = math.sqrt(2 / (64 + 256))
    assert w.abs().max() <= 3 * std + 1e-6
    assert abs(w.std().item() - std) / std < 0.15  # a normal cut at 3 std keeps ~99% of its std
    assert model.token_embeddings.weight.abs().max() <= 3.0


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    seq = q.shape[-2]
    scores = scores.masked_fill(torch.ones(seq, seq).triu(1).bool(), float("-inf"))
    return torch.softmax(scores, -1) @ v


def test_naive_attention_matches_float64_reference() -> None:
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 4, 33, 16) for _ in range(3))
    mask = torch.ones(33, 33, dtype=torch.bool).tril()
    out = naive_attention(q, k, v, mask)
    ref = _reference_attention(q, k, v)
    assert (out.double() - ref).norm() / ref.norm() < 1e-6


def test_sdpa_and_naive_models_agree() -> None:
    torch.manual_seed(2)
    naive = build_model("tiny", 32, attention="naive")
    sdpa = build_model("tiny", 32, attention="sdpa")
    sdpa.load_state_dict(naive.state_dict())
    tokens = torch.randint(0, 10_000, (2, 32))
    a, b = naive(tokens), sdpa(tokens)
    assert (a - b).norm() / a.norm() < 1e-5


def test_model_is_causal() -> None:
    torch.manual_seed(3)
    model = build_model("tiny", 16)
    tokens = torch.randint(0, 10_000, (1, 16))
    changed = tokens.clone()
    changed[0, 10] = (changed[0, 10] + 1) % 10_000
    a, b = model(tokens), model(changed)
    assert torch.allclose(a[0, :10], b[0, :10])
    assert not torch.allclose(a[0, 10:], b[0, 10:])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"size": "huge"}, "unknown size 'huge'"),
        ({"ctx": 0}, "--ctx must be between"),
        ({"ctx": 10**9}, "--ctx must be between"),
        ({"steps": 0}, "--steps must be at least 1"),
        ({"warmup": -1}, "--warmup must be 0 or more"),
        ({"mode": "inference"}, "unknown --mode"),
        ({"dtype": "fp8"}, "unknown --dtype"),
        ({"attention": "flash"}, "unknown --attention"),
        ({"device": "tpu"}, "unknown --device"),
    ],
)
def test_config_rejects_bad_values(change: dict, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        WorkloadConfig(**change)


def test_config_round_trips_through_json() -> None:
    config = WorkloadConfig(size="tiny", ctx=32, mode="forward", dtype="bf16", compile=True)
    assert WorkloadConfig.from_json(config.to_json()) == config
    assert config.label() == "tiny-ctx32-forward-bf16-compiled"
