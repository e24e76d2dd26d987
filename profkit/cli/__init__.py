"""The ``profkit`` command line: thin Typer commands that call one library function each.

Each command lives in its own module beside this one and registers itself on ``app``.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="profkit",
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


# Importing a command module registers its commands on ``app``.
from profkit.cli import (  # noqa: E402, F401
    attention,
    bench,
    compare,
    demo,
    diff,
    doctor,
    kernels,
    memory,
    nsys,
    precision,
    report,
    sizes,
)
from profkit.cli import torch as _torch  # noqa: E402, F401  (the module name shadows torch)


def main() -> None:
    app()
