"""The tables of :func:`~profkit.analysis.streaming.analyze_columns`, from sums and sorts.

The same tables, columns and order as :mod:`profkit.analysis.tables` builds from a
per-activity frame (tests compare them), built instead from what the chunked pass added up
(:class:`~profkit.analysis.stream_sums.Sums`: a row of ``QUANTITIES`` per phase × category
and per range) and, for the per-kernel tables, from the statistics of
:mod:`.stream_stats`. :data:`CHUNK` is the activities each chunked pass takes at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.categories import CATEGORIES
from profkit.analysis.tables import (
    COUNT_COLUMNS,
    NS_PER_MS,
    count_columns,
    labelled_kernel_tables,
    phases_from_counts,
    ranges_from_counts,
)
from profkit.traces.columns import ActivityColumns
from profkit.traces.schema import KINDS

CHUNK = 1 << 17  # activities per analysis chunk: ~15 MB of temporaries, a few in flight


def counts(sums: np.ndarray, rows: np.ndarray | slice = slice(None)) -> dict[str, np.ndarray]:
    """``activity_counts``' dict (:mod:`.tables`) from rows of QUANTITIES sums.

    ``graphs`` is there only where some graph was counted, as there.
    """
    picked = sums[rows]
    out: dict[str, np.ndarray] = {}
    for code, kind in enumerate(KINDS):
        if kind != "graph" or sums[:, code].any():
            out[COUNT_COLUMNS[kind]] = picked[:, code].astype(np.int64)
    out["kernel_ns"] = picked[:, len(KINDS)].astype(np.float64)
    out["gpu_ns"] = picked[:, len(KINDS) + 1].astype(np.float64)
    return out


def totals_of(sums: np.ndarray) -> dict[str, Any]:
    """The report's ``totals``: every count, kernel and GPU time (ms)."""
    found = counts(sums.sum(axis=0, keepdims=True))
    totals: dict[str, Any] = {c: int(found[c][0]) for c in COUNT_COLUMNS.values() if c in found}
    totals["kernel_time_ms"] = float(found["kernel_ns"][0]) / NS_PER_MS
    totals["gpu_time_ms"] = float(found["gpu_ns"][0]) / NS_PER_MS
    return totals


def phase_table(
    by_phase: np.ndarray,
    phase_names: list[str],
    spans: tuple[pd.Series, pd.Series],
    sidecar: dict[str, Any],
    filtered: bool,
) -> pd.DataFrame:
    """:func:`.tables.phase_table` from per-phase sums; ``spans``: per phase name, its
    instances and wall ns."""
    found = counts(by_phase)
    instances, cpu_ns = spans
    active = by_phase[:, : len(KINDS)].sum(axis=1) > 0
    return phases_from_counts(phase_names, found, instances, cpu_ns, active, sidecar, filtered)


def range_spans(phase_ranges: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per phase name: how many of ``phase_ranges`` it has, and their summed wall ns."""
    wall = (phase_ranges["end"] - phase_ranges["start"]).groupby(phase_ranges["name"]).sum()
    return phase_ranges.groupby("name").size(), wall


def range_table(
    by_range: np.ndarray,
    ranges: pd.DataFrame,
    labels: np.ndarray,
    config: dict[str, Any] | None,
    filtered: str | None,
) -> pd.DataFrame:
    """:func:`.tables.range_table` from per-range sums."""
    found = counts(by_range)
    columns = {c: found[c] for c in found if c not in ("kernel_ns", "gpu_ns")}
    columns["kernel_ns"] = by_range[:, len(KINDS)]
    columns["gpu_ns"] = by_range[:, len(KINDS) + 1]
    return ranges_from_counts(columns, ranges, labels, config, filtered)


def category_table(by_phase_category: np.ndarray, phase_names: list[str]) -> pd.DataFrame:
    """:func:`.tables.category_table` from per (phase, category) sums."""
    n_categories = len(CATEGORIES)
    present = np.flatnonzero(by_phase_category[:, : len(KINDS)].sum(axis=1))
    phase, category = present // n_categories, present % n_categories
    found = counts(by_phase_category)
    gpu_ns = found["gpu_ns"][present]
    phase_total = np.bincount(phase, weights=gpu_ns, minlength=len(phase_names))
    columns = count_columns(found, present)
    del columns["kernel_time_ms"]
    table = pd.DataFrame(
        {
            "phase": np.array(phase_names, dtype=object)[phase],
            "category": np.array(CATEGORIES, dtype=object)[category],
            **columns,
            "share": gpu_ns / np.where(phase_total[phase] > 0, phase_total[phase], np.nan),
            "order": phase,
        }
    )
    table = table.sort_values(["order", "gpu_time_ms"], ascending=[True, False], kind="stable")
    return table.drop(columns=["order"]).reset_index(drop=True)


def kernel_tables(
    stats: tuple[pd.DataFrame, pd.DataFrame],
    cols: ActivityColumns,
    categories: np.ndarray,
    phase_names: list[str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`.tables.kernel_tables` from :func:`kernel_stats`' tables."""
    names = np.array(cols.names, dtype=object)
    kinds = np.array(cols.kinds, dtype=object)
    per_phase, overall = (table.copy() for table in stats)
    labels = np.array(phase_names, dtype=object)
    category_names = np.array(CATEGORIES, dtype=object)[categories]
    return labelled_kernel_tables(per_phase, overall, names, category_names, kinds, labels)
