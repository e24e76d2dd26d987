"""What every command shares: list-valued options, the error boundary, the option sets.

The workload options (``--size --ctx --batch --mode --dtype --bf16 --compile --attention
--warmup --steps --device``) are declared here once, by :func:`workload_options`; their
defaults and choices are :class:`~profkit.workload.config.WorkloadConfig`'s.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import inspect
import itertools
import os
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import typer.core
from rich.markup import escape

from profkit.cli.render import err_console
from profkit.errors import BadInput, ProfkitError, ProfkitWarning
from profkit.files import check_not_written, check_out_dir, check_output
from profkit.run.proc import check_timeout
from profkit.workload.config import ATTENTIONS, DEVICES, DTYPES, MODES, PARALLELS, WorkloadConfig
from profkit.workload.specs import SIZES

F = TypeVar("F", bound=Callable[..., Any])
_NEGATIVE_NUMBER = re.compile(r"^-\d")


def readable_placeholders(params: list[Any]) -> None:
    """Help that reads as a user types: a flag takes no value (typer showed ``--bf16
    <bool>``); a list option takes names (``--size SIZE...``, not ``<list[str]>``); an
    argument with a metavar shows just it (``diff A B``, not ``[A B]...``)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        elif getattr(param, "param_type_name", "") == "option" and param.metavar is None:
            if getattr(param, "multiple", False):
                param.metavar = f"{(param.name or 'value').upper()}..."
        elif getattr(param, "param_type_name", "") == "argument":
            metavar = param.metavar
            if metavar is None:  # SNAPSHOT, PATH... (typer wrote `{snapshot}`)
                metavar = (param.name or "value").upper() + ("..." if param.nargs != 1 else "")
                param.metavar = metavar
            if metavar is not None:
                # the usage line (typer wrote `[A B]...`, `{path}...`) and the type column
                param._usage_display_name = lambda *_, _m=metavar, **__: _m
                param.make_metavar = lambda *_, _m=metavar, **__: _m
                param.display_type_rich = lambda *_, **__: ""


class PlainGroup(typer.core.TyperGroup):
    """A command group (``memory``, ``cache``) whose help reads as its commands' do."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        readable_placeholders(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # --help is a flag
        return option


class ListOptionsCommand(typer.core.TyperCommand):
    """Lets a list option take several values after one flag: ``--size small medium``.

    Click alone only repeats the flag (``--size small --size medium``); users type the former,
    as in every course report, so the argv is rewritten into the latter before parsing.
    Values run until the next option or ``--``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            # Typer keeps a docstring's line breaks inside a paragraph, so a terminal narrower
            # than the source lines showed ragged fragments ("... the" / "device ..."): one
            # paragraph, one line, wrapped by the terminal.
            paragraphs = inspect.cleandoc(self.help).split("\n\n")
            self.help = "\n\n".join(" ".join(p.split()) for p in paragraphs)
        readable_placeholders(self.params)

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


def _input_paths(kw: dict[str, Any], outputs: tuple[str, ...]) -> list[Path]:
    """Every path-valued argument that is not an output: the files a command reads (and --db)."""
    found: list[Path] = []
    for name, value in kw.items():
        if name in outputs:
            continue
        values = value if isinstance(value, list | tuple) else [value]
        found += [v for v in values if isinstance(v, Path)]
    return found


