"""The ``nsys profile`` command line, built declaratively from one options dataclass.

Everything profkit asks of Nsight Systems is in :func:`profile_argv`; the defaults trace
CUDA and NVTX only (CPU sampling and context-switch tracing cost minutes and gigabytes on
a training run and tell nothing about kernels) and, for the built-in workload, capture only
the timed steps (``cudaProfilerApi`` range opened and closed by the child around them).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from profkit.errors import BadInput
from profkit.sidecar import sidecar_path
from profkit.workload.config import WorkloadConfig

DEFAULT_TRACE = "cuda,nvtx"
# nsys's own --capture-range values, plus ``auto``: cudaProfilerApi for the built-in
# workload (its child brackets the timed steps), none for a user's program.
CAPTURE_RANGES = ("auto", "cudaProfilerApi", "none", "nvtx", "hotkey")
_TRACE_TOKEN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_+][A-Za-z0-9._+-]*$")
# Flags profkit sets itself, with the profkit option to use instead of passing them through.
_OWNED_FLAGS = {
    "--output": "--name/--out-dir",
    "-o": "--name/--out-dir",
    "--force-overwrite": "--name (files of the same name are always replaced)",
    "-f": "--name (files of the same name are always replaced)",
    "--trace": "--trace",
    "-t": "--trace",
    "--sample": "--sample",
    "-s": "--sample",
    "--cpuctxsw": "--sample",
    "--capture-range": "--capture-range",
    "-c": "--capture-range",
    "--cuda-memory-usage": "--cuda-memory",
    "--python-backtrace": "--python-backtrace",
}


@dataclass(frozen=True)
class NsysOptions:
    """How to run ``nsys profile``: one field per ``profkit nsys`` flag."""

    trace: str = DEFAULT_TRACE
    """APIs to trace, comma-separated (nsys ``--trace``)."""
    capture_range: str = "auto"
    """``auto``, or an nsys ``--capture-range`` value (``cudaProfilerApi``, ``none``, ...)."""
    cuda_memory: bool = False
    """Track GPU memory use (nsys ``--cuda-memory-usage=true``)."""
    python_backtrace: bool = False
    """Python call stacks on CUDA API calls (nsys ``--python-backtrace=cuda``)."""
    sample: bool = False
    """Keep CPU sampling and context-switch tracing on (slow; off by default)."""
    extra_args: tuple[str, ...] = field(default=())
    """Further nsys flags, appended verbatim in order, one argv element each."""

    def __post_init__(self) -> None:
        tokens = self.trace.split(",")
        if not all(_TRACE_TOKEN.match(t) for t in tokens):
            raise BadInput(
                f"--trace takes comma-separated API names like cuda,nvtx; got {self.trace!r}"
            )
        if self.capture_range not in CAPTURE_RANGES:
            raise BadInput(
                f"unknown --capture-range {self.capture_range!r}; "
                f"choose one of: {', '.join(CAPTURE_RANGES)}"
            )
        if self.python_backtrace and "cuda" not in tokens:
            raise BadInput("--python-backtrace records stacks of CUDA calls: keep cuda in --trace")
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in _OWNED_FLAGS:
                raise BadInput(
                    f"--nsys-arg={arg}: profkit sets {flag} itself; use {_OWNED_FLAGS[flag]}"
                )

    def capture_for(self, builtin: bool) -> str:
        """The nsys ``--capture-range`` to use for the built-in workload or a program."""
        if self.capture_range != "auto":
            return self.capture_range
        return "cudaProfilerApi" if builtin else "none"


def profile_argv(nsys: str | Path, report: Path, options: NsysOptions, builtin: bool) -> list[str]:
    """The ``nsys profile ...`` argv up to (not including) the profiled program."""
    argv = [
        str(nsys), "profile",
        f"--output={report}",
        "--force-overwrite=true",
        f"--trace={options.trace}",
    ]  # fmt: skip
    collection = "process-tree" if options.sample else "none"
    argv += [f"--sample={collection}", f"--cpuctxsw={collection}"]
    capture = options.capture_for(builtin)
    if capture != "none":
        argv.append(f"--capture-range={capture}")
        # Stop at the first range's end; a user's own --capture-range-end replaces this.
        if not any(a.split("=", 1)[0] == "--capture-range-end" for a in options.extra_args):
            argv.append("--capture-range-end=stop")
    if options.cuda_memory:
        argv.append("--cuda-memory-usage=true")
    if options.python_backtrace:
        argv.append("--python-backtrace=cuda")
    argv += options.extra_args
    return argv


def default_name(target: WorkloadConfig | Sequence[str]) -> str:
    """A run's file name: the config label, or the stem of the user's script."""
    if isinstance(target, WorkloadConfig):
        return target.label()
    args = list(target)
    script = next((a for a in args if a.endswith(".py")), None)
    if script is not None:
        stem = Path(script).stem
    elif "-m" in args[:-1]:
        stem = args[args.index("-m") + 1].rsplit(".", 1)[-1]
    else:
        stem = Path(args[0]).stem if args else "program"
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", stem).strip(".-") or "program"


def check_name(name: str) -> str:
    """``name`` if it is a plain file name, else :class:`BadInput`."""
    if not _SAFE_NAME.match(name) or name in (".", ".."):
        raise BadInput(
            f"--name must be a plain file name (letters, digits, '.', '_', '+', '-'); got {name!r}"
        )
    return name


def check_program(program: Sequence[str]) -> list[str]:
    """The user's program argv, checked to name something that can run."""
    if not program:
        raise BadInput("no program given: `profkit nsys -- python train.py ARGS`")
    exe = program[0]
    if "/" in exe:
        path = Path(exe)
        if not path.is_file():
            raise BadInput(f"program not found: {exe}")
    elif shutil.which(exe) is None:
        raise BadInput(f"program not found on PATH: {exe}")
    return list(program)


def placeholder_result_path() -> Path:
    """Where a dry run says the child's result goes (a fresh temporary directory)."""
    return Path(tempfile.gettempdir()) / "profkit-nsys-XXXXXXXX" / "result.json"


@dataclass(frozen=True)
class RunFiles:
    """The files one ``profkit nsys`` run writes, all named after the run."""

    name: str
    out_dir: Path
    reports_dir: Path

    @property
    def report(self) -> Path:
        return self.out_dir / f"{self.name}.nsys-rep"

    @property
    def sqlite(self) -> Path:
        return self.out_dir / f"{self.name}.sqlite"

    @property
    def sidecar(self) -> Path:
        return sidecar_path(self.sqlite)

    @property
    def log(self) -> Path:
        return self.out_dir / f"{self.name}.nsys.log"

    @property
    def markdown(self) -> Path:
        return self.reports_dir / f"{self.name}.md"

    def all(self) -> list[Path]:
        return [self.report, self.sqlite, self.sidecar, self.log, self.markdown]
