"""Mixed-precision demonstrations: accumulation error and the dtypes autocast produces.

:func:`accumulate` sums 0.01 a thousand times with four accumulator/addend choices (the
handout's ``mixed_precision_accumulation``). :func:`autocast_dtypes` runs the handout's
``ToyModel`` under autocast and reports the dtype of every tensor the question asks about,
observed with forward hooks rather than assumed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from profkit.errors import BadInput
from profkit.workload.config import resolve_device

ACCUMULATE_STEPS = 1000
ACCUMULATE_ADDEND = 0.01
ACCUMULATE_EXACT = 10.0
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
AUTOCAST_CHOICES = ("fp16", "bf16", "fp32")
DEVICE_CHOICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class AccumulateCase:
    """One way of summing: the accumulator's dtype, the addend's, and an explicit upcast."""

    name: str
    accumulator: str
    addend: str
    upcast: bool = False


ACCUMULATE_CASES = (
    AccumulateCase("fp32", "fp32", "fp32"),
    AccumulateCase("fp16", "fp16", "fp16"),
    AccumulateCase("fp16 into fp32", "fp32", "fp16"),
    AccumulateCase("fp16 upcast to fp32", "fp32", "fp16", upcast=True),
)


def accumulate(device: str = "cpu") -> list[dict[str, Any]]:
    """Sum 0.01 a thousand times in each :data:`ACCUMULATE_CASES` way; values and errors.

    ``fp16 into fp32`` relies on type promotion inside ``+=``; ``fp16 upcast to fp32``
    converts each addend first. Both land on the same value: the error is already in the
    fp16 rounding of 0.01 (0.01000213...), not in the additions.
    """
    dev = _device(device)
    rows = []
    for case in ACCUMULATE_CASES:
        total = torch.zeros((), dtype=TORCH_DTYPES[case.accumulator], device=dev)
        addend = torch.tensor(ACCUMULATE_ADDEND, dtype=TORCH_DTYPES[case.addend], device=dev)
        step = addend.to(torch.float32) if case.upcast else addend
        for _ in range(ACCUMULATE_STEPS):
            total += step  # in place, as in the handout: the accumulator keeps its dtype
        value = float(total.item())
        rows.append(
            {
                "case": case.name,
                "accumulator": case.accumulator,
                "addend": case.addend,
                "upcast": case.upcast,
                "device": dev.type,
                "value": value,
                "addend_value": float(addend.item()),
                "exact": ACCUMULATE_EXACT,
                "abs_error": abs(value - ACCUMULATE_EXACT),
                "rel_error": abs(value - ACCUMULATE_EXACT) / ACCUMULATE_EXACT,
            }
        )
    return rows


def accumulate_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as the handout prints them: 4 decimals, with the full value and the errors."""
    return pd.DataFrame(
        {
            "case": [r["case"] for r in rows],
            "accumulator": [r["accumulator"] for r in rows],
            "addend": [f"{r['addend']} ({r['addend_value']!r})" for r in rows],
            "value": [f"{r['value']:.4f}" for r in rows],
            "value (full)": [repr(r["value"]) for r in rows],
            "abs error": [f"{r['abs_error']:.3e}" for r in rows],
            "rel error": [f"{r['rel_error']:.4%}" for r in rows],
        }
    )