def command(
    app: typer.Typer,
    name: str | None = None,
    outputs: tuple[str, ...] = ("out",),
    **kwargs: Any,
) -> Callable[[F], F]:
    """Register a command with list options and the one error boundary.

    A :class:`ProfkitError` becomes one line on stderr and exit status 2, and so does an
    output that cannot be written (stdout closed, a full disk; a reader gone from the pipe
    is no error: :mod:`profkit.cli.app` ends then, quietly);
    a :class:`~profkit.errors.ProfkitWarning` becomes one ``warning:`` line and the work
    goes on; Ctrl-C becomes exit status 130 with a short note (work already written stays
    written). Before the
    command runs, each of its ``outputs`` (parameter names) that is given is checked by
    :func:`~profkit.files.check_output` against every other path argument (inputs, --db).
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            said: list[str] = []
            if sys.stdout is None:  # started with stdout closed (`>&-`): Python has none
                if not isinstance(kw.get("out"), Path):
                    _error(
                        "stdout is closed, and profkit prints its results there "
                        "(redirect it to a file or /dev/null, or give --out FILE)",
                        said,
                    )
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the results go to --out
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("always", ProfkitWarning)
                    warnings.showwarning = functools.partial(_show_warning, said)
                    _check_shared_options(kw, outputs)
                    result = fn(*args, **kw)
                    sys.stdout.flush()  # a closed or full stdout fails here, not at exit
                    return result
            except ProfkitError as exc:
                _error(str(exc), said)
            except BrokenPipeError:
                raise  # stdout's reader left (`| head`): cli.app ends quietly, every command
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


def _check_shared_options(kw: dict[str, Any], outputs: tuple[str, ...]) -> None:
    """Options several commands share are checked here, before any work starts.

    Each of the command's ``outputs`` that is given is checked by
    :func:`~profkit.files.check_output` against every other path argument (its inputs, its
    ``--db``): an output never overwrites what the command reads. An ``--out-dir`` must be a folder
    that can be written in (or made).
    """
    given = [output for output in outputs if isinstance(kw.get(output), Path)]
    for index, output in enumerate(given):
        flag = _flag(output)
        check_output(kw[output], _input_paths(kw, outputs), flag)
        # Two outputs into one file (--out o.png --plot o.png): the second replaced the first.
        for other in given[:index]:
            check_not_written(kw[output], [kw[other]], flag, f"where {_flag(other)} writes too")
    if isinstance(kw.get("out_dir"), Path):
        check_out_dir(kw["out_dir"])
    check_timeout(kw.get("timeout"))


def _flag(parameter: str) -> str:
    return "--" + parameter.replace("_", "-")


# What writing to stdout fails with: the disk is full, stdout was closed, the device failed
# (a reader leaving the pipe, EPIPE, is not a failure: see profkit.cli.app).
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EBADF, errno.EIO, errno.EDQUOT}


def _error(message: str, said: list[str]) -> None:
    """One ``error:`` line; warnings said before it are folded in, so it stays one line."""
    line = " ".join(message.split())  # one line, even if a message (from pickle, say) has more
    if said:
        line += f" (after {len(said)} warning(s); the first: {said[0]})"
        said.clear()
    # The message is text, not markup: a path or kernel name in [brackets] is kept.
    err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
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


# --- options of many commands ---------------------------------------------------------------

FormatOpt = Annotated[str, typer.Option("--format", "-f", help="table | md | csv | json.")]
DbOpt = Annotated[
    Path,
    typer.Option("--db", envvar="PROFKIT_DB", help="Results database (SQLite), created if needed."),
]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Write the output to this file.")]
# A run's folder of files (nsys, torch): profkit.files.output_dirs says where each goes.
OutDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--out-dir",
        help="Where every file goes, the report too "
        "(default: profiles/, and the report in reports/).",
        show_default=False,
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", help="Seconds per config before its process is killed."),
]
PhaseRangesOpt = Annotated[
    str | None,
    typer.Option(
        "--phase-ranges",
        help="Your own ranges as the phases: forward=NAME,backward=NAME,optimizer=NAME (any of "
        "them; NAME a range name or domain:name, e.g. forward=mymarks:fwd). Exact, per rank.",
        show_default=False,
    ),
]
NsysOpt = Annotated[
    str | None,
    typer.Option(
        "--nsys",
        help="The nsys executable (default: $PROFKIT_NSYS, else nsys on PATH).",
        show_default=False,
    ),
]


# --- the workload options -------------------------------------------------------------------

COMPILE_CHOICES = {"no": (False,), "yes": (True,), "both": (False, True)}
_CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(WorkloadConfig)}


@dataclass(frozen=True)
class _WorkloadOption:
    """How one workload option reads on the command line; its default is WorkloadConfig's."""

    name: str
    flags: tuple[str, ...]
    help: str
    kind: type
    sweeps: bool = True
    """Several values in one run make a sweep (``--size small medium``)."""
    filter_help: str | None = None
    """The help where the option filters stored rows, if it reads differently there."""


