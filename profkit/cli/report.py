"""``profkit report``: reports/REPORT.md from whatever has been measured (``--run``: measure first)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from profkit.cli._common import PhaseRangesOpt, command
from profkit.cli.app import app
from profkit.cli.render import err_console, progress_bar
from profkit.errors import BadInput
from profkit.files import check_output

if TYPE_CHECKING:
    from profkit.report.plan import Piece
    from profkit.report.run import Hooks, Outcome

ProfilesOpt = Annotated[
    Path, typer.Option("--profiles", help="Where traces (.sqlite, .json.gz) and snapshots are.")
]
ReportDbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db",
        envvar="PROFKIT_DB",
        help="Results database (default: PROFILES/results.db).",
        show_default=False,
    ),
]
ReportOutOpt = Annotated[
    Path, typer.Option("--out", "-o", help="The markdown report; its PNGs go beside it.")
]
RunOpt = Annotated[
    bool,
    typer.Option(
        "--run", help="First measure what is missing (bench, nsys, torch, memory, attention)."
    ),
]
PlanOpt = Annotated[
    str,
    typer.Option(
        "--plan",
        help="With --run: auto (gpu with CUDA, else cpu) | gpu (the course report, minutes "
        "on an H100) | cpu (tiny model, about a minute on 2 cores) | minimal (tiny, ~25 s).",
    ),
]
STATUS_STYLE = {"ran": "green", "present": "dim", "skipped": "yellow", "failed": "red"}


@command(app)
def report(
    profiles: ProfilesOpt = Path("profiles"),
    db: ReportDbOpt = None,
    out: ReportOutOpt = Path("reports/REPORT.md"),
    run: RunOpt = False,
    plan: PlanOpt = "auto",
    phase_ranges: PhaseRangesOpt = None,
) -> None:
    """Regenerate reports/REPORT.md from the results DB and profiles/: every table and plot.

    Sizes, bench tables, fp32/bf16, compile and warm-up comparisons, nsys and torch.profiler
    kernel tables, memory tables and timelines, the attention grid, and PNG plots. A section
    with no data says so in one line. --run first measures whatever is missing.

    Example: profkit report --run
    """
    from profkit.analysis.phase_marks import PhaseRanges
    from profkit.formats import plural
    from profkit.report import build_report

    # Traces without the marks are read as without the option (a report reads every trace).
    marks = PhaseRanges.parse(phase_ranges, strict=False)

    db_path = db if db is not None else profiles / "results.db"
    check_output(out, [db_path])
    if plan != "auto" and not run:
        raise BadInput("--plan chooses what --run measures; add --run")
    if not run and db is not None and not db.exists():  # a typo, not an empty DB
        raise BadInput(f"no results database at {db} (--db; --run makes one)")
    if run:
        _run(profiles, db_path, out.parent, plan)
    with err_console.status("writing the report") as status:
        result = build_report(profiles, db_path, out, progress=status.update, phase_ranges=marks)
    for section in result.sections:
        if section.skipped:
            err_console.print(
                f"[dim]skipped {escape(section.title)}: {escape(section.skipped)}[/]",
                highlight=False,
                soft_wrap=True,
            )
    for note in result.notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    shown = sum(not s.skipped for s in result.sections)
    print(
        f"wrote {result.path} ({shown} of {len(result.sections)} sections, "
        f"{plural(len(result.images), 'picture')})"
    )


def _run(profiles: Path, db_path: Path, reports_dir: Path, plan_name: str) -> None:
    from profkit.report.plan import choose_plan
    from profkit.report.run import Where, cuda_available, run_plan
    from profkit.run.results import check_db

    check_db(db_path)  # a DB no piece could write fails here, not after the others ran
    cuda = cuda_available()
    pieces = choose_plan(plan_name, cuda)
    label = plan_name if plan_name != "auto" else ("gpu" if cuda else "cpu")
    err_console.print(f"measuring what is missing: the {label} plan, {len(pieces)} pieces")
    with run_progress(pieces) as hooks:
        run_plan(pieces, Where(profiles, db_path, reports_dir), hooks)


@contextmanager
def run_progress(pieces: Sequence[Piece]) -> Iterator[Hooks]:
    """A bar over every config and cell of the plan (on a terminal), and one line per piece."""
    from profkit.report.run import Hooks, units

    total = sum(units(p) for p in pieces)
    with progress_bar() as progress:
        task = progress.add_task("report --run", total=total)
        position = {"index": 0}

        def piece(p: Piece) -> None:
            position["index"] += 1
            progress.update(
                task, description=f"{position['index']}/{len(pieces)} {p.kind}", current=p.what
            )

        def done(outcome: Outcome) -> None:
            style = STATUS_STYLE.get(outcome.status, "")
            progress.console.print(
                f"[{style}]{outcome.status:<8}[/] {outcome.wall_s:6.1f} s  "
                f"{escape(outcome.piece.what)}: {escape(outcome.note)}",
                highlight=False,
                soft_wrap=True,
            )

        yield Hooks(
            piece=piece,
            item=lambda label: progress.update(task, current=label),
            advance=lambda n: progress.advance(task, n),
            done=done,
        )
