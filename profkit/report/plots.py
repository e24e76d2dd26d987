"""The report's pictures, drawn with matplotlib into PNG files (never a window).

Each function draws one prepared record from :mod:`profkit.report.figures` and returns
the path it wrote. Every picture names the machine it was measured on and its units.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from profkit.files import written
from profkit.memory.plot import PHASE_COLORS
from profkit.report.figures import MemoryCurves, SpeedupPanel, StepBars

SERIES_COLORS = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6",
]  # fmt: skip
OOM_COLOR = "#d62728"
DPI = 120


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: Path) -> Path:
    plt = pyplot()
    try:
        with written(out) as temporary:
            fig.savefig(temporary, dpi=DPI, bbox_inches="tight", format=out.suffix[1:] or None)
    finally:
        plt.close(fig)
    return out


def _ms(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}" if value >= 10 else f"{value:.2f}"


def step_time(bars: StepBars, out: Path) -> Path:
    """Stacked bars: forward, backward and optimizer ms of one training step, per size,
    the dtypes side by side; the step's total above each bar, ``OOM`` where it ran out."""
    plt = pyplot()
    n_dtypes = len(bars.dtypes)
    width = 0.8 / n_dtypes
    fig, ax = plt.subplots(
        figsize=(max(6.5, 1.5 + 0.8 * len(bars.sizes) * n_dtypes), 5.2), layout="constrained"
    )
    positions, labels = [], []
    tallest = max(
        (
            r["step_ms"] + (r.get("step_ms_std") or 0.0)
            for r in bars.cells.values()
            if r["status"] == "ok"
        ),
        default=1.0,
    )
    for i, size in enumerate(bars.sizes):
        for j, dtype in enumerate(bars.dtypes):
            x = i + (j - (n_dtypes - 1) / 2) * width
            row = bars.cells.get((size, dtype))
            if row is None:
                continue
            positions.append(x)
            labels.append(dtype)
            if row["status"] != "ok":
                ax.text(x, tallest * 0.02, "OOM", ha="center", va="bottom", rotation=90,
                        color=OOM_COLOR, fontsize=9, fontweight="bold")  # fmt: skip
                continue
            bottom = 0.0
            for phase, color in PHASE_COLORS.items():
                value = row.get(f"{phase}_ms") or 0.0
                ax.bar(x, value, width * 0.92, bottom=bottom, color=color,
                       label=phase if (i, j) == (0, 0) else None)  # fmt: skip
                bottom += value
            spread = row.get("step_ms_std") or 0.0  # the std is known: show it
            if spread:
                ax.errorbar(x, bottom, yerr=spread, fmt="none", ecolor="black",
                            elinewidth=0.8, capsize=3)  # fmt: skip
            ax.text(x, bottom + spread, _ms(row["step_ms"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(positions, labels, minor=True, fontsize=8)
    ax.set_xticks(range(len(bars.sizes)), bars.sizes, fontsize=10, fontweight="bold")
    ax.tick_params(axis="x", which="major", pad=16, length=0)
    ax.tick_params(axis="x", which="minor", length=0)
    _min_span(ax, len(bars.sizes))
    ax.set_ylim(0, tallest * 1.12)
    ax.set_ylabel("time per training step (ms)")
    ax.set_xlabel("model size and dtype")
    _titles(fig, ax, f"Training step time by phase · {bars.where}", bars.caption)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], loc="upper left", frameon=False, fontsize=9)
    _grid(ax)
    return save_figure(fig, out)


def speedups(where: str, panels: Sequence[SpeedupPanel], out: Path) -> Path:
    """One panel per comparison: baseline ms ÷ variant ms per config, grouped by what was
    timed (forward pass, training step); 1× is drawn as the line of no change."""
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6.2 * len(panels), 4.8), squeeze=False, layout="constrained"
    )
    for ax, panel in zip(axes[0], panels, strict=True):
        _speedup_panel(ax, panel)
    fig.suptitle(f"Speed-ups · {where}", x=0.01, ha="left", fontsize=12, fontweight="bold")
    return save_figure(fig, out)


