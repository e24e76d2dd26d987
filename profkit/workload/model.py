"""The built-in workload model: the CS336 ``BasicsTransformerLM`` and its sizes.

Equivalent to ``cs336_basics.model.BasicsTransformerLM`` so that profkit's numbers
compare with the course's reports: token embedding; pre-norm blocks
``x + attn(rmsnorm(x))`` then ``x + swiglu(rmsnorm(x))``; final RMSNorm; untied LM head.
Linear layers carry no bias; RMSNorm (eps 1e-5) computes in fp32 and casts back; RoPE
(theta 10000) rotates Q and K; the mask is causal. Weights use truncated-normal init cut
at 3 std (Linear std sqrt(2/(d_in+d_out)), embedding std 1).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from profkit.workload.annotate import annotate
from profkit.workload.names import ATTENTION, FINAL, SCORES, SOFTMAX
from profkit.workload.specs import COURSE_SIZES, SIZES, ModelSpec, get_spec, sizes

__all__ = [
    "COURSE_SIZES",
    "SIZES",
    "BasicsTransformerLM",
    "ModelSpec",
    "build_model",
    "get_spec",
    "naive_attention",
    "sizes",
]


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        weight = torch.empty(d_out, d_in)
        self.weight = nn.Parameter(nn.init.trunc_normal_(weight, std=std, a=-3 * std, b=3 * std))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.t()


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        weight = torch.empty(vocab_size, d_model)
        self.weight = nn.Parameter(nn.init.trunc_normal_(weight, std=1.0, a=-3.0, b=3.0))

    def forward(self, token_ids: Tensor) -> Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)  # the mean of squares in bf16 loses too much
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(in_dtype)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = Linear(d_model, d_ff)
        self.w2 = Linear(d_ff, d_model)
        self.w3 = Linear(d_model, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class RotaryEmbedding(nn.Module):
    """RoPE on the last dimension of Q and K, pairs (2i, 2i+1) rotated by pos * theta^(-2i/d)."""

    def __init__(self, context_length: int, d_head: int, theta: float = 10_000.0) -> None:
        super().__init__()
        freqs = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), freqs)
        self.cos: Tensor
        self.sin: Tensor
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        cos = self.cos[positions].to(x.dtype)
        sin = self.sin[positions].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return rotated.flatten(-2)


def naive_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d)) V, annotated with the CS336 handout's range names.

    ``mask`` is boolean, True where attention is allowed.
    """
    with annotate(ATTENTION):
        with annotate(SCORES):
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
        with annotate(SOFTMAX):
            weights = torch.softmax(scores, dim=-1)
        with annotate(FINAL):
            return weights @ v


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, context_length: int, impl: str) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.impl = impl
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.output_proj = Linear(d_model, d_model)
        self.rope = RotaryEmbedding(context_length, d_model // num_heads)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, d_model = x.shape
        heads = self.num_heads

        def split(t: Tensor) -> Tensor:  # (b, s, d) -> (b, h, s, d/h)
            return t.view(batch, seq, heads, d_model // heads).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        positions = torch.arange(seq, device=x.device)
        q, k = self.rope(q, positions), self.rope(k, positions)
        if self.impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
            out = naive_attention(q, k, v, causal)
        return self.output_proj(out.transpose(1, 2).reshape(batch, seq, d_model))


class TransformerBlock(nn.Module):
    def __init__(self, spec: ModelSpec, context_length: int, attention: str) -> None:
        super().__init__()
        self.ln1 = RMSNorm(spec.d_model)
        self.attn = CausalSelfAttention(spec.d_model, spec.num_heads, context_length, attention)
        self.ln2 = RMSNorm(spec.d_model)
        self.ffn = SwiGLU(spec.d_model, spec.d_ff)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class BasicsTransformerLM(nn.Module):
    def __init__(self, spec: ModelSpec, context_length: int, attention: str = "naive") -> None:
        super().__init__()
        self.spec = spec
        self.context_length = context_length
        self.token_embeddings = Embedding(spec.vocab_size, spec.d_model)
        self.layers = nn.ModuleList(
            TransformerBlock(spec, context_length, attention) for _ in range(spec.num_layers)
        )
        self.ln_final = RMSNorm(spec.d_model)
        self.lm_head = Linear(spec.d_model, spec.vocab_size)

    def forward(self, token_ids: Tensor) -> Tensor:
        x = self.token_embeddings(token_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def build_model(
    size: str,
    context_length: int,
    attention: str = "naive",
    vocab_size: int = 10_000,
    device: str | torch.device = "cpu",
) -> BasicsTransformerLM:
    """Build the model directly on ``device`` (``meta`` builds it without memory)."""
    with torch.device(device):
        return BasicsTransformerLM(get_spec(size, vocab_size), context_length, attention)
