"""``profkit precision``: accumulation error and the dtypes autocast produces."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from profkit.cli._common import FormatOpt, OutOpt, command
from profkit.cli.app import app
from profkit.cli.render import emit_tables, err_console

precision_app = typer.Typer(
    help="Mixed precision: accumulation error, and the dtypes autocast produces.",
    no_args_is_help=True,
)
app.add_typer(precision_app, name="precision")


@command(precision_app)
def accumulate(
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda.")] = "cpu",
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """Sum 0.01 a thousand times: fp32, fp16, fp16 into fp32, fp16 upcast to fp32."""
    from profkit.studies import precision as study  # torch: only when the command runs

    rows = study.accumulate(device)
    title = f"Sum of 0.01 × {study.ACCUMULATE_STEPS} (exact: {study.ACCUMULATE_EXACT:g})"
    emit_tables([(title, study.accumulate_table(rows))], fmt, out, json_value=rows)


@command(precision_app)
def dtypes(
    device: Annotated[
        list[str], typer.Option("--device", help="auto (CUDA and CPU, else CPU) | cpu | cuda.")
    ] = [],  # noqa: B006 - typer reads the default; it is never mutated
    dtype: Annotated[
        list[str], typer.Option("--dtype", help="Autocast dtype(s): fp16 bf16 (fp32: none).")
    ] = [],  # noqa: B006
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """The handout's ToyModel under autocast: dtypes of parameters, activations, loss, grads."""
    from profkit.studies import precision as study

    rows = study.autocast_dtypes(device, dtype)
    emit_tables([("ToyModel under autocast", study.dtypes_table(rows))], fmt, out, json_value=rows)
    notes = {f"{r['device']} {r['autocast']}: {r['note']}" for r in rows if r["note"]}
    for note in sorted(notes):
        err_console.print(f"[yellow]{escape(note)}[/]", highlight=False, soft_wrap=True)
