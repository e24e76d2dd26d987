"""What every command shares: list-valued options, the error boundary, workload options."""

from __future__ import annotations

import errno
import functools
import itertools
import os
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import typer.core

from profkit.cli.render import err_console
from profkit.errors import ProfkitError, ProfkitWarning
from profkit.files import check_writable
from profkit.workload.config import WorkloadConfig

F = TypeVar("F", bound=Callable[..., Any])
_NEGATIVE_NUMBER = re.compile(r"^-\d")


class ListOptionsCommand(typer.core.TyperCommand):
    """Lets a list option take several values after one flag: ``--size small medium``.

    Click alone only repeats the flag (``--size small --size medium``); users type the former,
    as in every course report, so the argv is rewritten into the latter before parsing.
    Values run until the next option or ``--``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            # Typer's help gives every option a type column; a flag takes no value, so
            # `--bf16 <bool>` would read as if it wanted one.
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # --help is a flag too
        return option

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        multi = {
            name
            for param in self.params
            # typer >= 0.25 vendors its own click, so duck-type rather than isinstance
            if getattr(param, "param_type_name", "") == "option"
            and getattr(param, "multiple", False)
            for name in param.opts
        }
        rewritten: list[str] = []
        current: str | None = None
        pending_value = False
        for index, arg in enumerate(args):
            if arg == "--":
                rewritten.extend(args[index:])
                break
            is_option = arg.startswith("-") and not _NEGATIVE_NUMBER.match(arg)
            if pending_value:
                rewritten.append(arg)
                pending_value = False
            elif is_option:
                flag = arg.split("=", 1)[0]
                current = flag if flag in multi else None
                pending_value = current is not None and "=" not in arg
                rewritten.append(arg)
            elif current is not None:
                rewritten.extend([current, arg])
            else:
                rewritten.append(arg)
        return super().parse_args(ctx, rewritten)


def command(app: typer.Typer, name: str | None = None, **kwargs: Any) -> Callable[[F], F]:
    """Register a command with list options and the one error boundary.

    A :class:`ProfkitError` becomes one line on stderr and exit status 2, and so does an
    output that cannot be written (stdout closed, a full disk, a reader gone from the pipe);
    a :class:`~profkit.errors.ProfkitWarning` becomes one ``warning:`` line and the work
    goes on; Ctrl-C becomes exit status 130 with a short note (work already written stays
    written).
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            said: list[str] = []
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("always", ProfkitWarning)
                    warnings.showwarning = functools.partial(_show_warning, said)
                    # Every command's --out is checked before its work, not when it is written.
                    if isinstance(kw.get("out"), Path):
                        check_writable(kw["out"])
                    result = fn(*args, **kw)
                    sys.stdout.flush()  # a closed or full stdout fails here, not at exit
                    return result
            except ProfkitError as exc:
                _error(str(exc), said)
            except OSError as exc:
                if exc.errno not in _OUTPUT_ERRNOS or exc.filename is not None:
                    raise  # a file's own error, not stdout's: the readers say those
                _silence_stdout()
                _error(f"cannot write the output: {exc.strerror or exc}", said)
            except KeyboardInterrupt:
                err_console.print("interrupted; results already written are kept")
                raise typer.Exit(130) from None
            finally:
                for line in said:  # warnings of a command that succeeded, after its output
                    err_console.print(
                        f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True
                    )

        return app.command(name, cls=ListOptionsCommand, **kwargs)(wrapper)  # type: ignore[return-value]

    return decorate


# What writing to stdout fails with: the reader left the pipe, the disk is full, stdout was
# closed, the device failed.
_OUTPUT_ERRNOS = {errno.EPIPE, errno.ENOSPC, errno.EBADF, errno.EIO, errno.EDQUOT}


