"""Capture a plain, unannotated training loop under torch.profiler and under Nsight Systems.

The fixture phase inference is checked on: a training loop as people write it, with no
``profkit.phase`` and no NVTX range anywhere — a two-layer Transformer encoder LM (PyTorch's
own modules, fused attention), AdamW (foreach, the CUDA default), gradient clipping, and the
next batch copied to the GPU each step. profkit is not imported by the loop itself.

On the GPU machine, from the repository root (nsys on PATH or in ``$PROFKIT_NSYS``)::

    python benchmarks/capture_unannotated.py --out $OUT

writes into ``--out``:

- ``torch-unannotated-train.json.gz``: torch.profiler, ``schedule(wait=1, warmup=1,
  active=2)`` after 2 warm-up steps, so two ``ProfilerStep#N`` with ``Optimizer.step``;
- ``nsys-unannotated-train.sqlite.xz``: ``nsys profile -t cuda,nvtx
  --capture-range=cudaProfilerApi`` around 3 steps after 2 warm-up steps (no NVTX at all),
  exported to SQLite and xz-compressed, as the other fixtures in tests/data;
- ``summary.json``: ``profkit kernels --format json`` of both (``phase_source`` must be
  ``inferred``), to turn into the fixture test's asserted numbers.

``--loop torch|nsys`` runs one loop alone (the nsys capture re-runs this script that way).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 2
NSYS_STEPS = 3
TORCH_SCHEDULE = {"wait": 1, "warmup": 1, "active": 2}


class TinyLM(nn.Module):
    """Embedding, a pre-norm Transformer encoder with a causal mask, an LM head."""

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


def make_loop(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The model, optimizer, pinned host batches, and one plain training step."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    vocab = 4096
    model = TinyLM(vocab, args.d_model, layers=2, heads=8).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = torch.randint(0, vocab, (4, args.batch, args.ctx + 1))
    if device.type == "cuda":
        batches = batches.pin_memory()

    def step(index: int) -> float:
        tokens = batches[index % len(batches)].to(device, non_blocking=True)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def loop_torch(args: argparse.Namespace, out: Path) -> Path:
    """``WARMUP`` steps, then the profiler's schedule; the trace is gzip-compressed."""
    from torch.profiler import ProfilerActivity, profile, schedule

    step = make_loop(args)
    for index in range(WARMUP):
        step(index)
    activities = [ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    target = out / "torch-unannotated-train.json"
    with profile(activities=activities, schedule=schedule(**TORCH_SCHEDULE)) as prof:
        for index in range(sum(TORCH_SCHEDULE.values())):
            step(index)
            prof.step()
    prof.export_chrome_trace(str(target))
    gz = target.with_suffix(".json.gz")
    subprocess.run(["gzip", "-9", "-f", str(target)], check=True)
    return gz


def loop_nsys(args: argparse.Namespace) -> None:
    """``WARMUP`` steps, then ``NSYS_STEPS`` between cudaProfilerStart and Stop."""
    step = make_loop(args)
    for index in range(WARMUP):
        step(index)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for index in range(NSYS_STEPS):
        step(index)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def capture_nsys(args: argparse.Namespace, out: Path) -> Path:
    """Run this script's nsys loop under nsys, export to SQLite, xz-compress it."""
    from profkit.run.tools import find_nsys

    nsys = str(find_nsys(args.nsys))
    report = out / "nsys-unannotated-train"
    loop = [sys.executable, str(Path(__file__).resolve()), "--loop", "nsys", *_model_args(args)]
    subprocess.run(
        [nsys, "profile", "-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none",
         "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
         "--force-overwrite=true", "-o", str(report), *loop],
        check=True,
    )  # fmt: skip
    sqlite = report.with_suffix(".sqlite")
    subprocess.run(
        [nsys, "export", "--type", "sqlite", "--force-overwrite=true", "-o", str(sqlite),
         str(report.with_suffix(".nsys-rep"))],
        check=True,
    )  # fmt: skip
    compressed = sqlite.with_suffix(".sqlite.xz")
    with sqlite.open("rb") as src, lzma.open(compressed, "wb", preset=9) as dst:
        shutil.copyfileobj(src, dst)
    return sqlite


def summarize(paths: list[Path], out: Path) -> None:
    """``profkit kernels --format json`` of each capture, into summary.json and stdout."""
    from profkit.analysis import kernel_report
    from profkit.traces.job import load

    summary = {}
    for path in paths:
        report = kernel_report(load([path]), top=5).to_json()
        summary[path.name] = {k: report[k] for k in ("source", "totals", "phases")}
        print(path.name, json.dumps(report["phases"], indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _model_args(args: argparse.Namespace) -> list[str]:
    return ["--device", args.device, "--batch", str(args.batch), "--ctx", str(args.ctx),
            "--d-model", str(args.d_model)]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "profiles")))
    parser.add_argument("--loop", choices=("torch", "nsys"), help="run one loop alone")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--nsys", default=None, help="nsys executable (else $PROFKIT_NSYS, PATH)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))  # profkit from this checkout (nsys lookup, summary only)
    if args.loop == "nsys":
        loop_nsys(args)
        return 0
    started = time.perf_counter()
    captured = [loop_torch(args, args.out)]
    if args.loop is None:
        if args.device != "cuda":
            print("nsys capture skipped: it needs --device cuda", file=sys.stderr)
        else:
            captured.append(capture_nsys(args, args.out))
    summarize(captured, args.out)
    print(f"done in {time.perf_counter() - started:.1f} s: {', '.join(map(str, captured))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
