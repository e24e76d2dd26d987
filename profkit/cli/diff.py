"""``profkit diff A B``: what changed between two profiles (phases, categories, kernels)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from profkit.cli._common import FormatOpt, NsysOpt, OutOpt, PhaseRangesOpt, command
from profkit.cli.app import app
from profkit.cli.render import console, emit_tables, err_console, read_progress
from profkit.errors import BadInput

# --noise's default. profkit.analysis.diff.NOISE_PCT is the same number; it is not imported
# here because that imports pandas, which `--help` must not (tests/test_startup.py checks
# that the two agree).
NOISE_PCT = 5.0

ProfilesArg = Annotated[
    list[Path] | None,
    typer.Argument(
        metavar="A B",  # both required; checked below for one clear line (typer says `[A B]...`)
        help="Two profiles, any mix of formats: Nsight Systems .sqlite or .nsys-rep, or a "
        "torch.profiler Chrome trace .json[.gz]. B is compared against A.",
        show_default=False,
    ),
]
TopOpt = Annotated[
    int, typer.Option("--top", "-n", help="Kernels per group (appeared, vanished, ...); 0 = all.")
]
NoiseOpt = Annotated[
    float,
    typer.Option(
        "--noise",
        help="A kernel is faster or slower only when its time per call changed by more than "
        "this many per cent (run-to-run noise is of that order).",
    ),
]
PerStepOpt = Annotated[
    bool,
    typer.Option(
        "--per-step/--total",
        help="Per step (each phase divided by its range instances) or the capture's sums.",
    ),
]


@command(app)
def diff(
    profiles: ProfilesArg = None,
    top: TopOpt = 10,
    per_step: PerStepOpt = True,
    noise: NoiseOpt = NOISE_PCT,
    fmt: FormatOpt = "table",
    out: OutOpt = None,
    nsys: NsysOpt = None,
    phase_ranges: PhaseRangesOpt = None,
) -> None:
    """What changed from A to B: GPU time per phase and category; kernels appeared, vanished, faster or slower per call, run more or fewer times.

    E.g. fp32 vs bf16 (fp32 gemm kernels vanish and bf16 ones appear: the category table compares gemm with gemm) or eager vs torch.compile (triton kernels appear). Per step by default. A kernel is faster or slower by its time per call, beyond --noise %; one that only runs more or fewer times is listed apart.
    """
    from profkit.analysis import diff as diff_lib
    from profkit.analysis.phase_marks import PhaseRanges
    from profkit.formats import check_format, file_format, markdown_table, write_text
    from profkit.traces.job import load

    check_format(fmt)
    paths = list(profiles or [])
    if len(paths) != 2:
        raise BadInput(f"profkit diff takes two profiles, A and B; got {len(paths)}")
    marks = PhaseRanges.parse(phase_ranges)
    with read_progress(f"{paths[0].name} and {paths[1].name}") as progress:
        job = load(paths, nsys, progress=progress, side_by_side=True)
    result = diff_lib.diff(job, per_step, top, noise, marks)
    fmt = file_format(fmt, out)
    tables = result.data_tables() if fmt == "csv" else result.display_tables(fmt == "table")
    if fmt == "md":
        text = "\n\n".join(
            ["# profkit diff", "\n".join(f"- {line}" for line in result.lines())]
            + [f"## {title}\n\n{markdown_table(df, DIGITS)}" for title, df in tables]
        )
        if out is None:
            print(text)
        else:
            write_text(out, text + "\n")
            err_console.print(f"wrote {out}")
        return
    if fmt == "table":
        for line in result.lines():
            console.print(line, highlight=False)
    emit_tables(tables, fmt, out, json_value=result.to_json(), digits=DIGITS)


DIGITS = 3  # per-step kernel times are often tenths of a millisecond
