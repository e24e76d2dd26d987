"""The workload configuration: one dataclass shared by the CLI, the sweep and the child process.

Every command that runs the built-in model builds a :class:`WorkloadConfig`; sweeps
serialise it to JSON for the child process, which rebuilds the very same object. The
defaults live here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import typing
from dataclasses import dataclass, field
from typing import Any

from profkit.errors import BadInput, MissingTool
from profkit.workload import cuda

MODES = ("forward", "forward-backward", "train")
DTYPES = ("fp32", "bf16", "fp16")
ATTENTIONS = ("naive", "sdpa")
DEVICES = ("auto", "cpu", "cuda", "mps")
# Longer contexts than this are almost surely a typo (the naive attention's score matrix
# alone would be batch * heads * ctx^2 floats).
MAX_CTX = 65_536
MAX_BATCH = 4_096
MAX_NPROC = 1_024
PARALLELS = ("ddp", "fsdp")  # profkit.workload.parallel implements them
# NVLink multicast (NVLS) can take a shared host's GPUs out of service; every process
# profkit starts keeps it off unless the user set these variables themselves.
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
MAX_THREADS = 1_024
# Counts past 32 bits (10**20, say) cannot even be stored in the results DB's integers;
# below that, a huge count is the user's (tests make a config run until it is killed).
MAX_STEPS = 2**31 - 1


@dataclass(frozen=True)
class WorkloadConfig:
    """One run of the built-in Transformer: what to build and how to step it."""

    size: str = "small"
    """Model size name, one of ``profkit.workload.model.SIZES``."""
    ctx: int = 256
    """Context length (tokens per sequence)."""
    batch: int = 4
    """Sequences per batch."""
    mode: str = "train"
    """``forward``; ``forward-backward``; ``train`` (forward + backward + AdamW step)."""
    dtype: str = "fp32"
    """``fp32``, or ``bf16``/``fp16`` under autocast (parameters stay fp32)."""
    compile: bool = False
    """Wrap the model in ``torch.compile``."""
    attention: str = "naive"
    """``naive`` (matmul + softmax, annotated sub-ranges) or ``sdpa`` (fused kernels)."""
    warmup: int = 5
    """Untimed steps before the timed ones (compilation, autotuning, allocator warm-up)."""
    steps: int = 10
    """Timed steps."""
    device: str = "auto"
    """``auto`` (CUDA, else MPS, else CPU), ``cpu``, ``cuda`` or ``mps``."""
    vocab_size: int = 10_000
    """Vocabulary size of the model and of the random batch."""
    seed: int = 0
    """Seed for weights and the random batch."""
    nproc: int = 1
    """Processes (one per GPU) started by ``torchrun``; ``batch`` is per process."""
    parallel: str = "ddp"
    """With ``nproc`` > 1: ``ddp`` (DistributedDataParallel) or ``fsdp`` (FSDP2)."""
    threads: int | None = None
    """Intra-op CPU threads (``torch.set_num_threads``); None: sweeps choose from the cores
    free to the process (``profkit.run.threads``), an in-process run keeps torch's."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Free-form labels carried along into results (not part of a config's identity)."""

    def __post_init__(self) -> None:
        from profkit.workload.specs import SIZES

        if self.size not in SIZES:
            raise BadInput(f"unknown size {self.size!r}; choose one of: {', '.join(SIZES)}")
        _check_choice("mode", self.mode, MODES)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("attention", self.attention, ATTENTIONS)
        _check_choice("device", self.device, DEVICES)
        if not 0 < self.ctx <= MAX_CTX:
            raise BadInput(f"--ctx must be between 1 and {MAX_CTX:,}, got {self.ctx}")
        if not 0 < self.batch <= MAX_BATCH:
            raise BadInput(f"--batch must be between 1 and {MAX_BATCH:,}, got {self.batch}")
        if self.warmup < 0:
            raise BadInput(f"--warmup must be 0 or more, got {self.warmup}")
        if self.steps < 1:
            raise BadInput(f"--steps must be at least 1, got {self.steps}")
        for option, value in (("--warmup", self.warmup), ("--steps", self.steps)):
            if value > MAX_STEPS:
                raise BadInput(f"{option} must be at most {MAX_STEPS:,}, got {value:,}")
        _check_choice("parallel", self.parallel, PARALLELS)
        if not 1 <= self.nproc <= MAX_NPROC:
            raise BadInput(f"--nproc must be between 1 and {MAX_NPROC}, got {self.nproc}")
        if self.threads is not None and not 0 < self.threads <= MAX_THREADS:
            raise BadInput(f"--threads must be between 1 and {MAX_THREADS}, got {self.threads}")
        if self.vocab_size < 2:
            raise BadInput(f"vocab size must be at least 2, got {self.vocab_size}")

    @property
    def has_backward(self) -> bool:
        return self.mode in ("forward-backward", "train")

    @property
    def has_optimizer(self) -> bool:
        return self.mode == "train"

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.ctx

    def label(self) -> str:
        """A short, file-name-safe name for this config (``large-ctx256-train-bf16``)."""
        parts = [self.size, f"ctx{self.ctx}", self.mode, self.dtype]
        if self.batch != 4:
            parts.insert(2, f"b{self.batch}")
        if self.attention != "naive":
            parts.append(self.attention)
        if self.compile:
            parts.append("compiled")
        if self.nproc > 1:
            parts.append(f"{self.parallel}{self.nproc}")
        return "-".join(parts)

    def replace(self, **changes: Any) -> WorkloadConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_json(cls, text: str) -> WorkloadConfig:
        return cls.from_dict(json.loads(text))


RUN_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(WorkloadConfig)
    if f.name not in ("device", "vocab_size", "seed", "extra")
)
"""The fields that say what a run does, in declaration order (``size`` ... ``steps``):
what tables, result keys and report lines name a run by. Left out: where it ran (the
device), the model's vocabulary and seed (never changed from the command line), labels."""
RUN_FIELD_TYPES: dict[str, type] = {
    name: next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    for name, hint in typing.get_type_hints(WorkloadConfig).items()
    if name in RUN_FIELDS
}
"""The type each run field holds when it holds one (``threads: int | None`` -> ``int``)."""


def _check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise BadInput(f"unknown --{option} {value!r}; choose one of: {', '.join(choices)}")


def resolve_device(name: str) -> str:
    """Turn ``auto`` into a concrete device and check that an explicit one exists here.

    CUDA is asked of the driver (:mod:`profkit.workload.cuda`), so that a parent that only
    launches children never pays for importing torch; torch is asked only about MPS, which
    exists on macOS alone.
    """
    if name not in DEVICES:
        raise BadInput(f"unknown --device {name!r}; choose one of: {', '.join(DEVICES)}")
    if name == "auto":
        if cuda.device_count() > 0:
            return "cuda"
        return "mps" if _mps_available() else "cpu"
    if name == "cuda" and cuda.device_count() == 0:
        raise MissingTool("--device cuda: no CUDA device is visible here (try --device cpu)")
    if name == "mps" and not _mps_available():
        raise MissingTool("--device mps: no Apple MPS device is available here")
    return name


def _mps_available() -> bool:
    if sys.platform != "darwin":
        return False
    import torch

    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