_OPTIONS = (
    _WorkloadOption("size", ("--size", "-s"), f"Model size(s): {' '.join(SIZES)}.", str),
    _WorkloadOption("ctx", ("--ctx",), "Context length(s).", int),
    _WorkloadOption("batch", ("--batch",), "Batch size(s).", int),
    _WorkloadOption("mode", ("--mode",), f"{' | '.join(MODES)}.", str),
    _WorkloadOption("dtype", ("--dtype",), f"{' | '.join(DTYPES)} (autocast).", str),
    _WorkloadOption("bf16", ("--bf16",), "Shorthand for --dtype bf16.", bool, sweeps=False),
    _WorkloadOption(
        "compile",
        ("--compile",),
        f"{' | '.join(COMPILE_CHOICES)} (eager and compiled side by side).",
        str,
        sweeps=False,
        filter_help=f"{' | '.join(COMPILE_CHOICES)}.",
    ),
    _WorkloadOption("attention", ("--attention",), f"{' | '.join(ATTENTIONS)}.", str),
    _WorkloadOption("warmup", ("--warmup",), "Untimed warm-up steps.", int),
    _WorkloadOption("steps", ("--steps",), "Timed steps.", int, sweeps=False),
    _WorkloadOption(
        "device",
        ("--device",),
        f"{' | '.join(DEVICES)}.",
        str,
        sweeps=False,
        filter_help=f"{' | '.join(d for d in DEVICES if d != 'auto')} (where the rows ran).",
    ),
    _WorkloadOption(
        "nproc",
        ("--nproc",),
        "Processes per run, one per GPU, started by torchrun (gloo on CPU); --batch is per "
        "process.",
        int,
    ),
    _WorkloadOption(
        "parallel", ("--parallel",), f"With --nproc > 1: {' | '.join(PARALLELS)}.", str
    ),
    _WorkloadOption(
        "threads",
        ("--threads",),
        "Intra-op CPU threads (default: OMP_NUM_THREADS, else the cores free to the process: "
        "its CPU affinity minus the load average).",
        int,
        sweeps=False,
    ),
)
WORKLOAD_OPTIONS = tuple(option.name for option in _OPTIONS)
"""The workload options' parameter names, in the order ``--help`` lists them."""
_BY_NAME = {option.name: option for option in _OPTIONS}

DEFAULT_DEVICE = str(_CONFIG_DEFAULTS["device"])
DEFAULT_COMPILE = "yes" if _CONFIG_DEFAULTS["compile"] else "no"
# For commands that run something other than the built-in model on a device (attention, demo).
DeviceOpt = Annotated[str, typer.Option("--device", help=_BY_NAME["device"].help)]
CompileOpt = Annotated[str, typer.Option("--compile", help=_BY_NAME["compile"].help)]
ThreadsOpt = Annotated[
    int | None, typer.Option("--threads", help=_BY_NAME["threads"].help, show_default=False)
]


def compile_values(value: str) -> tuple[bool, ...]:
    """``--compile no|yes|both`` as the compile settings to run (``both``: eager, compiled)."""
    aliases = {"false": "no", "off": "no", "true": "yes", "on": "yes"}
    key = aliases.get(value.lower(), value.lower())
    if key not in COMPILE_CHOICES:
        raise BadInput(f"unknown --compile {value!r}; choose one of: no, yes, both")
    return COMPILE_CHOICES[key]


