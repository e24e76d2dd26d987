"""Pictures of a multi-GPU trace: one step per rank as lanes, and per-rank phase bars; of
a job of many ranks, those of its slowest, a median and its fastest rank, above a heatmap
of every rank's step times and every rank's exposed NCCL time.

The lanes show, for each rank, its compute kernels and its NCCL kernels on one time
axis (the ranks share a host clock), so that the all-reduce hidden behind the backward
pass, the exposed rest, and a rank that arrives late can be seen at a glance.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profkit.analysis.job_view import lane_ranks, rank_numbers, step_matrix
from profkit.analysis.report_types import RankedReport
from profkit.errors import BadInput
from profkit.report.plots import PHASE_COLORS, SERIES_COLORS, pyplot, save_figure

if TYPE_CHECKING:
    import pandas as pd

COMPUTE_COLOR = "#4e79a7"
NCCL_COLOR = "#f28e2b"
NS_PER_MS = 1e6
GAP_COLORS = {"idle": "#e15759", "sync": "#b07aa1", "launch": "#bab0ac"}
"""The GPU-idle gaps the findings attribute, by cause (docs/FINDINGS.md)."""
GAP_LABELS = {
    "idle": "GPU idle: host launched nothing (host_idle)",
    "sync": "GPU idle: after a blocking sync (host_sync)",
    "launch": "GPU idle: launch overhead (launch_bound)",
}


def plot_ranks(report: RankedReport, out: Path, step: int | None = None) -> Path:
    """Lanes of one step (default: the middle one) above per-rank phase bars; a PNG."""
    steps = sorted(set(report.steps["step"])) if not report.steps.empty else []
    if not steps:
        raise BadInput("no steps to draw: the trace has no phase ranges (forward, ...)")
    step = steps[len(steps) // 2] if step is None else step
    if step not in steps:
        raise BadInput(f"no step {step}; steps: {', '.join(map(str, steps))}")
    if len(lane_ranks(report)) < len(report.ranks):
        return save_figure(job_figure(report, step), out)
    plt = pyplot()
    fig, (lanes, bars) = plt.subplots(
        2,
        1,
        figsize=(11, 2.5 + 1.1 * len(report.ranks)),
        height_ratios=[3, 2],
        layout="constrained",
    )
    _lanes(lanes, report, step)
    _phase_bars(bars, report)
    fig.suptitle(_names(report), fontsize=8)  # file names: a long folder would crowd them out
    return save_figure(fig, out)


def _names(report: RankedReport) -> str:
    """The traces' file names; of many, the first two and the last."""
    names = [Path(p).name for p in str(report.source.get("path", "")).split(", ")]
    if len(names) > 4:
        return f"{names[0]}, {names[1]}, ..., {names[-1]} ({len(names):,} files)"
    return ", ".join(names)


def job_figure(report: RankedReport, step: int) -> Any:
    """A report of many ranks (:func:`profkit.analysis.job_view.lane_ranks`): the lanes and
    phase bars of its slowest, a median and its fastest rank only, above a heatmap of every
    rank's step time (ranks × steps) and every rank's exposed NCCL time."""
    picked = lane_ranks(report)
    by_rank = {int(e.info["rank"]): e for e in report.ranks}
    shown = replace(report, ranks=[by_rank[r] for r in sorted(picked)])
    plt = pyplot()
    fig, (lanes, bars, heat, exposed) = plt.subplots(
        4, 1, figsize=(11, 15), height_ratios=[3, 2, 4, 2], layout="constrained"
    )
    _lanes(lanes, shown, step)
    _phase_bars(bars, shown)
    _step_heatmap(fig, heat, step_matrix(report))
    _exposed_bars(exposed, rank_numbers(report))
    said = ", ".join(
        f"rank {r} ({w})" for r, w in zip(picked, ("slowest", "median", "fastest"), strict=False)
    )
    fig.suptitle(
        f"{_names(report)}\nlanes and phases: {said} of {len(report.ranks):,} ranks, by mean step",
        fontsize=8,
    )
    return fig


def _step_heatmap(fig: Any, ax: Any, matrix: pd.DataFrame) -> None:
    image = ax.imshow(matrix.to_numpy(np.float64), aspect="auto", interpolation="nearest",
                      cmap="viridis")  # fmt: skip
    ax.set_xticks(*_ticks(list(matrix.columns)))
    ax.set_xlabel("step")
    ax.set_yticks(*_ticks(list(matrix.index)))
    ax.set_ylabel("rank")
    ax.set_title("Step time per rank and step: GPU span, first kernel start to last kernel end")
    fig.colorbar(image, ax=ax, label="ms")


def _ticks(labels: list[Any], at_most: int = 16) -> tuple[list[int], list[str]]:
    """Positions and labels of at most ``at_most`` evenly spread cells, the first and last
    among them (a thousand rank labels would be one black smear)."""
    cells = np.unique(np.linspace(0, len(labels) - 1, min(len(labels), at_most)).round())
    return [int(c) for c in cells], [str(labels[int(c)]) for c in cells]


