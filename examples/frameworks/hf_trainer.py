"""A GPT-2 trained by the Hugging Face Trainer, with the truth of its phases marked (truth.py).

The Trainer runs forward, backward and the optimizer inside its own loop (and accelerate's);
this program marks, from their own hooks, when each really runs on the main thread (NVTX
start/end ranges in the domain ``truth``):

- ``forward``: the GPT2LMHeadModel's forward pre-hook to its forward hook (the loss is
  computed inside; the DDP wrapper's own work around the call is outside). With
  ``--checkpointing`` the blocks' recomputation runs inside backward, not here.
- ``backward``: ``loss.backward()`` itself. The Trainer calls ``accelerator.backward(loss)``,
  which divides the loss by its accumulation steps and then calls ``loss.backward()``; the
  wrapper below marks only that last call (the division's kernel is outside).
- ``optimizer``: AdamW's step pre-hook to its step post-hook: the parameter update alone,
  inside ``Optimizer.step``'s own profiler range.
- unmarked: gradient clipping (``max_grad_norm`` 1.0, the Trainer's default, between the
  last backward and the optimizer), the NaN check on each micro-batch's loss (a
  ``bool(torch.isnan(loss))``, a host sync: the Trainer's ``logging_nan_inf_filter``),
  the learning-rate scheduler, ``model.zero_grad()``, data loading, callbacks.

Runs (from the repository root)::

    nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \\
        --capture-range-end=stop -o hf \\
        python examples/frameworks/hf_trainer.py --steps 5 --profile-steps 3 --capture-range
    python examples/frameworks/hf_trainer.py --torch-profiler --trace-dir traces \\
        [--truth-record-function]       # traces/hf_trainer-rank0.json.gz
    torchrun --nproc-per-node 2 examples/frameworks/hf_trainer.py ...   # DDP, one per GPU
    ... --accumulate 2 | --checkpointing

``--device cpu`` runs it without a GPU (DDP over gloo under torchrun).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from typing import Any

import torch
from transformers import GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from truth import Truth, Window, add_arguments, gpt2_config, random_tokens, world_size


class Tokens(torch.utils.data.Dataset):
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class ProfileWindow(TrainerCallback):
    """on_step_begin/end come once per optimizer step (not per micro-batch)."""

    def __init__(self, window: Window) -> None:
        self.window = window

    def on_train_begin(self, args, state, control, **kwargs: Any) -> None:  # type: ignore[override]
        self.window.train_begin(args.process_index)

    def on_step_begin(self, args, state, control, **kwargs: Any) -> None:  # type: ignore[override]
        self.window.step_begin(state.global_step)

    def on_step_end(self, args, state, control, **kwargs: Any) -> None:  # type: ignore[override]
        self.window.step_end(state.global_step)

    def on_train_end(self, args, state, control, **kwargs: Any) -> None:  # type: ignore[override]
        self.window.train_end()


def mark_backward(trainer: Trainer, truth: Truth) -> None:
    """Mark the ``Tensor.backward`` call that ``accelerator.backward`` makes, and only it."""
    accelerator_backward = trainer.accelerator.backward
    tensor_backward = torch.Tensor.backward

    def marked(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        with truth.mark("backward"):
            tensor_backward(tensor, *args, **kwargs)

    def backward(loss: torch.Tensor, **kwargs: Any) -> None:
        torch.Tensor.backward = marked  # type: ignore[method-assign]
        try:
            accelerator_backward(loss, **kwargs)
        finally:
            torch.Tensor.backward = tensor_backward  # type: ignore[method-assign]

    trainer.accelerator.backward = backward  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, "hf_trainer")
    args = parser.parse_args()
    if args.device == "cuda" and world_size() == 1 and torch.cuda.device_count() > 1:
        parser.error(
            "the Trainer would use DataParallel over every visible GPU: run under torchrun "
            "or set CUDA_VISIBLE_DEVICES to one GPU"
        )

    torch.manual_seed(0)
    truth = Truth(record_function=args.truth_record_function)
    window = Window(args, truth)
    model = GPT2LMHeadModel(gpt2_config(args.ctx))
    truth.mark_forward(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    optimizer.register_step_pre_hook(lambda *_: truth.start("optimizer"))
    optimizer.register_step_post_hook(lambda *_: truth.end("optimizer"))
    tokens = random_tokens(args.steps * args.accumulate * args.batch * world_size(), args.ctx)

    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf_trainer-"),  # nothing is saved there
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.accumulate,
        gradient_checkpointing=args.checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if args.checkpointing else None,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=args.device == "cpu",
        seed=0,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=Tokens(tokens),
        optimizers=(optimizer, None),  # ours, with the hooks; the Trainer's default schedule
        callbacks=[ProfileWindow(window)],
    )
    mark_backward(trainer, truth)
    trainer.train()
    window.report("hf_trainer", training_args.world_size)
    shutil.rmtree(training_args.output_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