@dataclass(frozen=True)
class WorkloadOptions:
    """The workload options as typed, each a tuple of values: several values sweep.

    As filters (``profkit compare``), an empty tuple matches any value.
    """

    size: tuple[str, ...]
    ctx: tuple[int, ...]
    batch: tuple[int, ...]
    mode: tuple[str, ...]
    dtype: tuple[str, ...]
    """``--bf16`` included: it adds bf16, or stands alone when no ``--dtype`` was typed."""
    compile: tuple[bool, ...]
    attention: tuple[str, ...]
    warmup: tuple[int, ...]
    steps: tuple[int, ...]
    device: tuple[str, ...]
    nproc: tuple[int, ...]
    parallel: tuple[str, ...]
    threads: tuple[int | None, ...]
    given: tuple[str, ...] = ()
    """The options typed on the command line, in ``--help`` order (``bf16`` included)."""

    def values(self) -> dict[str, tuple[Any, ...]]:
        """Each :class:`WorkloadConfig` field the options set, with its values."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "given"
        }

    def configs(self) -> list[WorkloadConfig]:
        """The cross product of the values, each validated by ``WorkloadConfig``."""
        # An option whose default is None ("profkit chooses", --threads) stays None unless typed.
        values = {
            k: v or ((None,) if _CONFIG_DEFAULTS.get(k, 0) is None else v)
            for k, v in self.values().items()
        }
        if "parallel" in self.given and max(values["nproc"], default=1) == 1:
            # One process is not data parallel: running it as asked would drop --parallel.
            raise BadInput(
                f"--parallel {' '.join(values['parallel'])} needs several processes: "
                "add --nproc 2 (or more), or leave --parallel out"
            )
        grid = itertools.product(*values.values())
        configs = [
            _one_process(WorkloadConfig(**dict(zip(values, point, strict=True)))) for point in grid
        ]
        return list(dict.fromkeys(configs))  # drop duplicates, keep order

    def config(self, command_name: str) -> WorkloadConfig:
        """The one config a single-run command runs; several values are a user error."""
        configs = self.configs()
        if len(configs) != 1:
            raise BadInput(
                f"`profkit {command_name}` runs one config; got {len(configs)} "
                "(give one value per option)"
            )
        return configs[0]


def _one_process(config: WorkloadConfig) -> WorkloadConfig:
    """One process has no parallelism to choose: ``--nproc 1 2 --parallel ddp fsdp`` runs
    three configs, not four."""
    if config.nproc == 1 and config.parallel != _CONFIG_DEFAULTS["parallel"]:
        return config.replace(parallel=_CONFIG_DEFAULTS["parallel"])
    return config


def workload_options(
    *, filters: bool = False, single: bool = False, **defaults: Any
) -> Callable[[F], F]:
    """Give a command the workload options; it receives them as one ``workload`` argument.

    Stack it under ``@command(...)``. The command declares ``workload: WorkloadOptions`` where
    the options should stand in its ``--help``; this puts them into the signature Typer reads,
    so every command shows the same options, help and choices. ``defaults`` change a default
    for this command alone (``steps=1``); all others are ``WorkloadConfig``'s. With
    ``filters=True`` no option has a default and every one takes several values: an option
    left out matches any value. With ``single=True`` (a command that runs one config and
    takes no program argument: ``torch``) every option takes one value and ``--help``
    offers no list and no ``--compile both``, which that command would refuse. (``nsys``
    keeps lists: there a second value would be read as its program, a worse error.)
    """
    unknown = set(defaults) - set(WORKLOAD_OPTIONS)
    if unknown:
        raise TypeError(f"not workload options: {sorted(unknown)}")

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn, eval_str=True)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index("workload")
        kind = params[at].kind  # keyword-only where an argument stands before it
        params[at : at + 1] = [
            _parameter(option, filters, defaults, kind, single) for option in _OPTIONS
        ]
        # Typer hands a parameter annotated with Context the click context: it tells the
        # options typed from those left at their defaults.
        params.insert(at, inspect.Parameter(_CONTEXT, kind, default=None, annotation=typer.Context))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            context = kw.pop(_CONTEXT, None)
            typed = {name: kw.pop(name) for name in WORKLOAD_OPTIONS}
            return fn(*args, workload=_workload(typed, _given(context)), **kw)

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        wrapper.__annotations__["return"] = signature.return_annotation
        return wrapper  # type: ignore[return-value]

    return decorate


_CONTEXT = "workload_context"


def _parameter(
    option: _WorkloadOption, filters: bool, defaults: dict[str, Any], kind: Any, single: bool
) -> inspect.Parameter:
    """The ``inspect.Parameter`` Typer reads for ``option``: type, flags, help, default."""
    default: Any = defaults.get(option.name, _CONFIG_DEFAULTS.get(option.name, False))
    show: bool | str = True
    if option.kind is bool:  # --bf16: a flag, in runs and filters alike
        annotation: Any = bool
    elif filters and option.name == "compile":
        annotation, default, show = str | None, None, "any"
    elif filters:
        annotation, default, show = list[option.kind], [], "any"  # type: ignore[name-defined]
    elif option.name == "compile":
        annotation, default = str, "yes" if default else "no"
    elif option.sweeps and not single:
        annotation, default = list[option.kind], [default]  # type: ignore[name-defined]
    else:  # a single value; None (threads) means "let profkit choose"
        annotation = option.kind if default is not None else option.kind | None
        show = default is not None
    text = (option.filter_help or option.help) if filters else option.help
    if single:  # one value: `Model size: ...`; compile `no | yes`
        text = text.replace("(s)", "")
        if option.name == "compile":
            text = f"{' | '.join(k for k in COMPILE_CHOICES if k != 'both')}."
    info = typer.Option(*option.flags, help=text, show_default=show)
    return inspect.Parameter(
        option.name, kind, default=default, annotation=Annotated[annotation, info]
    )


def _workload(typed: dict[str, Any], given: tuple[str, ...]) -> WorkloadOptions:
    def values(value: Any) -> tuple[Any, ...]:
        if value is None:
            return ()
        return tuple(value) if isinstance(value, list) else (value,)

    dtype = values(typed["dtype"])
    if typed["bf16"]:  # bf16 joins the dtypes typed, or replaces the default
        kept = dtype if "dtype" in given else ()
        dtype = kept if "bf16" in kept else (*kept, "bf16")
    compile_ = typed["compile"]
    return WorkloadOptions(
        **{name: values(typed[name]) for name in WORKLOAD_OPTIONS if name != "bf16"}
        | {"dtype": dtype, "compile": compile_values(compile_) if compile_ else ()},
        given=given,
    )


def _given(context: typer.Context | None) -> tuple[str, ...]:
    """The workload options typed on the command line (or set by an environment variable)."""
    if context is None:
        return ()
    sources = {name: context.get_parameter_source(name) for name in WORKLOAD_OPTIONS}
    return tuple(
        name
        for name, source in sources.items()
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
    )
