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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from profkit.errors import BadInput
from profkit.files import check_writable
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
    from matplotlib.patches import Patch

    n = timeline.events
    spans = phase_spans(timeline, phase_marks)
    phase_of = phase_of_events(spans)
    drawn = sorted(timeline.allocations, key=lambda a: -a.size)[:detail]
    peak = timeline.peak_state
    at_peak = timeline.live_at(peak)
    site_of = {id(a): site_label(a, phase_of) for a in [*drawn, *at_peak]}
    ranked = _rank_sites(drawn, site_of, n)
    site_rank = ranked[:sites]
    color_of_site = {s: SITE_COLORS[i % len(SITE_COLORS)] for i, s in enumerate(site_rank)}
    # Stacking order: oldest at the bottom; those older than the trace grouped by site.
    order = {site: i for i, site in enumerate(ranked)}
    drawn.sort(key=lambda a: (a.start, order[site_of[id(a)]] if a.start < 0 else 0, -a.size))

    fig, ax = plt.subplots(figsize=(13, 6.8), dpi=110)
    right = n + 1  # states 0..n; the last one is drawn one unit wide
    top_gib = max(float(timeline.requested_bytes.max()) / GIB, 1e-9) * 1.12
    xs, bottoms = _stack(drawn, n)
    for row, alloc in enumerate(drawn):
        a, b = alloc.start + 1, (alloc.end if alloc.end is not None else n) + 1
        i, j = np.searchsorted(xs, a), np.searchsorted(xs, b)
        x = np.append(xs[i:j], b)
        lo = np.append(bottoms[row, i:j], bottoms[row, j - 1]) / GIB
        # A white outline separates allocations, but would wash out bands a few pixels high.
        # (Thin bands get an edge of their own colour instead, so no seams show between them.)
        color = color_of_site.get(site_of[id(alloc)], OTHER_SITE_COLOR)
        outlined = alloc.size / GIB / top_gib * _PLOT_PIXELS > 4
        ax.fill_between(
            x, lo, lo + alloc.size / GIB, step="post", linewidth=0.2 if outlined else 0.3,
            edgecolor="white" if outlined else color, facecolor=color,
        )  # fmt: skip

    # Everything not drawn on its own: one band on top of the drawn ones.
    samples = np.unique(
        np.concatenate([np.linspace(0, n, min(n + 1, _SAMPLES)).astype(int), xs[xs <= n], [peak]])
    )
    drawn_at = _drawn_total(drawn, n)[samples]
    total_at = timeline.requested_bytes[samples]
    ax.fill_between(
        np.append(samples, right), np.append(drawn_at, drawn_at[-1]) / GIB,
        np.append(total_at, total_at[-1]) / GIB, step="post", facecolor=SMALL_COLOR, linewidth=0,
    )  # fmt: skip

    _shade_phases(ax, spans)
    peak_gib = timeline.requested_bytes[peak] / GIB
    ax.axvline(peak + 0.5, color="black", linestyle="--", linewidth=0.9)
    ax.annotate(
        f"peak {fmt_bytes(int(timeline.allocated_bytes[peak]))}",
        xy=(peak + 0.5, peak_gib), xytext=(6, 6), textcoords="offset points",
        fontsize=9, fontweight="bold",
    )  # fmt: skip
    ax.set_ylim(0, top_gib)
    _label_sites(ax, drawn, bottoms, xs, site_of, at_peak, peak, n, labels)
    for oom in timeline.oom_events:
        ax.axvline(oom["event"] + 1, color="red", linewidth=1.2)
        ax.annotate("OOM", xy=(oom["event"] + 1, 0.9), xycoords=("data", "axes fraction"),
                    xytext=(-4, 0), textcoords="offset points", ha="right", color="red",
                    fontsize=9, fontweight="bold")  # fmt: skip

    ax.set_xlim(0, right)
    ax.set_xlabel("allocator events (allocations and frees) in the trace")
    ax.set_ylabel("allocated memory (GiB)")
    ax.set_title(title, loc="left", fontsize=11)
    ax.grid(axis="y", linewidth=0.4, alpha=0.5)
    ax.set_axisbelow(True)
    handles = [Patch(facecolor=color_of_site[s], label=_legend_label(s, at_peak, site_of))
               for s in site_rank]  # fmt: skip
    if any(site_of[id(a)] not in color_of_site for a in drawn):
        handles.append(Patch(facecolor=OTHER_SITE_COLOR, label="other call sites"))
    if len(drawn) < len(timeline.allocations):
        handles.append(
            Patch(
                facecolor=SMALL_COLOR,
                label=f"smaller allocations (all but the {len(drawn)} largest)",
            )
        )
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, -0.12), ncol=2, fontsize=8,
              frameon=False, title="call site (bytes and allocations alive at the peak)",
              title_fontsize=8)  # fmt: skip
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return out


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


