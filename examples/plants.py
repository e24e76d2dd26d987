"""Planted problems: a small training loop whose flags each plant one known problem.

profkit's findings are checked against these: each run knows what it planted and prints it
as one JSON line (``PLANTED {...}``, rank 0), so a test can compare a finding's size with
the plant's (N ms x steps of sleep, the exact number of host syncs). The loop is the house
style of ``examples/user_train.py``: a small causal Transformer on random tokens, AdamW,
and ``profkit.phase`` ranges ``forward``, ``backward`` and ``optimizer`` (NVTX for Nsight
Systems, ``record_function`` for torch.profiler). The plants:

- no flag: the clean baseline (no host sync inside the steps, fused AdamW);
- ``--sleep-ms N``: ``time.sleep(N ms)`` before each forward, outside every phase (the host
  idles, so does the GPU);
- ``--sync``: per step, one ``loss.item()`` inside the forward phase (a NaN check) and one
  ``loss.detach().cpu()`` after the optimizer phase (loss logging): 2 syncs a step;
- ``--tiny``: a 1-layer, d_model 32 model at batch 1, ctx 16: launch-bound;
- ``--foreach``: AdamW's foreach implementation instead of the default ``fused=True``;
- ``--sleep-rank R --sleep-ms N`` under torchrun: only rank R sleeps (a straggler; the
  others wait for it in DDP's all-reduce during backward).

Every run has ``--warmup`` unprofiled steps, then ``--steps`` profiled ones. With
``--capture-range``, ``torch.cuda.synchronize()`` then cudaProfilerStart before them, and
``torch.cuda.synchronize()`` then cudaProfilerStop after them (so one device synchronize
lies inside the capture, at its end, in every run, the baseline's too)::

    nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \\
        --capture-range-end=stop -o sleep python examples/plants.py --sleep-ms 5 --capture-range
    profkit nsys --capture-range cudaProfilerApi -- python examples/plants.py --sync --capture-range
    python examples/plants.py --tiny --torch-profiler --trace-dir traces   # traces/plants-rank0.json.gz
    torchrun --nproc-per-node 2 examples/plants.py --sleep-rank 1 --sleep-ms 20 --capture-range

``--device cpu`` runs it without a GPU (DDP over gloo under torchrun).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

try:
    import profkit
except ImportError:  # run from a checkout without profkit installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import profkit


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, ctx, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, ctx, 3, self.heads, -1).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, ctx, width))
        return x + self.mlp(self.norm2(x))


class SmallLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, heads) for _ in range(layers)))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=3, help="unprofiled steps before them")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="sleep before each forward")
    parser.add_argument("--sleep-rank", type=int, default=None, help="only this rank sleeps")
    parser.add_argument("--sync", action="store_true", help=".item() and .cpu() every step")
    parser.add_argument("--tiny", action="store_true", help="tiny model at batch 1")
    parser.add_argument("--foreach", action="store_true", help="foreach AdamW, not fused")
    parser.add_argument("--capture-range", action="store_true", help="cudaProfilerStart/Stop")
    parser.add_argument("--torch-profiler", action="store_true", help="record the steps")
    parser.add_argument("--trace-dir", type=Path, default=Path("traces"))
    parser.add_argument("--name", default="plants", help="trace file name stem")
    args = parser.parse_args()
    if args.sleep_rank is not None and args.sleep_ms <= 0:
        parser.error("--sleep-rank needs --sleep-ms")
    if args.sleep_rank is not None and not 0 <= args.sleep_rank < world_size():
        parser.error(f"--sleep-rank {args.sleep_rank}: there are {world_size()} ranks")
    return args


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def main() -> None:
    args = parse()
    world, rank = world_size(), int(os.environ.get("RANK", "0"))
    cuda = args.device == "cuda"
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if cuda
        else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)

    torch.manual_seed(0)  # the same weights on every rank
    # 8 x 128 tokens: at most 3072, so CUDA's embedding backward takes its path without a
    # host sync, and the baseline has none inside its steps.
    d_model, layers, heads, batch, ctx, vocab = 256, 2, 4, 8, 128, 1000
    if args.tiny:
        d_model, layers, heads, batch, ctx = 32, 1, 2, 1, 16
    model: nn.Module = SmallLM(vocab, d_model, layers, heads).to(device)
    params = list(model.parameters())
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if cuda else None)
    optimizer = torch.optim.AdamW(
        params, lr=1e-4, **({"foreach": True} if args.foreach else {"fused": True})
    )
    generator = torch.Generator().manual_seed(rank)  # each rank its own batch
    tokens = torch.randint(0, vocab, (batch, ctx + 1), generator=generator).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    sleeps = args.sleep_ms > 0 and args.sleep_rank in (None, rank)
    logged: list[torch.Tensor] = []

    def step() -> None:
        if sleeps:
            time.sleep(args.sleep_ms / 1e3)
        with profkit.phase("forward"):
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            if args.sync and not math.isfinite(loss.item()):  # sync 1: a NaN check
                raise FloatingPointError("loss is not finite")
        with profkit.phase("backward"):
            loss.backward()
        with profkit.phase("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if args.sync:
            logged.append(loss.detach().cpu())  # sync 2: loss logging

    for _ in range(args.warmup - 1):
        step()
    syncs_seen = None
    if args.warmup > 0:  # the last warm-up step, watched by torch's sync debug mode on CUDA
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            step()
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
                syncs_seen = sum("synchroniz" in str(w.message) for w in caught)

    profiler = None
    if args.torch_profiler:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(activities=activities)
    if cuda:
        torch.cuda.synchronize()
    if args.capture_range and cuda:
        torch.cuda.cudart().cudaProfilerStart()
    if profiler is not None:
        profiler.start()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    elapsed_ms = (time.perf_counter() - started) * 1e3
    if args.capture_range and cuda:
        torch.cuda.cudart().cudaProfilerStop()
    if profiler is not None:
        profiler.stop()
        args.trace_dir.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(args.trace_dir / f"{args.name}-rank{rank}.json.gz"))

    plants = [
        name
        for name, on in [
            ("sleep", args.sleep_ms > 0 and args.sleep_rank is None),
            ("straggler", args.sleep_rank is not None),
            ("sync", args.sync),
            ("tiny", args.tiny),
            ("foreach", args.foreach),
        ]
        if on
    ]
    sleep_ranks = (
        []
        if args.sleep_ms <= 0
        else [args.sleep_rank]
        if args.sleep_rank is not None
        else list(range(world))
    )
    per_step_syncs = 1 if args.sync else 0
    planted = {
        "program": "plants",
        "plants": plants,
        "device": args.device,
        "world_size": world,
        "steps": args.steps,
        "warmup": args.warmup,
        "window": "capture-range"
        if args.capture_range
        else "torch-profiler"
        if args.torch_profiler
        else None,
        "model": {
            "d_model": d_model,
            "layers": layers,
            "heads": heads,
            "vocab": vocab,
            "parameters": sum(p.numel() for p in params),
        },
        "batch": batch,
        "ctx": ctx,
        "optimizer": "foreach" if args.foreach else "fused",
        "optimizer_param_tensors": len(params),
        "sleep_ms": args.sleep_ms,
        "sleep_ranks": sleep_ranks,
        "sleeps_per_rank": args.steps if sleep_ranks else 0,
        "sleep_total_ms_per_rank": args.sleep_ms * args.steps if sleep_ranks else 0.0,
        "syncs": {
            "item_in_forward": per_step_syncs * args.steps,
            "cpu_after_optimizer": per_step_syncs * args.steps,
            "total": 2 * per_step_syncs * args.steps,
        },
        "syncs_seen_in_last_warmup_step": syncs_seen,
        "capture_end_device_synchronize": bool(args.capture_range and cuda),
        "ms_per_step": round(elapsed_ms / max(args.steps, 1), 3),
    }
    if rank == 0:
        print("PLANTED " + json.dumps(planted), flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