def _exposed_bars(ax: Any, numbers: pd.DataFrame) -> None:
    ax.bar(numbers["rank"], numbers["nccl_exposed_ms"], width=1.0, color=NCCL_COLOR)
    ax.set_xlabel("rank")
    ax.set_ylabel("ms")
    ax.set_xlim(numbers["rank"].min() - 0.5, numbers["rank"].max() + 0.5)
    ax.set_title("Exposed NCCL time per rank: NCCL kernels with no compute beside them")


def _lanes(ax: object, report: RankedReport, step: int) -> None:
    frames = {e.info["rank"]: e.steps.kernels_of(step) for e in report.ranks}
    origin = min((f["start"].min() for f in frames.values() if len(f)), default=0)
    labels = []
    for row, (rank, frame) in enumerate(sorted(frames.items())):
        for offset, nccl, color in ((0.0, False, COMPUTE_COLOR), (0.4, True, NCCL_COLOR)):
            part = frame[frame["nccl"] == nccl]
            spans = [
                ((s - origin) / NS_PER_MS, (e - s) / NS_PER_MS)
                for s, e in zip(part["start"], part["end"], strict=True)
            ]
            ax.broken_barh(spans, (row + offset, 0.35), facecolors=color)  # type: ignore[attr-defined]
        labels.append((row + 0.375, f"rank {rank}"))
    gaps = step_gaps(report, step)
    for row, rank in enumerate(sorted(frames)):
        _mark_gaps(ax, row, gaps.get(rank), origin)
    _gap_legend(ax, gaps)
    ax.set_yticks([y for y, _ in labels], [text for _, text in labels])  # type: ignore[attr-defined]
    ax.invert_yaxis()  # type: ignore[attr-defined]
    ax.set_xlabel(f"ms since the step's first kernel (step {step})")  # type: ignore[attr-defined]
    ax.set_title("One step per rank: compute (blue, upper lane) and NCCL (orange, lower lane)")  # type: ignore[attr-defined]


def step_gaps(report: RankedReport, step: int) -> dict[int, pd.DataFrame]:
    """Per rank, the gaps its findings attribute (``report.gap_marks``) that end in this
    step: after the previous step's last kernel, up to this step's last kernel (an idle
    before the step's first kernel is the step's: a sleep before forward). The data the
    lanes picture marks."""
    out = {}
    for entry in report.ranks:
        rank = int(entry.info["rank"])
        gaps = report.gap_marks.get(rank)
        frame = entry.steps.kernels_of(step)
        if gaps is None or not len(frame):
            continue
        before = entry.steps.kernels_of(step - 1)
        after = int(before["end"].max()) if len(before) else -1
        mine = (gaps["end"] > after) & (gaps["start"] < int(frame["end"].max()))
        out[rank] = gaps[mine.to_numpy()].reset_index(drop=True)
    return out


def _mark_gaps(ax: object, row: int, gaps: pd.DataFrame | None, origin: float) -> None:
    """Shade one rank's attributed gaps across its two lanes, a colour a cause."""
    if gaps is None:
        return
    for cause, color in GAP_COLORS.items():
        part = gaps[gaps["cause"] == cause]
        spans = [
            ((s - origin) / NS_PER_MS, (e - s) / NS_PER_MS)
            for s, e in zip(part["start"], part["end"], strict=True)
        ]
        ax.broken_barh(spans, (row - 0.05, 0.85), facecolors=color, alpha=0.45, zorder=0)  # type: ignore[attr-defined]


def _gap_legend(ax: object, gaps: dict[int, pd.DataFrame]) -> None:
    from matplotlib.patches import Patch

    causes = {c for g in gaps.values() for c in g["cause"]}
    handles = [
        Patch(color=GAP_COLORS[c], alpha=0.45, label=GAP_LABELS[c])
        for c in GAP_COLORS
        if c in causes
    ]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # type: ignore[attr-defined]


def _phase_bars(ax: object, report: RankedReport) -> None:
    ranks = [e.info["rank"] for e in report.ranks]
    left = [0.0] * len(ranks)
    for index, entry in enumerate(report.ranks):
        phases = entry.report.phases
        for phase_index, (phase, ms) in enumerate(
            zip(phases["phase"], phases["gpu_time_ms"], strict=True)
        ):
            color = PHASE_COLORS.get(phase, SERIES_COLORS[phase_index % len(SERIES_COLORS)])
            first = index == 0
            ax.barh(index, ms, left=left[index], color=color, label=phase if first else None)  # type: ignore[attr-defined]
            left[index] += ms
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])  # type: ignore[attr-defined]
    ax.invert_yaxis()  # type: ignore[attr-defined]
    ax.set_xlabel("GPU time per phase, ms (all captured steps)")  # type: ignore[attr-defined]
    # Beside the bars, not on them: the longest bar reaches the right edge.
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # type: ignore[attr-defined]
