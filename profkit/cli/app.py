"""The Typer application every command module registers itself on."""

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
