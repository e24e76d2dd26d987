"""``profkit report``: collect what exists, draw the pictures, write ``reports/REPORT.md``."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from profkit.analysis.phase_marks import PhaseRanges
from profkit.errors import BadInput, ProfkitError
from profkit.files import check_output
from profkit.formats import write_text
from profkit.report import figures, plots
from profkit.report.collect import Inventory, collect
from profkit.report.sections import (
    Pictures,
    Section,
    attention_section,
    bench_section,
    comparisons_section,
    header,
    memory_section,
    sizes_section,
)
from profkit.report.traces import nsys_section, torch_section
from profkit.run.results import db_elsewhere

DEFAULT_PROFILES = Path("profiles")
DEFAULT_OUT = Path("reports/REPORT.md")
Say = Callable[[str], None]


@dataclass
class ReportResult:
    """What :func:`build_report` wrote."""

    path: Path
    sections: list[Section]
    images: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What could not be drawn or read, one line each."""


def build_report(
    profiles_dir: Path = DEFAULT_PROFILES,
    db_path: Path | None = None,
    out: Path = DEFAULT_OUT,
    progress: Say | None = None,
    phase_ranges: PhaseRanges | None = None,
) -> ReportResult:
    """Write the report from the results DB (default ``PROFILES/results.db``) and the
    traces and snapshots in ``profiles_dir``; PNGs go beside ``out``. ``phase_ranges``: the
    user's marks that are the phases of the traces holding them (``--phase-ranges``).

    Raises :class:`BadInput` when there is nothing to report at all.
    """
    say = progress or (lambda _message: None)
    db_path = db_path if db_path is not None else profiles_dir / "results.db"
    check_output(out, [db_path])
    say("reading the results DB")
    inv = collect(profiles_dir, db_path)
    if inv.empty:
        found = db_elsewhere(profiles_dir / "results.db")
        hint = f"give --profiles {found.parent}, or " if found else ""
        raise BadInput(
            f"nothing to report: no bench, attention or memory rows in {db_path} and no "
            f"traces or snapshots in {profiles_dir} ({hint}run `profkit report --run` to "
            "make them)"
        )
    out_dir = out.parent
    pictures = draw_pictures(inv, out_dir, say)
    say("reading traces")
    sections = [
        sizes_section(),
        bench_section(inv, pictures),
        comparisons_section(inv, pictures),
        nsys_section(inv, out_dir, pictures, phase_ranges),
        torch_section(inv, out_dir, pictures, phase_ranges),
        memory_section(inv, pictures),
        attention_section(inv),
    ]
    text = render(inv, sections, db_path.as_posix(), profiles_dir.as_posix())
    write_text(out, text)
    images = [out_dir / p for p in _picture_paths(pictures)]
    return ReportResult(out, sections, images, pictures.notes)


def render(inv: Inventory, sections: list[Section], db_label: str, profiles_label: str) -> str:
    """The whole markdown: header, contents, then every section (skipped ones as one line)."""
    contents = " · ".join(f"[{s.title}](#{s.anchor})" for s in sections)
    body = "\n\n".join(f"## {s.title}\n\n{s.body.strip()}" for s in sections)
    return f"{header(inv, db_label, profiles_label)}\n\n{contents}\n\n{body}\n"


def draw_pictures(inv: Inventory, out_dir: Path, say: Say) -> Pictures:
    """Every PNG the data allows, one per machine for each kind; a failure becomes a note."""
    pictures = Pictures()
    say("drawing the plots")
    bars = figures.step_bars(inv.bench)
    for item in bars:
        name = _png("report-step-time", item.where, len(bars))
        if _draw(pictures, name, plots.step_time, item, out_dir / name):
            pictures.step_time[item.where] = name
    panels = figures.speedups(inv.bench)
    for machine, machine_panels in panels.items():
        name = _png("report-speedups", machine, len(panels))
        if _draw(pictures, name, plots.speedups, machine, machine_panels, out_dir / name):
            pictures.speedups[machine] = name
            pictures.speedup_panels[machine] = machine_panels
    curves = figures.memory_curves(inv.memory, inv.bench)
    for curve in curves:
        name = _png("report-peak-memory", curve.where, len(curves))
        if _draw(pictures, name, plots.peak_memory, curve, out_dir / name):
            pictures.peak_memory[curve.where] = name
    for snapshot in inv.snapshots:
        say(f"drawing the memory timeline of {snapshot.name}")
        name = f"timeline-{_snapshot_stem(snapshot)}.png"
        if _draw(pictures, name, plots.timeline, snapshot, out_dir / name):
            pictures.timelines[snapshot] = name
    return pictures


def _draw(pictures: Pictures, name: str, draw: Callable[..., object], *args: object) -> bool:
    """Draw one picture; a snapshot that cannot be read, say, becomes a note, not a failure."""
    try:
        draw(*args)
    except ProfkitError as exc:
        pictures.notes.append(f"{name}: {exc}")
        return False
    return True


def _png(stem: str, machine: str, machines: int) -> str:
    if machines == 1:
        return f"{stem}.png"
    return f"{stem}-{re.sub(r'[^a-z0-9]+', '-', machine.lower()).strip('-')}.png"


def _snapshot_stem(path: Path) -> str:
    name = path.name
    for suffix in (".pickle.xz", ".pickle.gz", ".pickle"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _picture_paths(pictures: Pictures) -> list[str]:
    return [
        *pictures.step_time.values(),
        *pictures.speedups.values(),
        *pictures.peak_memory.values(),
        *pictures.timelines.values(),
        *pictures.ranks.values(),
    ]