def _speedup_panel(ax: Any, panel: SpeedupPanel) -> None:
    configs = list(dict.fromkeys(b.label for b in panel.bars))
    series = list(dict.fromkeys((b.measure, b.variant) for b in panel.bars))
    several_variants = len({v for _, v in series}) > 1
    width = 0.8 / len(series)
    top = max(b.speedup for b in panel.bars)
    for k, (measure, variant) in enumerate(series):
        name = f"{variant} {measure}" if several_variants else measure
        xs, ys, shaky = [], [], []
        for i, config in enumerate(configs):
            for bar in panel.bars:
                if (bar.label, bar.measure, bar.variant) == (config, measure, variant):
                    xs.append(i + (k - (len(series) - 1) / 2) * width)
                    ys.append(bar.speedup)
                    shaky.append(bar.unstable)
        drawn = ax.bar(
            xs, ys, width * 0.92, label=name, color=SERIES_COLORS[k % len(SERIES_COLORS)]
        )
        for patch, unstable in zip(drawn, shaky, strict=True):
            if unstable:  # not a finding: drawn hollow, labelled as such
                patch.set_alpha(0.35)
                patch.set_hatch("//")
        for x, y, unstable in zip(xs, ys, shaky, strict=True):
            text = f"{y:.2f}× unstable" if unstable else f"{y:.2f}×"
            ax.annotate(text, (x, y), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8,
                        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"})  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=0.9, linestyle="--")
    ax.set_xticks(range(len(configs)), configs, fontsize=9)
    _min_span(ax, len(configs))
    ax.set_ylim(0, max(top, 1.0) * 1.18)
    ax.set_ylabel(f"speed-up over {panel.baseline} (×)")
    ax.set_title(
        f"{panel.title}\nbaseline ms ÷ variant ms (mean of the timed steps); above 1× is faster",
        fontsize=9,
        loc="left",
    )
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    _grid(ax)


def peak_memory(curves: MemoryCurves, out: Path) -> Path:
    """Peak allocated GiB against context length, a line per config; OOM marked with ×."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    contexts = sorted({ctx for s in curves.series for ctx, _, _ in s.points})
    top = max((g for s in curves.series for _, g, _ in s.points if g is not None), default=1.0)
    marked_oom = False
    for k, series in enumerate(curves.series):
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        ok = [(c, g) for c, g, status in series.points if status == "ok" and g is not None]
        if ok:
            ax.plot(*zip(*ok, strict=True), marker="o", color=color, label=series.label)
        for ctx, gib, status in series.points:
            if status != "ok":
                y = gib if gib is not None else top
                if ok:  # where it was heading: from the last context that fitted
                    ax.plot([ok[-1][0], ctx], [ok[-1][1], y], linestyle=":", color=color)
                ax.scatter([ctx], [y], marker="x", s=70, color=OOM_COLOR, zorder=3,
                           label=None if marked_oom else "out of memory (peak before it)")  # fmt: skip
                ax.annotate(f"OOM ({series.label})", (ctx, y), xytext=(-6, 6),
                            textcoords="offset points", ha="right", fontsize=8, color=OOM_COLOR)  # fmt: skip
                marked_oom = True
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.minorticks_off()
    ax.set_ylim(0, top * 1.15)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("peak allocated memory (GiB = 1024³ B)")
    how = (
        "torch.cuda.max_memory_allocated over the recorded step (profkit memory)"
        if curves.source == "memory"
        else "torch.cuda.max_memory_allocated over the timed steps (profkit bench)"
    )
    _titles(fig, ax, f"Peak memory vs context · {curves.where}", how)
    ax.legend(loc="upper left", frameon=False, fontsize=8)
    _grid(ax)
    return save_figure(fig, out)


def timeline(snapshot: Path, out: Path) -> dict[str, Any]:
    """The active-memory timeline of a snapshot (``profkit memory plot``) into ``out``."""
    from profkit.memory.plot import plot_file

    return plot_file(snapshot, out)


def _titles(fig: Any, ax: Any, title: str, subtitle: str) -> None:
    fig.suptitle(title, x=0.01, ha="left", fontsize=12, fontweight="bold")
    ax.set_title(subtitle, loc="left", fontsize=9, color="#444444")


def _min_span(ax: Any, groups: int, at_least: int = 3) -> None:
    """Keep one or two groups from stretching into bars as wide as the picture."""
    span = max(groups, at_least)
    middle = (groups - 1) / 2
    ax.set_xlim(middle - span / 2, middle + span / 2)


def _grid(ax: Any) -> None:
    ax.grid(axis="y", linewidth=0.4, alpha=0.5)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