def _error(message: str, said: list[str]) -> None:
    """One ``error:`` line; warnings said before it are folded in, so it stays one line."""
    line = " ".join(message.split())  # one line, even if a message (from pickle, say) has more
    if said:
        line += f" (after {len(said)} warning(s); the first: {said[0]})"
        said.clear()
    err_console.print(f"[bold red]error:[/] {line}", highlight=False, soft_wrap=True)
    raise typer.Exit(2) from None


def _show_warning(said: list[str], message: Any, *args: Any, **kwargs: Any) -> None:
    """Keep a warning to print when the command ends (one line, whatever it holds)."""
    line = " ".join(str(message).split())
    if line not in said:
        said.append(line)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that flushing at exit cannot fail a second time."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (tests), or closed
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


# Workload options, declared once. Lists sweep; single-run commands take the first value.
SizeOpt = Annotated[
    list[str],
    typer.Option("--size", "-s", help="Model size(s): tiny small medium large xl 2.7B 10B."),
]
CtxOpt = Annotated[list[int], typer.Option("--ctx", help="Context length(s).")]
BatchOpt = Annotated[list[int], typer.Option("--batch", help="Batch size(s).")]
ModeOpt = Annotated[list[str], typer.Option("--mode", help="forward | forward-backward | train.")]
DtypeOpt = Annotated[list[str], typer.Option("--dtype", help="fp32 | bf16 | fp16 (autocast).")]
Bf16Opt = Annotated[bool, typer.Option("--bf16", help="Shorthand for --dtype bf16.")]
CompileOpt = Annotated[
    str, typer.Option("--compile", help="no | yes | both (eager and compiled side by side).")
]
AttentionOpt = Annotated[list[str], typer.Option("--attention", help="naive | sdpa.")]
WarmupOpt = Annotated[list[int], typer.Option("--warmup", help="Untimed warm-up steps.")]
StepsOpt = Annotated[int, typer.Option("--steps", help="Timed steps.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | mps.")]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="table | md | csv | json.")]
DbOpt = Annotated[
    Path,
    typer.Option("--db", envvar="PROFKIT_DB", help="Results database (SQLite), created if needed."),
]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Write the output to this file.")]

COMPILE_CHOICES = {"no": (False,), "yes": (True,), "both": (False, True)}


def compile_values(value: str) -> tuple[bool, ...]:
    from profkit.errors import BadInput

    aliases = {"false": "no", "off": "no", "true": "yes", "on": "yes"}
    key = aliases.get(value.lower(), value.lower())
    if key not in COMPILE_CHOICES:
        raise BadInput(f"unknown --compile {value!r}; choose one of: no, yes, both")
    return COMPILE_CHOICES[key]


def workload_configs(
    size: list[str],
    ctx: list[int],
    batch: list[int],
    mode: list[str],
    dtype: list[str],
    bf16: bool,
    compile: str,
    attention: list[str],
    warmup: list[int],
    steps: int,
    device: str,
) -> list[WorkloadConfig]:
    """The cross product of the option lists, each validated by ``WorkloadConfig``."""
    dtypes = ["bf16"] if bf16 and not dtype else (dtype or ["fp32"])
    if bf16 and "bf16" not in dtypes:
        dtypes.append("bf16")
    grid = itertools.product(
        size or ["small"],
        ctx or [256],
        batch or [4],
        mode or ["train"],
        dtypes,
        compile_values(compile),
        attention or ["naive"],
        warmup or [5],
    )
    configs = [
        WorkloadConfig(
            size=s,
            ctx=c,
            batch=b,
            mode=m,
            dtype=d,
            compile=comp,
            attention=a,
            warmup=w,
            steps=steps,
            device=device,
        )
        for s, c, b, m, d, comp, a, w in grid
    ]
    return list(dict.fromkeys(configs))  # drop duplicates, keep order


def single_config(configs: list[WorkloadConfig], command_name: str) -> WorkloadConfig:
    from profkit.errors import BadInput

    if len(configs) != 1:
        raise BadInput(
            f"`profkit {command_name}` runs one config; got {len(configs)} "
            "(give one value per option)"
        )
    return configs[0]
