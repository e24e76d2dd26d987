"""A GPT-2 trained by PyTorch Lightning, with the truth of its phases marked (see truth.py).

Lightning runs forward, backward and the optimizer inside its own loop; this program
marks, from Lightning's own hooks, when each really runs on the main thread (NVTX
start/end ranges in the domain ``truth``):

- ``forward``: the GPT-2 model's forward pre-hook to its forward hook (the loss is
  computed inside; DDP's and Lightning's own work around the call is outside). With
  ``--checkpointing`` the blocks' recomputation runs inside backward, not here.
- ``backward``: ``LightningModule.backward``, around ``loss.backward()`` alone.
- ``optimizer``: automatic optimization calls ``optimizer.step(closure)``, and AdamW runs
  the closure (forward, zero_grad, backward) inside its step. The mark opens when the
  closure returns and closes in AdamW's step post-hook, inside ``Optimizer.step``'s own
  profiler range (so the ``truth:`` ranges nest); it covers Lightning's
  ``on_before_optimizer_step`` and gradient clipping (none is configured) and the update.
- unmarked: zero_grad (inside the closure, between forward and backward), data loading,
  the batch's copy to the device, callbacks, logging.

Runs (from the repository root)::

    nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \\
        --capture-range-end=stop -o lightning \\
        python examples/frameworks/lightning_gpt2.py --steps 5 --profile-steps 3 --capture-range
    python examples/frameworks/lightning_gpt2.py --torch-profiler --trace-dir traces \\
        [--truth-record-function]       # traces/lightning_gpt2-rank0.json.gz
    torchrun --nproc-per-node 2 examples/frameworks/lightning_gpt2.py ...   # DDP, one per GPU
    ... --accumulate 2 | --checkpointing | --strategy fsdp (CUDA only: Lightning refuses FSDP on CPU)

``--device cpu`` runs it without a GPU (DDP over gloo under torchrun).
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import torch
from transformers import GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from truth import Truth, Window, add_arguments, gpt2_config, random_tokens, world_size

try:  # the GPU machine has the pytorch-lightning package; the unified one works as well
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import FSDPStrategy
except ImportError:  # pragma: no cover
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import FSDPStrategy


class GPT2Module(pl.LightningModule):
    def __init__(self, args: argparse.Namespace, truth: Truth) -> None:
        super().__init__()
        self.model = GPT2LMHeadModel(gpt2_config(args.ctx))
        if args.checkpointing:
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.truth = truth
        truth.mark_forward(self.model)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (tokens,) = batch
        return self.model(input_ids=tokens, labels=tokens).loss

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        with self.truth.mark("backward"):
            loss.backward(*args, **kwargs)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:  # type: ignore[override]
        def closure() -> Any:
            loss = optimizer_closure()  # forward, zero_grad, backward
            self.truth.start("optimizer")
            return loss

        optimizer.step(closure=closure)
        self.truth.end_if_open("optimizer")  # normally closed by the post-hook already

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # trainer.model: the wrapped model (FSDP's flat parameters; the same ones otherwise).
        optimizer = torch.optim.AdamW(self.trainer.model.parameters(), lr=1e-4)
        optimizer.register_step_post_hook(lambda *_: self.truth.end_if_open("optimizer"))
        return optimizer


class ProfileWindow(pl.Callback):
    def __init__(self, window: Window) -> None:
        self.window = window

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.window.train_begin(trainer.global_rank)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[override]
        self.window.step_begin(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[override]
        self.window.step_end(trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.window.train_end()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, "lightning_gpt2")
    parser.add_argument(
        "--devices", type=int, default=world_size(), help="processes (torchrun's, by default)"
    )
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp")
    args = parser.parse_args()
    if args.strategy == "fsdp" and args.device != "cuda":
        parser.error("Lightning's FSDP strategy needs CUDA (it refuses accelerator='cpu')")
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    pl.seed_everything(0, verbose=False)
    truth = Truth(record_function=args.truth_record_function)
    window = Window(args, truth)
    module = GPT2Module(args, truth)
    tokens = random_tokens(args.steps * args.accumulate * args.batch * args.devices, args.ctx)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(tokens), batch_size=args.batch
    )
    strategy: Any = "auto"
    if args.strategy == "fsdp":
        strategy = FSDPStrategy(auto_wrap_policy={GPT2Block})
    elif args.devices > 1:
        strategy = "ddp"
    trainer = pl.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=args.devices,
        strategy=strategy,
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulate,
        callbacks=[ProfileWindow(window)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=loader)
    window.report("lightning_gpt2", trainer.world_size, strategy=type(trainer.strategy).__name__)


if __name__ == "__main__":
    main()
