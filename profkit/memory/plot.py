"""The active-memory timeline as a picture, drawn locally with matplotlib (no browser).

Like pytorch.org/memory_viz's "Active Memory Timeline": every allocation is a band whose
height is its size, stacked in allocation order (oldest at the bottom), so that when one
is freed everything allocated after it slides down. The x axis counts allocator events
(allocations and frees), not seconds: allocations happen when the CPU launches work, so
event order is what the allocator saw. The largest allocations get their own band,
coloured by call site; the rest are summed into one grey band on top. The peak is marked
and the largest allocations alive at the peak are labelled with their call sites.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from profkit.errors import BadInput
from profkit.files import REPORTS_DIR, check_writable, written
from profkit.memory.summary import (
    GIB,
    fmt_bytes,
    phase_of_events,
    phase_spans,
    site_label,
)
from profkit.memory.timeline import Allocation, Timeline
from profkit.workload.names import PHASES

IMAGE_SUFFIXES = (".png", ".svg", ".pdf")
SITE_COLORS = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6",
]  # fmt: skip
OTHER_SITE_COLOR = "#bab0ac"
SMALL_COLOR = "#dddddd"
PHASE_COLORS = dict(zip(PHASES, ("#4e79a7", "#e15759", "#59a14f"), strict=True))
# Samples of the summarized band; the drawn bands are exact at every change.
_SAMPLES = 6_000
_PLOT_PIXELS = 450  # about the height of the plotting area in pixels


def check_image_path(path: Path) -> None:
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise BadInput(f"{path}: the picture must end in {', '.join(IMAGE_SUFFIXES)}")


def plot_timeline(
    timeline: Timeline,
    out: Path,
    title: str = "Active memory timeline",
    detail: int = 2_000,
    sites: int = 10,
    labels: int = 3,
    phase_marks: Sequence[dict[str, Any]] = (),
) -> Path:
    """Draw ``timeline`` to ``out`` (.png, .svg or .pdf) and return the path.

    ``detail`` allocations (the largest) get their own band; ``sites`` call sites get
    their own colour; the ``labels`` call sites holding the most at the peak are labelled.
    """
    check_image_path(out)
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window, never a browser
    import matplotlib.pyplot as plt

    layout = _layout(timeline, detail, sites, phase_marks)
    fig, ax = plt.subplots(figsize=(13, 6.8), dpi=110)
    try:
        _draw_bands(ax, layout)
        _draw_the_rest(ax, timeline, layout)
        _shade_phases(ax, layout.spans)
        _mark_peak_and_ooms(ax, timeline, layout)
        _label_sites(ax, layout, labels)
        _finish_axes(ax, title, layout)
        ax.legend(handles=_legend_handles(timeline, layout), loc="upper left",
                  bbox_to_anchor=(0, -0.12), ncol=2, fontsize=8, frameon=False,
                  title="call site (bytes and allocations alive at the peak)",
                  title_fontsize=8)  # fmt: skip
        fig.tight_layout()
        save_figure(fig, out)
    finally:
        plt.close(fig)
    return out


def save_figure(fig: Any, out: Path) -> None:
    with written(out) as temporary:
        fig.savefig(temporary, format=out.suffix[1:] or None)


@dataclass
class _Layout:
    """What the picture shows, worked out before anything is drawn."""

    events: int
    spans: list[tuple[str, int, int]]
    drawn: list[Allocation]
    """The largest allocations, each a band of its own, in stacking order (oldest first)."""
    at_peak: list[Allocation]
    site_of: dict[int, str]
    """``id(allocation)`` -> its call-site label."""
    site_rank: list[str]
    """The call sites given a colour of their own, most memory first."""
    color_of_site: dict[str, str]
    xs: np.ndarray
    """Left ends of the intervals between changes of the drawn bands."""
    bottoms: np.ndarray
    """Bottom edge (bytes) of each drawn band in each interval."""
    top_gib: float
    peak: int


def _layout(
    timeline: Timeline, detail: int, sites: int, phase_marks: Sequence[dict[str, Any]]
) -> _Layout:
    n = timeline.events
    spans = phase_spans(timeline, phase_marks)
    phase_of = phase_of_events(spans)
    drawn = timeline.largest(detail)
    peak = timeline.peak_state
    at_peak = timeline.live_at(peak)
    site_of = {id(a): site_label(a, phase_of) for a in [*drawn, *at_peak]}
    ranked = _rank_sites(drawn, site_of, n)
    # Stacking order: oldest at the bottom; those older than the trace grouped by site.
    order = {site: i for i, site in enumerate(ranked)}
    drawn.sort(key=lambda a: (a.start, order[site_of[id(a)]] if a.start < 0 else 0, -a.size))
    xs, bottoms = _stack(drawn, n)
    return _Layout(
        events=n,
        spans=spans,
        drawn=drawn,
        at_peak=at_peak,
        site_of=site_of,
        site_rank=ranked[:sites],
        color_of_site={s: SITE_COLORS[i % len(SITE_COLORS)] for i, s in enumerate(ranked[:sites])},
        xs=xs,
        bottoms=bottoms,
        top_gib=max(float(timeline.requested_bytes.max()) / GIB, 1e-9) * 1.12,
        peak=peak,
    )


def _draw_bands(ax: Any, layout: _Layout) -> None:
    """One band per drawn allocation, stacked on those older and alive below it."""
    xs, n = layout.xs, layout.events
    for row, alloc in enumerate(layout.drawn):
        a, b = alloc.start + 1, (alloc.end if alloc.end is not None else n) + 1
        i, j = np.searchsorted(xs, a), np.searchsorted(xs, b)
        x = np.append(xs[i:j], b)
        lo = np.append(layout.bottoms[row, i:j], layout.bottoms[row, j - 1]) / GIB
        # A white outline separates allocations, but would wash out bands a few pixels high.
        # (Thin bands get an edge of their own colour instead, so no seams show between them.)
        color = layout.color_of_site.get(layout.site_of[id(alloc)], OTHER_SITE_COLOR)
        outlined = alloc.size / GIB / layout.top_gib * _PLOT_PIXELS > 4
        ax.fill_between(
            x, lo, lo + alloc.size / GIB, step="post", linewidth=0.2 if outlined else 0.3,
            edgecolor="white" if outlined else color, facecolor=color,
        )  # fmt: skip


def _draw_the_rest(ax: Any, timeline: Timeline, layout: _Layout) -> None:
    """Everything not drawn on its own: one grey band on top of the drawn ones."""
    n, xs = layout.events, layout.xs
    samples = np.unique(
        np.concatenate([np.linspace(0, n, min(n + 1, _SAMPLES)).astype(int), xs[xs <= n],
                        [layout.peak]])
    )  # fmt: skip
    drawn_at = _drawn_total(layout.drawn, n)[samples]
    total_at = timeline.requested_bytes[samples]
    ax.fill_between(
        np.append(samples, n + 1), np.append(drawn_at, drawn_at[-1]) / GIB,
        np.append(total_at, total_at[-1]) / GIB, step="post", facecolor=SMALL_COLOR, linewidth=0,
    )  # fmt: skip


def _mark_peak_and_ooms(ax: Any, timeline: Timeline, layout: _Layout) -> None:
    peak = layout.peak
    ax.axvline(peak + 0.5, color="black", linestyle="--", linewidth=0.9)
    ax.annotate(
        f"peak {fmt_bytes(int(timeline.allocated_bytes[peak]))}",
        xy=(peak + 0.5, timeline.requested_bytes[peak] / GIB), xytext=(6, 6),
        textcoords="offset points", fontsize=9, fontweight="bold",
    )  # fmt: skip
    ax.set_ylim(0, layout.top_gib)
    for oom in timeline.oom_events:
        ax.axvline(oom["event"] + 1, color="red", linewidth=1.2)
        ax.annotate("OOM", xy=(oom["event"] + 1, 0.9), xycoords=("data", "axes fraction"),
                    xytext=(-4, 0), textcoords="offset points", ha="right", color="red",
                    fontsize=9, fontweight="bold")  # fmt: skip


def _finish_axes(ax: Any, title: str, layout: _Layout) -> None:
    ax.set_xlim(0, layout.events + 1)  # states 0..n; the last one is drawn one unit wide
    ax.set_xlabel("allocator events (allocations and frees) in the trace")
    ax.set_ylabel("allocated memory (GiB)")
    ax.set_title(title, loc="left", fontsize=11)
    ax.grid(axis="y", linewidth=0.4, alpha=0.5)
    ax.set_axisbelow(True)


def _legend_handles(timeline: Timeline, layout: _Layout) -> list[Any]:
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=layout.color_of_site[s], label=_legend_label(s, layout))
        for s in layout.site_rank
    ]
    if any(layout.site_of[id(a)] not in layout.color_of_site for a in layout.drawn):
        handles.append(Patch(facecolor=OTHER_SITE_COLOR, label="other call sites"))
    if len(layout.drawn) < len(timeline.allocations):
        label = f"smaller allocations (all but the {len(layout.drawn)} largest)"
        handles.append(Patch(facecolor=SMALL_COLOR, label=label))
    return handles


def _stack(drawn: list[Allocation], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Change points and, for each drawn allocation, its bottom edge between them."""
    edges = {0, n + 1}
    for a in drawn:
        edges.add(a.start + 1)
        edges.add((a.end if a.end is not None else n) + 1)
    xs = np.array(sorted(edges), dtype=np.int64)[:-1]  # left ends of the intervals
    sizes = np.array([a.size for a in drawn], dtype=np.float64)
    alive = np.zeros((len(drawn), len(xs)), dtype=bool)
    for row, a in enumerate(drawn):
        lo = np.searchsorted(xs, a.start + 1)
        hi = np.searchsorted(xs, (a.end if a.end is not None else n) + 1)
        alive[row, lo:hi] = True
    filled = alive * sizes[:, None]
    bottoms = np.cumsum(filled, axis=0) - filled  # everything older and alive below
    return xs, bottoms


