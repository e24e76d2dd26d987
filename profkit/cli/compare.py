"""``profkit compare FIELD``: course-report comparisons built from the results DB alone."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from profkit.cli._common import (
    FormatOpt,
    OutOpt,
    WorkloadOptions,
    command,
    workload_options,
)
from profkit.cli.app import app
from profkit.cli.views import render_comparison
from profkit.errors import BadInput
from profkit.files import DEFAULT_DB

FieldArg = Annotated[
    str,
    typer.Argument(
        help="The field that varies: dtype | compile | warmup | attention | mode | nproc (scaling efficiency)."
    ),
]
ReadDbOpt = Annotated[
    Path, typer.Option("--db", envvar="PROFKIT_DB", help="Results database to read.")
]


@command(app)
@workload_options(filters=True)
def compare(
    field: FieldArg,
    *,
    workload: WorkloadOptions,
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
    # Imported here, not at the top: `--help` must not import pandas (tests/test_startup.py).
    from profkit.analysis import compare as compare_lib
    from profkit.formats import check_format
    from profkit.run import bench as bench_lib

    compare_lib.check_field(field)
    check_format(fmt)
    stored = bench_lib.load(db)
    if not stored:
        raise BadInput(f"nothing to compare: {db} holds no bench rows")
    comparison = compare_lib.compare(compare_lib.select(stored, workload.values()), field)
    render_comparison(comparison, fmt, out)
