"""The Typer application every command module registers itself on."""

from __future__ import annotations

import contextlib
import os
import select
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import typer
import typer.core

try:  # typer >= 0.25 vendors its own click; older typers use click itself
    from typer.core import _click as click  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import click  # type: ignore[no-redef]


# What a process ended by SIGPIPE reports to its shell (128 + 13), as `seq 1e9 | head -1` does.
READER_GONE_STATUS = 141


class _ReaderGone(Exception):
    """Stdout's reader left; not an OSError, so that typer's own EPIPE handling (exit 1)
    does not take it before :meth:`OneLineErrors.main` does."""


class OneLineErrors(typer.core.TyperGroup):
    """The root command: a usage error (unknown option, missing argument, bad value) is one
    ``error:`` line on stderr with exit status 2, like every other user error, instead of
    click's usage block or typer's boxed panel (4-6 lines). A reader that leaves stdout's
    pipe (``profkit kernels T | head -1``) is no error at all: see :func:`_quiet_exit`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:  # --version is a flag: no `<bool>` beside it
            if getattr(param, "is_flag", False):
                param.metavar = ""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""  # --help is a flag too
        return option

    def main(self, *args: Any, **kwargs: Any) -> NoReturn:
        kwargs["standalone_mode"] = False
        stdout_was_devnull = _stdout_is_devnull()
        try:
            code = super().main(*args, **kwargs)
        except _ReaderGone:
            _quiet_exit()
        except SystemExit as exc:
            # rich's consoles (typer's help among them) end the process themselves when the
            # pipe breaks under them: SystemExit(1) once stdout points at /dev/null.
            if exc.code == 1 and not stdout_was_devnull and _stdout_is_devnull():
                _quiet_exit()
            raise
        except click.exceptions.NoArgsIsHelpError as exc:
            # `profkit` or `profkit memory` alone: the help is the answer, printed already by
            # typer's rich help (or in the message without rich); no "error:" line.
            if exc.format_message().strip():
                print(exc.format_message(), file=sys.stderr)
            sys.exit(2)
        except click.exceptions.ClickException as exc:
            message = " ".join(exc.format_message().split())
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            print(f"error: {message}{hint}", file=sys.stderr)
            sys.exit(2)
        except typer.Abort:
            print("aborted", file=sys.stderr)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    # Every command runs inside invoke; the root's --help and usage inside make_context.
    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with _reader_may_leave():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with _reader_may_leave():
            return super().invoke(ctx)


@contextlib.contextmanager
def _reader_may_leave() -> Iterator[None]:
    """A broken pipe on stdout becomes :class:`_ReaderGone`; any other one stays an error."""
    try:
        yield
    except BrokenPipeError as exc:
        if not _reader_gone():
            raise  # a pipe to something else broke: a real failure, not `| head`
        raise _ReaderGone from exc


def _reader_gone() -> bool:
    """True when stdout (or stderr, as in ``2>&1 | head``) is a pipe or socket whose reading
    end is closed: poll says POLLERR there."""
    poller = select.poll()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # a test's buffer
            poller.register(stream.fileno(), select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _stdout_is_devnull() -> bool:
    try:
        return os.path.samestat(os.fstat(sys.stdout.fileno()), os.stat(os.devnull))
    except (AttributeError, OSError, ValueError):
        return False


def _quiet_exit() -> NoReturn:
    """End without a word, with status 141, when stdout's reader has gone.

    The reader chose to stop reading (``| head -1``): that is how pipes work, not a user
    error, so there is no message, as with ``cat`` or ``grep``. The status is 141, what those
    tools give when SIGPIPE ends them, rather than 0: the output was cut short, and a script
    under ``set -o pipefail`` should see profkit as it sees them. Work already written
    (result rows, files) stays written. Stdout is pointed at /dev/null first, so that
    flushing what is still buffered at exit cannot fail again (the recipe in Python's
    ``signal`` documentation, "Note on SIGPIPE").
    """
    with contextlib.suppress(AttributeError, OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    sys.exit(READER_GONE_STATUS)


app = typer.Typer(
    name="profkit",
    cls=OneLineErrors,
    help="Profile PyTorch Transformer LMs: benchmarks, Nsight Systems, torch.profiler, memory.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from profkit import __version__

        typer.echo(f"profkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Profile PyTorch Transformer LMs: benchmarks, Nsight Systems, torch.profiler, memory."""