def _drawn_total(drawn: list[Allocation], n: int) -> np.ndarray:
    delta = np.zeros(n + 2, dtype=np.int64)
    for a in drawn:
        delta[a.start + 1] += a.size
        delta[(a.end if a.end is not None else n) + 1] -= a.size
    return np.cumsum(delta)[: n + 1]


def _rank_sites(allocs: list[Allocation], site_of: dict[int, str], n: int) -> list[str]:
    """Sites by the most bytes they hold at any one time (so the forward's activations,
    gone by a training step's peak, still get a colour)."""
    by_site: dict[str, list[Allocation]] = {}
    for a in allocs:
        by_site.setdefault(site_of[id(a)], []).append(a)
    most = {site: int(_drawn_total(group, n).max()) for site, group in by_site.items()}
    return sorted(most, key=lambda s: -most[s])


def _legend_label(site: str, layout: _Layout) -> str:
    mine = [a for a in layout.at_peak if layout.site_of[id(a)] == site]
    if not mine:
        return site
    return f"{site}  ({fmt_bytes(sum(a.size for a in mine))}, {len(mine)}x)"


def _shade_phases(ax: Any, spans: list[tuple[str, int, int]]) -> None:
    for name, first, last in spans:
        color = PHASE_COLORS.get(name, "#999999")
        ax.axvspan(first, last, color=color, alpha=0.06, linewidth=0, zorder=0)
        ax.annotate(
            name, xy=((first + last) / 2, 1.0), xycoords=("data", "axes fraction"),
            xytext=(0, -12), textcoords="offset points", ha="center", fontsize=8, color=color,
        )  # fmt: skip


