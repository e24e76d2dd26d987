"""Comparisons from bench rows: one config field varied, every other field held fixed.

:func:`compare` pairs the rows of a sweep (or of the results DB) that differ only in one
field — ``dtype``, ``compile``, ``warmup``, ``attention`` or ``mode`` — into blocks: one per
fixed config and phase, holding each variant's mean, std, median and first timed step and
its difference from the baseline. The baseline is the first variant in a fixed order (fp32,
eager, naive, the fewest warm-up steps, forward), never the order rows happened to run in,
so the same DB always gives the same signs. :func:`tables` shapes a comparison like the
course reports (variants side by side, Δ ms and Δ %); :func:`records` is its JSON.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from profkit.errors import BadInput
from profkit.run.stability import unstable
from profkit.workload.config import ATTENTIONS, DTYPES, MODES, RUN_FIELDS
from profkit.workload.names import BACKWARD, FORWARD, OPTIMIZER
from profkit.workload.specs import SIZES

FIELDS = ("dtype", "compile", "warmup", "attention", "mode", "nproc")
# What makes two rows the same config, the compared field aside. Device and GPU first, so
# rows from different machines sort into separate blocks and never pair up.
CONFIG = ("device", "gpu_name", *RUN_FIELDS)
PHASES = (FORWARD, f"{FORWARD}+{BACKWARD}", OPTIMIZER, "step")
"""The bench timings compared: forward alone, forward with backward, the optimizer, the step."""
# The phases worth a table per mode: a forward-only step *is* its forward, so no `step`.
MODE_PHASES = {"forward": PHASES[:1], "forward-backward": PHASES[:2], "train": PHASES}
_ORDER: dict[str, Sequence[Any]] = {
    "size": tuple(SIZES), "mode": MODES, "dtype": DTYPES, "attention": ATTENTIONS,
    "compile": (False, True),
}  # fmt: skip
_EXAMPLE = {
    "dtype": "--dtype fp32 bf16", "compile": "--compile both", "warmup": "--warmup 0 1 2 5",
    "attention": "--attention naive sdpa", "mode": "--mode forward train",
    "nproc": "--nproc 1 2",
}  # fmt: skip
_SHOWN = ("size", "ctx", "mode")  # always columns; other fixed fields only when they vary
_STATUS_CELL = {"oom": "OOM", "error": "failed"}

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Block:
    """One fixed config and one phase: a cell per variant, in variant order.

    A cell is ``{value, status, mean_ms, std_ms, median_ms, first_ms, delta_ms,
    change_pct}``; ``status`` is the row's (``ok``, ``oom``, ``error``), ``missing`` where
    no row has that variant, ``n/a`` where its mode has no such phase. Deltas are against
    the baseline cell and null unless both cells are ``ok``.
    """

    fixed: dict[str, Any]
    phase: str
    cells: list[dict[str, Any]]


@dataclass(frozen=True)
class Comparison:
    field: str
    variants: list[Any]
    """The compared values in order; the first is the baseline."""
    blocks: list[Block]
    unpaired: list[str]
    """Labels of rows left out: no other variant of their config to compare with."""


def check_field(field: str) -> str:
    if field not in FIELDS:
        raise BadInput(f"cannot compare {field!r}; choose one of: {', '.join(FIELDS)}")
    return field


def check_sweep(field: str, values: Iterable[Any]) -> None:
    """Fail before a sweep that would have nothing to compare (one value of ``field``)."""
    check_field(field)
    if len(set(values)) < 2:
        raise BadInput(
            f"--compare {field} needs two {field} values in the sweep, e.g. {_EXAMPLE[field]}"
        )


def select(rows: Sequence[Row], filters: Mapping[str, Collection[Any]]) -> list[Row]:
    """The rows whose every filtered field is among the given values (empty: any value).

    Raises :class:`BadInput` naming the filter that matched nothing, with the values the
    rows do have, so a typo reads as one.
    """
    active = {name: set(values) for name, values in filters.items() if values}
    chosen = [r for r in rows if all(r.get(name) in vals for name, vals in active.items())]
    if rows and not chosen:
        for name, wanted in active.items():
            have = {r.get(name) for r in rows}
            if not have & wanted:
                raise BadInput(
                    f"nothing to compare: no bench row has --{name} {_values(name, wanted)} "
                    f"(there are: {_values(name, have)})"
                )
        raise BadInput("nothing to compare: no bench row matches all the filters together")
    return chosen


def _values(name: str, values: Iterable[Any]) -> str:
    ordered = sorted(set(values), key=lambda v: _rank(name, v))
    return " ".join(("yes" if v else "no") if isinstance(v, bool) else str(v) for v in ordered)


def label(field: str, value: Any) -> str:
    """How a variant reads in a column header: ``bf16``, ``compiled``, ``sdpa``."""
    if field == "compile":
        return "compiled" if value else "eager"
    if field == "nproc":  # a bare 1 or 2 over a column says nothing
        return f"{value} proc" if value == 1 else f"{value} procs"
    return str(value)


def _rank(name: str, value: Any) -> tuple[int, Any]:
    order = _ORDER.get(name)
    if order is not None:
        return (list(order).index(value), 0) if value in order else (len(order), str(value))
    return (0, value) if isinstance(value, int | float) else (1, str(value))


def _latest(rows: Iterable[Row]) -> list[Row]:
    """One row per config: the latest finished one (ok or oom), else the latest error."""
    chosen: dict[Any, Row] = {}
    for row in rows:
        key = row.get("config_key") or tuple(row.get(f) for f in CONFIG)
        old = chosen.get(key)
        if old is None or row["status"] != "error" or old["status"] == "error":
            chosen[key] = row
    return list(chosen.values())


def _sort_key(fields: Sequence[str], values: Sequence[Any]) -> list[tuple[int, Any]]:
    return [_rank(field, value) for field, value in zip(fields, values, strict=True)]


def _times(row: Row, phase: str) -> list[float]:
    if phase == "forward+backward":
        forward, backward = row.get("forward_times_ms") or [], row.get("backward_times_ms") or []
        return [f + b for f, b in zip(forward, backward, strict=False)]
    return list(row.get(f"{phase}_times_ms") or [])


def _cell(value: Any, row: Row | None, phase: str) -> dict[str, Any]:
    cell: dict[str, Any] = {"value": value, "status": "missing"}
    cell.update(dict.fromkeys(("mean_ms", "std_ms", "median_ms", "first_ms"), None))
    cell["unstable"] = False
    if row is None:
        return cell
    if phase not in MODE_PHASES.get(row["mode"], ()):
        return {**cell, "status": "n/a"}
    cell["status"] = row["status"]
    times = _times(row, phase)
    if row["status"] == "ok" and times:
        # The same statistics bench stores, so single phases match the DB bit for bit.
        cell["mean_ms"] = statistics.fmean(times)
        cell["std_ms"] = statistics.stdev(times) if len(times) > 1 else 0.0
        cell["median_ms"] = statistics.median(times)
        cell["first_ms"] = times[0]
        # The config's whole-step times decide (too few, or too spread): not a finding.
        cell["unstable"] = unstable(list(row.get("step_times_ms") or times))
    return cell


def _with_deltas(cells: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    base = cells[0]["mean_ms"]
    for cell in cells:
        ok = base is not None and cell["mean_ms"] is not None and cell is not cells[0]
        cell["delta_ms"] = cell["mean_ms"] - base if ok else None
        cell["change_pct"] = 100.0 * cell["delta_ms"] / base if ok and base else None
        if field == "nproc":
            # Weak scaling: each rank keeps the one-GPU batch, so the ideal step time stays
            # the one-GPU time; efficiency = one-GPU time / N-rank time (1.0 is perfect).
            cell["efficiency"] = base / cell["mean_ms"] if ok and cell["mean_ms"] else None
    return cells


def _nothing_to_compare(field: str, rows: Sequence[Row]) -> BadInput:
    values = {r[field] for r in rows}
    if not rows:
        return BadInput("nothing to compare: no bench rows")
    if len(values) < 2:
        return BadInput(
            f"nothing to compare: every bench row has the same {field} "
            f"({_values(field, values)}); run two, e.g. profkit bench {_EXAMPLE[field]}"
        )
    return BadInput(
        f"nothing to compare: no two bench rows differ only in {field} "
        f"(its values {_values(field, values)} come with other settings that differ too)"
    )


def compare(rows: Iterable[Row], field: str) -> Comparison:
    """Pair the rows that differ only in ``field``; raise :class:`BadInput` if none do."""
    check_field(field)
    rows = _latest(rows)
    if field == "nproc":
        rows = _one_gpu_baselines(rows)
    fixed_fields = [f for f in CONFIG if f != field]
    groups: dict[tuple[Any, ...], dict[Any, Row]] = {}
    for row in rows:
        groups.setdefault(tuple(row.get(f) for f in fixed_fields), {})[row[field]] = row
    paired = {key: group for key, group in groups.items() if len(group) > 1}
    if not paired:
        raise _nothing_to_compare(field, rows)
    variants = sorted({v for g in paired.values() for v in g}, key=lambda v: _rank(field, v))
    blocks = []
    for key in sorted(paired, key=lambda k: _sort_key(fixed_fields, k)):
        group = paired[key]
        for phase in PHASES:
            cells = [_cell(v, group.get(v), phase) for v in variants]
            # A phase only one variant has (optimizer, comparing forward with train mode)
            # has nothing to compare.
            if sum(cell["status"] not in ("missing", "n/a") for cell in cells) > 1:
                fixed = dict(zip(fixed_fields, key, strict=True))
                blocks.append(Block(fixed, phase, _with_deltas(cells, field)))
    lonely = [row for group in groups.values() if len(group) == 1 for row in group.values()]
    unpaired = [str(row.get("label") or row["size"]) for row in lonely]
    return Comparison(field, variants, blocks, unpaired)


def _one_gpu_baselines(rows: list[Row]) -> list[Row]:
    """One process has no parallelism, so its row is the baseline of DDP and FSDP alike:
    a copy of it for each parallelism the multi-process rows used. Devices compare by kind
    (rows written before multi-rank rows said "cuda" said rank 0's "cuda:0")."""
    rows = [{**r, "device": str(r.get("device") or "").split(":")[0]} for r in rows]
    kinds = sorted(
        {str(r["parallel"]) for r in rows if (r.get("nproc") or 1) > 1 and r.get("parallel")}
    )
    single = [r for r in rows if (r.get("nproc") or 1) == 1]
    several = [r for r in rows if (r.get("nproc") or 1) > 1]
    return [{**r, "parallel": kind} for r in single for kind in kinds or ["ddp"]] + several


def records(comparison: Comparison) -> list[dict[str, Any]]:
    """The JSON rows: per fixed config and phase, every variant's numbers and deltas."""
    field = comparison.field
    return [
        {
            "compare": field,
            **block.fixed,
            "phase": block.phase,
            "baseline": comparison.variants[0],
            "variants": [{field: c["value"], **_without(c, "value")} for c in block.cells],
        }
        for block in comparison.blocks
    ]


def _without(cell: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in cell.items() if k != key}


def _shown_fixed(comparison: Comparison) -> list[str]:
    fixed = [f for f in CONFIG if f != comparison.field]
    varying = {f for f in fixed if len({str(b.fixed[f]) for b in comparison.blocks}) > 1}
    # Scaling says nothing without the parallelism it measured, even where there is one.
    always = {"parallel"} if comparison.field == "nproc" else set()
    return [f for f in fixed if f in _SHOWN or f in varying or f in always]


def _time_or_status(cell: Mapping[str, Any]) -> float | str | None:
    status = cell["status"]
    if status == "ok":
        return cell["mean_ms"]
    return None if status in ("missing", "n/a") else _STATUS_CELL.get(status, status)


def table(comparison: Comparison) -> pd.DataFrame:
    """Variants side by side: per fixed config and phase, each variant's mean ms, then each
    other variant's Δ ms and Δ % against the baseline. ``OOM``/``failed`` stand in for a
    time that was never measured; ``—`` (null) where the variant was not run."""
    if comparison.field == "warmup":
        return warmup_table(comparison)
    shown = _shown_fixed(comparison)
    names = [label(comparison.field, v) for v in comparison.variants]
    several = len(names) > 2
    lines = []
    for block in comparison.blocks:
        record: dict[str, Any] = {"phase": block.phase, **{f: block.fixed[f] for f in shown}}
        for name, cell in zip(names, block.cells, strict=True):
            record[f"{name} ms"] = _time_or_status(cell)
        for name, cell in zip(names[1:], block.cells[1:], strict=True):
            suffix = f" {name}" if several else ""
            record[f"Δ ms{suffix}"] = cell["delta_ms"]
            record[f"Δ %{suffix}"] = cell["change_pct"]
            if comparison.field == "nproc":
                record[f"efficiency{suffix}"] = cell["efficiency"]
        shaky = [n for n, c in zip(names, block.cells, strict=True) if c["unstable"]]
        record["stability"] = f"unstable: {', '.join(shaky)}" if shaky else None
        lines.append(record)
    frame = pd.DataFrame(lines)
    if frame["stability"].isna().all():
        frame = frame.drop(columns="stability")
    return _numeric(frame)


def warmup_table(comparison: Comparison) -> pd.DataFrame:
    """One row per warm-up count: mean ± std, Δ % against the fewest warm-up steps, and the
    first timed step next to the median — the first-step effect warm-up exists to hide."""
    shown = _shown_fixed(comparison)
    lines = []
    for block in comparison.blocks:
        for cell in block.cells:
            first, median = cell["first_ms"], cell["median_ms"]
            lines.append({
                "phase": block.phase,
                **{f: block.fixed[f] for f in shown},
                "warmup": cell["value"],
                "mean ms": _time_or_status(cell),
                "std ms": cell["std_ms"],
                "Δ %": cell["change_pct"],
                "median ms": median,
                "first ms": first,
                "first ÷ median": first / median if first is not None and median else None,
            })  # fmt: skip
    return _numeric(pd.DataFrame(lines))


def _numeric(frame: pd.DataFrame) -> pd.DataFrame:
    # Columns of floats and nulls only stay numeric (right-aligned); a column holding
    # "OOM" stays text, as in the course tables.
    for column in frame.columns:
        if frame[column].map(lambda v: v is None or isinstance(v, float)).all():
            frame[column] = frame[column].astype(float)
    return frame


def title(comparison: Comparison, phase: str) -> str:
    """A table caption: the phase, the variants compared, and where it ran."""
    where = {b.fixed.get("gpu_name") or b.fixed.get("device") for b in comparison.blocks}
    place = f" · {where.pop()}" if len(where) == 1 else ""
    if comparison.field == "warmup":
        steps = ", ".join(map(str, comparison.variants))
        return f"{phase} ms by warm-up steps ({steps}){place} · first timed step vs median"
    names = [label(comparison.field, v) for v in comparison.variants]
    return f"{phase} ms · {' vs '.join(names)}{place}"


def tables(comparison: Comparison) -> list[tuple[str, pd.DataFrame]]:
    """:func:`table` split into one titled table per phase (forward, forward+backward, ...)."""
    frame = table(comparison)
    return [
        (title(comparison, phase), _drop_empty_stability(part.drop(columns="phase")))
        for phase in PHASES
        if not (part := frame[frame["phase"] == phase]).empty
    ]


def _drop_empty_stability(part: pd.DataFrame) -> pd.DataFrame:
    if "stability" in part and part["stability"].isna().all():
        part = part.drop(columns="stability")
    return part.reset_index(drop=True)
