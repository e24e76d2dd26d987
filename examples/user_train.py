"""A small training loop of your own, annotated for profkit.

Not the built-in model: a two-layer PyTorch Transformer encoder (fused attention) on random
tokens. ``profkit.phase`` marks each phase of a step with an NVTX range (Nsight Systems) and
a ``record_function`` range (torch.profiler), so this loop gets the same per-phase tables::

    profkit nsys -- python examples/user_train.py --steps 5
    profkit nsys --capture-range cudaProfilerApi -- python examples/user_train.py --profile-steps-only

It runs anywhere: on CUDA when there is a GPU, otherwise on the CPU (no kernels to trace
then, but the loop itself runs).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import profkit


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        block = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=4 * d_model, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], tokens.device)
        return self.head(self.blocks(self.embed(tokens), mask=mask, is_causal=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps after warm-up")
    parser.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--profile-steps-only",
        action="store_true",
        help="call cudaProfilerStart/Stop around the timed steps (for nsys "
        "--capture-range=cudaProfilerApi)",
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    vocab = 1_000
    model = TinyLM(vocab, args.d_model, layers=2, heads=4).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, vocab, (args.batch, args.ctx + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    @profkit.phase("optimizer")  # the decorator form: every call is one range
    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def step() -> float:
        with profkit.phase("forward"):
            logits = model(inputs)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        with profkit.phase("backward"):
            loss.backward()
        optimizer_step()
        return float(loss.detach())

    for _ in range(args.warmup):
        step()
    if args.profile_steps_only and device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    started = time.perf_counter()
    for index in range(args.steps):
        loss = step()
        print(f"step {index}: loss {loss:.4f}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed_ms = (time.perf_counter() - started) * 1e3
    if args.profile_steps_only and device.type == "cuda":
        torch.cuda.profiler.stop()
    print(f"{args.steps} steps on {device.type}: {elapsed_ms / max(args.steps, 1):.1f} ms/step")


if __name__ == "__main__":
    main()