def _label_sites(ax: Any, layout: _Layout, count: int) -> None:
    """Label the call sites holding the most at the peak, pointing into their bands."""
    drawn, bottoms, xs, site_of = layout.drawn, layout.bottoms, layout.xs, layout.site_of
    at_peak, peak, n = layout.at_peak, layout.peak, layout.events
    column = int(np.searchsorted(xs, peak, side="right")) - 1
    bands: dict[str, list[tuple[float, int]]] = {}  # site -> (bottom, size) at the peak
    for row, alloc in enumerate(drawn):
        if alloc.alive_at(peak):
            bands.setdefault(site_of[id(alloc)], []).append((bottoms[row, column], alloc.size))
    totals: dict[str, list[int]] = {}
    for alloc in at_peak:
        totals.setdefault(site_of[id(alloc)], []).append(alloc.size)
    sites = [s for s in sorted(totals, key=lambda s: -sum(totals[s])) if s in bands][:count]
    positions = {site: _middle_of_bytes(bands[site]) for site in sites}
    top = ax.get_ylim()[1]
    left = peak > n * 0.5  # write on the side with more room
    placed: list[float] = []
    for site in sorted(sites, key=lambda s: positions[s]):
        y = positions[site]
        text_y = max(y, placed[-1] + top * 0.1, top * 0.06) if placed else max(y, top * 0.06)
        placed.append(text_y)
        sizes = totals[site]
        ax.annotate(
            f"{site}\n{fmt_bytes(sum(sizes))} in {len(sizes):,} allocation{'s' * (len(sizes) > 1)}",
            xy=(peak + 0.5, y), xytext=(peak + 0.5 + (-1 if left else 1) * n * 0.03, text_y),
            ha="right" if left else "left", va="center", fontsize=8,
            bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "alpha": 0.9, "linewidth": 0.4},
            arrowprops={"arrowstyle": "->", "linewidth": 0.7, "color": "black"},
        )  # fmt: skip


