"""The Typer application every command module registers itself on."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import typer
import typer.core

try:  # typer >= 0.25 vendors its own click; older typers use click itself
    from typer.core import _click as click  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import click  # type: ignore[no-redef]


class OneLineErrors(typer.core.TyperGroup):
    """The root command: a usage error (unknown option, missing argument, bad value) is one
    ``error:`` line on stderr with exit status 2, like every other user error, instead of
    click's usage block or typer's boxed panel (4-6 lines)."""

    def main(self, *args: Any, **kwargs: Any) -> NoReturn:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
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