def _legend_label(site: str, at_peak: list[Allocation], site_of: dict[int, str]) -> str:
    mine = [a for a in at_peak if site_of[id(a)] == site]
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


def _label_sites(
    ax: Any,
    drawn: list[Allocation],
    bottoms: np.ndarray,
    xs: np.ndarray,
    site_of: dict[int, str],
    at_peak: list[Allocation],
    peak: int,
    n: int,
    count: int,
) -> None:
    """Label the call sites holding the most at the peak, pointing into their bands."""
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


def write_html(snapshot: dict[str, Any], out: Path) -> Path:
    """torch's own interactive viewer (``torch.cuda._memory_viz.trace_plot``) as one HTML file.

    The page embeds the snapshot but loads MemoryViz.js and d3 from public CDNs when it is
    opened: it needs network access then (profkit itself never touches the network).
    """
    try:
        from torch.cuda import _memory_viz
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        raise BadInput(f"--html needs torch.cuda._memory_viz: {exc}") from None
    html = _memory_viz.trace_plot(snapshot)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(html)
    except OSError as exc:
        raise BadInput(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


def plot_file(
    snapshot_path: Path,
    out: Path | None = None,
    html: bool = False,
    detail: int = 2_000,
    sites: int = 10,
    title: str | None = None,
) -> dict[str, Any]:
    """Load a snapshot safely and draw its timeline (and optionally torch's HTML viewer).

    The picture goes to ``out``, by default beside the snapshot as ``NAME.png``; the
    sidecar, when there is one, names the config in the title and places the phases.
    """
    from profkit.memory.snapshot import load_snapshot
    from profkit.memory.timeline import reconstruct
    from profkit.sidecar import read_sidecar, sidecar_path

    if detail < 1 or sites < 0:
        raise BadInput("--detail must be at least 1 and --sites at least 0")
    stem_path = sidecar_path(Path(snapshot_path))
    base = stem_path.with_name(stem_path.name.removesuffix(".profkit.json"))
    out = out if out is not None else base.with_suffix(".png")
    check_image_path(out)
    for written in (out, out.with_suffix(".html")) if html else (out,):
        check_writable(written)  # before the work: "its parent is a file", not "File exists"
    snapshot = load_snapshot(snapshot_path)
    meta = read_sidecar(snapshot_path) or {}
    timeline = reconstruct(snapshot)
    if title is None:
        title = f"Active memory timeline: {base.name}"
        capture = meta.get("capture") or {}
        if capture.get("device_name"):
            title += f" ({capture['device_name']})"
    plot_timeline(timeline, out, title, detail, sites, phase_marks=meta.get("phase_marks") or [])
    result: dict[str, Any] = {
        "image": str(out),
        "html": None,
        "peak_allocated_bytes": int(timeline.allocated_bytes[timeline.peak_state]),
        "events": timeline.events,
    }
    if html:
        result["html"] = str(write_html(snapshot, out.with_suffix(".html")))
    return result