class ToyModel(nn.Module):
    """The handout's toy model: Linear (no bias) → ReLU → LayerNorm → Linear (no bias)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        return self.fc2(x)


TOY_IN_FEATURES = 16
TOY_OUT_FEATURES = 5
TOY_BATCH = 4


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _names(dtypes: list[torch.dtype]) -> str:
    return ", ".join(dict.fromkeys(_dtype_name(d) for d in dtypes))


def _observe(device: torch.device, autocast: str) -> list[tuple[str, str]]:
    """Run the toy model once under autocast; (tensor, dtype) in the order they appear."""
    torch.manual_seed(0)
    model = ToyModel(TOY_IN_FEATURES, TOY_OUT_FEATURES).to(device)
    x = torch.randn(TOY_BATCH, TOY_IN_FEATURES, device=device)
    targets = torch.randint(0, TOY_OUT_FEATURES, (TOY_BATCH,), device=device)
    seen: list[tuple[str, str]] = []
    hooks = [
        module.register_forward_hook(
            lambda mod, _args, out, name=name: seen.append(
                (f"{name} ({type(mod).__name__}) output", _dtype_name(out.dtype))
            )
        )
        for name, module in model.named_children()
    ]
    enabled = autocast != "fp32"
    try:
        with torch.autocast(device.type, dtype=TORCH_DTYPES[autocast], enabled=enabled):
            params = _names([p.dtype for p in model.parameters()])
            logits = model(x)
            loss = F.cross_entropy(logits, targets)
    finally:
        for hook in hooks:
            hook.remove()
    loss.backward()  # outside autocast, as the autocast docs recommend
    grads = _names([p.grad.dtype for p in model.parameters() if p.grad is not None])
    last = seen[-1][0]
    seen[-1] = (f"{last} = logits", seen[-1][1])
    return [("parameters", params), *seen, ("loss", _dtype_name(loss.dtype)), ("gradients", grads)]


def _device(name: str) -> torch.device:
    if name not in DEVICE_CHOICES:
        raise BadInput(f"unknown --device {name!r}; choose one of: {', '.join(DEVICE_CHOICES)}")
    return torch.device(resolve_device(name))


def _devices(devices: list[str]) -> list[torch.device]:
    if devices in ([], ["auto"]):
        names = ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]
        return [torch.device(n) for n in names]
    return list(dict.fromkeys(_device(d) for d in devices))


def autocast_dtypes(
    devices: list[str] | None = None, dtypes: list[str] | None = None
) -> list[dict[str, Any]]:
    """The toy model under autocast on each device × dtype: one row per observed tensor.

    ``devices`` default: CUDA and CPU where CUDA exists, else CPU. ``dtypes`` default:
    fp16 and bf16 (``fp32`` is the no-autocast baseline). A combination that this torch
    build cannot autocast becomes rows with dtype ``unsupported`` and the reason.
    """
    dtypes = list(dict.fromkeys(dtypes or ["fp16", "bf16"]))
    for name in dtypes:
        if name not in AUTOCAST_CHOICES:
            raise BadInput(
                f"unknown --dtype {name!r}; choose one of: {', '.join(AUTOCAST_CHOICES)}"
            )
    rows: list[dict[str, Any]] = []
    for device in _devices(devices or []):
        for autocast in dtypes:
            note = None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    observed = _observe(device, autocast)
                except RuntimeError as exc:  # e.g. an autocast dtype this backend refuses
                    observed, note = [], str(exc).strip().splitlines()[0]
            # Older torch builds warn and silently disable autocast for dtypes they lack.
            disabled = [str(w.message) for w in caught if "autocast" in str(w.message).lower()]
            if disabled:
                note = disabled[0].splitlines()[0]
            if not observed or (disabled and autocast != "fp32"):
                observed = [("all tensors", "unsupported")]
            rows.extend(
                {"device": device.type, "autocast": autocast, "tensor": t, "dtype": d, "note": note}
                for t, d in observed
            )
    return rows


def dtypes_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Tensors down, ``<device> <autocast>`` across: the handout's question at a glance."""
    frame = pd.DataFrame(rows)
    frame["column"] = frame["device"] + " " + frame["autocast"]
    order = list(dict.fromkeys(frame["tensor"]))
    columns = list(dict.fromkeys(frame["column"]))
    table = frame.pivot(index="tensor", columns="column", values="dtype")
    table = table.reindex(index=order, columns=columns).fillna("—")
    return table.reset_index().rename_axis(columns=None)