def _middle_of_bytes(bands: list[tuple[float, int]]) -> float:
    """Height (GiB) below which half of these bands' bytes lie: where a label points."""
    bands = sorted(bands)
    half, seen = sum(size for _, size in bands) / 2, 0
    for bottom, size in bands:
        if seen + size >= half:
            return (bottom + half - seen) / GIB
        seen += size
    return bands[-1][0] / GIB


def plot_file(
    snapshot_path: Path,
    out: Path | None = None,
    html: bool = False,
    detail: int = 2_000,
    sites: int = 10,
    title: str | None = None,
    stage: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Load a snapshot safely and draw its timeline (and optionally torch's HTML viewer).
    ``stage(what)`` says what it is doing as it goes (reading, rebuilding, drawing: seconds
    each on a large snapshot).

    The picture goes to ``out``, by default ``reports/NAME.png`` (where every command's
    pictures go; never beside the snapshot, which may sit among committed files); the
    sidecar, when there is one, names the config in the title and places the phases.
    """
    from profkit.memory.html import write_html
    from profkit.memory.snapshot import read_snapshot
    from profkit.memory.timeline import reconstruct
    from profkit.sidecar import read_sidecar, sidecar_path

    if detail < 1 or sites < 0:
        raise BadInput("--detail must be at least 1 and --sites at least 0")
    stem_path = sidecar_path(Path(snapshot_path))
    base = stem_path.with_name(stem_path.name.removesuffix(".profkit.json"))
    out = out if out is not None else REPORTS_DIR / f"{base.name}.png"
    check_image_path(out)
    for target in (out, out.with_suffix(".html")) if html else (out,):
        check_writable(target)  # before the work: "its parent is a file", not "File exists"
    say = stage or (lambda what: None)
    say(f"reading {Path(snapshot_path).name}")
    snapshot = read_snapshot(snapshot_path)
    meta = read_sidecar(snapshot_path) or {}
    say("rebuilding allocated memory at every event")
    timeline = reconstruct(snapshot)
    if title is None:
        title = f"Active memory timeline: {base.name}"
        capture = meta.get("capture") or {}
        if capture.get("device_name"):
            title += f" ({capture['device_name']})"
    say(f"drawing {out.name}")
    plot_timeline(timeline, out, title, detail, sites, phase_marks=meta.get("phase_marks") or [])
    result: dict[str, Any] = {
        "image": str(out),
        "html": None,
        "peak_allocated_bytes": int(timeline.allocated_bytes[timeline.peak_state]),
        "events": timeline.events,
    }
    if html:
        result["html"] = str(write_html(snapshot_path, snapshot, out.with_suffix(".html")))
    return result
