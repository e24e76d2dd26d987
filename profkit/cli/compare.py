"""``profkit compare FIELD``: course-report comparisons built from the results DB alone."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from profkit.analysis import compare as compare_lib
from profkit.cli._common import (
    AttentionOpt,
    BatchOpt,
    CtxOpt,
    DtypeOpt,
    FormatOpt,
    ModeOpt,
    OutOpt,
    SizeOpt,
    WarmupOpt,
    command,
    compile_values,
)
from profkit.cli.app import app
from profkit.cli.views import render_comparison
from profkit.errors import BadInput
from profkit.formats import check_format
from profkit.run import bench as bench_lib
from profkit.run.results import DEFAULT_DB

FieldArg = Annotated[
    str, typer.Argument(help="The field that varies: dtype | compile | warmup | attention | mode.")
]
ReadDbOpt = Annotated[
    Path, typer.Option("--db", envvar="PROFKIT_DB", help="Results database to read.")
]
CompileFilterOpt = Annotated[
    str | None, typer.Option("--compile", help="no | yes | both (default: any).")
]
StepsFilterOpt = Annotated[list[int], typer.Option("--steps", help="Timed steps.")]
DeviceFilterOpt = Annotated[str | None, typer.Option("--device", help="cpu | cuda | mps.")]


@command(app)
def compare(
    field: FieldArg,
    size: SizeOpt = [],  # noqa: B006 - typer reads list defaults, never mutates them
    ctx: CtxOpt = [],  # noqa: B006
    batch: BatchOpt = [],  # noqa: B006
    mode: ModeOpt = [],  # noqa: B006
    dtype: DtypeOpt = [],  # noqa: B006
    compile: CompileFilterOpt = None,
    attention: AttentionOpt = [],  # noqa: B006
    warmup: WarmupOpt = [],  # noqa: B006
    steps: StepsFilterOpt = [],  # noqa: B006
    device: DeviceFilterOpt = None,
    db: ReadDbOpt = DEFAULT_DB,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
) -> None:
    """Compare bench rows that differ only in FIELD, from the results DB alone.

    Runs nothing. Per size × context and phase (forward, forward+backward,
    optimizer, step): each variant's mean ms side by side, with Δ ms and Δ %
    against the baseline (fp32, eager, naive, fewest warm-up steps, forward).
    `warmup` shows mean, std and the first timed step next to the median.
    The options filter the rows; an option left out matches any value.

    Example: profkit compare dtype --size small medium --mode train
    """
    compare_lib.check_field(field)
    check_format(fmt)
    filters: dict[str, Sequence[Any]] = {
        "size": size, "ctx": ctx, "batch": batch, "mode": mode, "dtype": dtype,
        "compile": compile_values(compile) if compile is not None else (),
        "attention": attention, "warmup": warmup, "steps": steps,
        "device": [device] if device else [],
    }  # fmt: skip
    stored = bench_lib.load(db)
    if not stored:
        raise BadInput(f"nothing to compare: {db} holds no bench rows")
    comparison = compare_lib.compare(compare_lib.select(stored, filters), field)
    render_comparison(comparison, fmt, out)
