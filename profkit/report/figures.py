"""The numbers behind the report's pictures, chosen from the rows (no drawing here).

Each function returns plain records per machine (GPU name, or ``cpu``): rows measured on
different machines are never drawn in one picture. :mod:`profkit.report.plots` draws them;
the sections print the same numbers as tables, so every bar has its figure in the text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from profkit.analysis import compare as compare_lib
from profkit.errors import BadInput
from profkit.report.collect import Row, group_by, where
from profkit.workload.config import DTYPES, RUN_FIELDS
from profkit.workload.specs import SIZES

GIB = 1024**3
MEASURES = {"forward": "forward", "forward-backward": "forward+backward", "train": "train step"}
# Config fields that may tell two bars of a speed-up picture apart (besides the size).
_LABEL_FIELDS = tuple(f for f in RUN_FIELDS if f not in ("size", "mode"))


def _size_rank(size: str) -> int:
    return list(SIZES).index(size) if size in SIZES else len(SIZES)


def _dtype_rank(dtype: str) -> int:
    return DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES)


def _mode_of(values: Sequence[Any]) -> Any:
    """The most common value (the first seen among equals)."""
    return Counter(values).most_common(1)[0][0]


@dataclass
class StepBars:
    """Training-step time per size and dtype on one machine, one context: the main sweep."""

    where: str
    ctx: int
    caption: str
    """The settings every bar shares: ``ctx 256 · batch 4 · naive attention · eager · ...``."""
    sizes: list[str]
    dtypes: list[str]
    cells: dict[tuple[str, str], Row]
    """(size, dtype) -> its bench row (``ok`` or ``oom``)."""


def step_bars(rows: Sequence[Row]) -> list[StepBars]:
    """Per machine: the train-mode eager rows of the context that covers the most sizes.

    Batch and attention are fixed at their most common values among those rows and the
    warm-up at the most steps (warm rows, not the cold first steps a warm-up study adds),
    so the bars differ only in size and dtype; the caption says which values, and which
    contexts and warm-ups the DB also holds that are not drawn.
    """
    out = []
    for machine, group in group_by(rows, where).items():
        train = [
            r
            for r in group
            if r["mode"] == "train" and not r["compile"] and r["status"] in ("ok", "oom")
        ]
        if not any(r["status"] == "ok" for r in train):
            continue
        sizes_at = group_by(train, lambda r: r["ctx"])
        ctx = max(sizes_at, key=lambda c: (len({r["size"] for r in sizes_at[c]}), -c))
        at_ctx = sizes_at[ctx]
        fixed = {f: _mode_of([r[f] for r in at_ctx]) for f in ("batch", "attention")}
        fixed["warmup"] = max(r["warmup"] for r in at_ctx)
        chosen = [r for r in at_ctx if all(r[f] == v for f, v in fixed.items())]
        cells = {(r["size"], r["dtype"]): r for r in chosen}  # latest wins
        steps = sorted({r["steps"] for r in chosen})
        caption = (
            f"ctx {ctx} · batch {fixed['batch']} · {fixed['attention']} attention · eager · "
            f"{fixed['warmup']} warm-up + {'/'.join(map(str, steps))} timed steps "
            "(mean, bars ± std of the step)"
        )
        others = [
            f"ctx {', '.join(map(str, sorted(c for c in sizes_at if c != ctx)))}"
            if len(sizes_at) > 1
            else "",
            "warm-up "
            + ", ".join(map(str, sorted({r["warmup"] for r in at_ctx} - {fixed["warmup"]})))
            if len({r["warmup"] for r in at_ctx}) > 1
            else "",
        ]
        if any(others):
            caption += f" · also in the DB, not drawn: {'; '.join(o for o in others if o)}"
        out.append(
            StepBars(
                where=machine,
                ctx=ctx,
                caption=caption,
                sizes=sorted({s for s, _ in cells}, key=_size_rank),
                dtypes=sorted({d for _, d in cells}, key=_dtype_rank),
                cells=cells,
            )
        )
    return out


@dataclass
class Speedup:
    """One bar: a config's baseline time over its variant's time (2.0: twice as fast)."""

    label: str
    measure: str
    variant: str
    baseline_ms: float
    variant_ms: float
    unstable: bool = False
    """Either time is unstable (``profkit.run.stability``): the ratio is not a finding."""

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.variant_ms


@dataclass
class SpeedupPanel:
    compared: str
    """The field compared (``dtype``, ``compile``)."""
    baseline: str
    bars: list[Speedup] = field(default_factory=list)

    @property
    def title(self) -> str:
        variants = list(dict.fromkeys(b.variant for b in self.bars))
        names = {"dtype": "autocast", "compile": "", "attention": "attention"}
        suffix = names.get(self.compared)
        what = " / ".join(variants) + (f" {suffix}" if suffix else "")
        return f"{what} vs {self.baseline}"


def speedups(
    rows: Sequence[Row], fields: Sequence[str] = ("dtype", "compile")
) -> dict[str, list[SpeedupPanel]]:
    """Per machine, one panel per compared field that has pairs: the whole-step speed-ups.

    A bar compares the time of the mode's whole step (forward for ``forward`` mode, the
    training step for ``train``) between the baseline (fp32, eager) and a variant; cells
    that did not finish (OOM, failed) get no bar.
    """
    panels: dict[str, list[SpeedupPanel]] = {}
    for machine, group in group_by(rows, where).items():
        for name in fields:
            try:
                comparison = compare_lib.compare(group, name)
            except BadInput:
                continue  # no pairs for this field on this machine
            panel = _panel(comparison)
            if panel.bars:
                panels.setdefault(machine, []).append(panel)
    return panels


def _panel(comparison: compare_lib.Comparison) -> SpeedupPanel:
    name = comparison.field
    labels = [compare_lib.label(name, v) for v in comparison.variants]
    wanted = [b for b in comparison.blocks if b.phase == _whole_phase(b.fixed["mode"])]
    varying = [f for f in _LABEL_FIELDS if f != name and len({str(b.fixed[f]) for b in wanted}) > 1]
    panel = SpeedupPanel(name, labels[0])
    for block in wanted:
        base = block.cells[0]
        for label, cell in zip(labels[1:], block.cells[1:], strict=True):
            # A time that did not survive its cell (read as empty) gets no bar either.
            if (
                base["status"] == "ok"
                and cell["status"] == "ok"
                and base["mean_ms"]
                and cell["mean_ms"]
            ):
                panel.bars.append(
                    Speedup(
                        _config_label(block.fixed, varying),
                        MEASURES.get(block.fixed["mode"], block.fixed["mode"]),
                        label,
                        base["mean_ms"],
                        cell["mean_ms"],
                        bool(base["unstable"] or cell["unstable"]),
                    )
                )
    return panel


def _whole_phase(mode: str) -> str:
    return compare_lib.MODE_PHASES.get(mode, ("step",))[-1]


def _config_label(fixed: dict[str, Any], varying: Sequence[str]) -> str:
    parts = [str(fixed["size"])]
    for name in varying:
        value = fixed[name]
        if name == "compile":
            parts.append("compiled" if value else "eager")
        elif name in ("dtype", "attention"):
            parts.append(str(value))
        else:
            parts.append(f"{name} {value}")
    return " · ".join(parts)


@dataclass
class MemorySeries:
    """Peak memory of one config at each context length it ran."""

    label: str
    points: list[tuple[int, float | None, str]]
    """(ctx, peak GiB or None, status), by context."""


@dataclass
class MemoryCurves:
    where: str
    source: str
    """``memory`` (profkit memory rows) or ``bench`` (bench rows' peak)."""
    series: list[MemorySeries]


def memory_curves(memory_rows: Sequence[Row], bench_rows: Sequence[Row]) -> list[MemoryCurves]:
    """Per machine, peak allocated GiB against context: from ``profkit memory`` rows, else
    from the bench rows' peak. Only the configs that ran at two contexts or more."""
    if memory_rows:
        source, rows = "memory", [_memory_point(r) for r in memory_rows]
    else:
        source, rows = "bench", [_bench_point(r) for r in bench_rows]
    rows = [r for r in rows if r["gib"] is not None or r["status"] == "oom"]
    out = []
    for machine, group in group_by(rows, lambda r: r["where"]).items():
        series = []
        by_config = group_by(group, lambda r: r["config"])
        for label in sorted(by_config, key=lambda k: by_config[k][0]["rank"]):
            points = {r["ctx"]: (r["ctx"], r["gib"], r["status"]) for r in by_config[label]}
            # A config measured at one context is a dot, not a curve: it says nothing here.
            if len(points) > 1:
                series.append(MemorySeries(label, [points[c] for c in sorted(points)]))
        if series:
            out.append(MemoryCurves(machine, source, series))
    return out


def _series_label(row: Row) -> str:
    parts = [row["size"], row["mode"], row["dtype"]]
    if row.get("compile"):
        parts.append("compiled")
    if row.get("attention") not in (None, "naive"):
        parts.append(str(row["attention"]))
    if row.get("batch") not in (None, 4):
        parts.append(f"batch {row['batch']}")
    return " ".join(parts)


def _point(row: Row, gib: float | None) -> dict[str, Any]:
    mode_rank = list(MEASURES).index(row["mode"]) if row["mode"] in MEASURES else 9
    return {
        "where": where(row),
        "config": _series_label(row),
        "rank": (_size_rank(row["size"]), mode_rank, _dtype_rank(row["dtype"])),
        "ctx": row["ctx"],
        "gib": gib,
        "status": row["status"],
    }


def _memory_point(row: Row) -> dict[str, Any]:
    peak = row.get("peak_allocated_bytes")
    return _point(row, peak / GIB if peak is not None else None)


def _bench_point(row: Row) -> dict[str, Any]:
    return _point(row, row.get("peak_memory_gib"))
