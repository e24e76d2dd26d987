"""One backend against another: per-phase kernel launches and GPU times side by side.

``profkit kernels A.sqlite B.json.gz --compare`` loads each trace, analyses it as usual
(:func:`profkit.analysis.side_by_side`), and hands the reports to :func:`compare_reports`,
which compares their ``phases`` tables per step (:func:`compare_phases`). Nsight Systems and
torch.profiler (CUPTI both) time the same kernels, so for the same config the phase
times should agree closely; a large gap means a phase attributed differently (or a run
that differed), which is what the check is for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit.analysis.phase_ranges import UNATTRIBUTED
from profkit.analysis.report_types import KernelReport
from profkit.errors import BadInput
from profkit.workload.names import PHASES

PHASE_ORDER = PHASES
TRAILING = (UNATTRIBUTED,)
TOTAL = "total"
NEEDED = ("phase", "kernels", "gpu_time_ms")
BACKENDS = {"nsys-sqlite": "nsys", "chrome": "torch"}


@dataclass
class SideBySide:
    """Traces compared: ``labels`` name each (its backend, numbered where two share one),
    ``table`` is :func:`compare_phases` of their phases per step, each against the first."""

    labels: list[str]
    table: pd.DataFrame
    tolerance_pct: float = 5.0

    def terminal_table(self) -> tuple[pd.DataFrame, bool]:
        """The table for a terminal, and whether it was cut: the phases busiest in any
        trace, one row for the others (their sums, compared as a phase is), then the total
        (:func:`~profkit.analysis.presentation.terminal_rows`)."""
        from profkit.analysis.presentation import fold_rest, terminal_rows

        table, ref = self.table, self.labels[0]
        each = table[table["phase"] != TOTAL]
        times = each[[f"{label} gpu_time_ms" for label in self.labels]].max(axis=1)
        keep = terminal_rows(times.to_numpy())
        if keep is None:
            return table, False
        kernels = tuple(f"{label} kernels" for label in self.labels)
        folded = fold_rest(each, keep, "phase", kernels)
        last = len(folded) - 1
        ref_ms = folded.at[last, f"{ref} gpu_time_ms"]
        for label in self.labels[1:]:
            diff = folded.at[last, f"{label} − {ref} gpu_time_ms"]
            pct = 100.0 * diff / ref_ms if ref_ms != 0 else np.nan
            folded.at[last, f"{label} vs {ref} %"] = pct
            within = bool(abs(pct) <= self.tolerance_pct or diff == 0)
            folded.at[last, f"{label} within {self.tolerance_pct:g}%"] = within
        return pd.concat([folded, table[table["phase"] == TOTAL]], ignore_index=True), True


def compare_reports(
    reports: Sequence[KernelReport], stems: Sequence[str], tolerance_pct: float = 5.0
) -> SideBySide:
    """Several traces' reports side by side, per step; each labelled by its backend (its
    ``stems`` entry where the format has no short name): short labels keep the table
    readable, numbered where two traces share one (``nsys#1``, ``nsys#2``)."""
    labels = [
        BACKENDS.get(r.source.get("format", ""), s) for r, s in zip(reports, stems, strict=True)
    ]
    labels = [
        f"{x}#{labels[:i].count(x) + 1}" if labels.count(x) > 1 else x for i, x in enumerate(labels)
    ]
    steps = [(label, per_step(r.phases)) for label, r in zip(labels, reports, strict=True)]
    return SideBySide(labels, compare_phases(steps, tolerance_pct=tolerance_pct), tolerance_pct)


def compare_phases(
    reports: Sequence[tuple[str, pd.DataFrame]], tolerance_pct: float = 5.0
) -> pd.DataFrame:
    """Side-by-side phase table of several reports, each compared with the first.

    ``reports`` is ``[(label, phases), ...]`` where ``phases`` has the columns ``phase``,
    ``kernels`` (kernel launches) and ``gpu_time_ms`` (all activities: kernels, memcpy,
    memset) — the ``phases`` table of a kernel report. The result
    has one row per phase (``forward``, ``backward``, ``optimizer``, others in order of
    appearance, ``unattributed``, then ``total``) and the columns ``LABEL kernels`` and
    ``LABEL gpu_time_ms`` per report, then for each report after the first (the reference
    REF): ``LABEL − REF gpu_time_ms``, ``LABEL vs REF %`` (the difference relative to REF;
    NaN where REF is 0) and ``LABEL within T%`` (``|%| <= tolerance_pct``, or both 0). A phase a
    report lacks counts as 0 kernels and 0 ms there: no kernel was attributed to it.
    """
    if len(reports) < 2:
        raise BadInput("comparing needs at least two traces")
    labels = _unique_labels([label for label, _ in reports])
    tables = [_check(label, df) for label, (_, df) in zip(labels, reports, strict=True)]
    phases = _phase_order(tables)
    out = pd.DataFrame({"phase": [*phases, TOTAL]})
    for label, table in zip(labels, tables, strict=True):
        summed = table.groupby("phase", sort=False)[["kernels", "gpu_time_ms"]].sum()
        summed = summed.reindex(phases, fill_value=0)
        out[f"{label} kernels"] = np.append(summed["kernels"].to_numpy(), summed["kernels"].sum())
        out[f"{label} gpu_time_ms"] = np.append(
            summed["gpu_time_ms"].to_numpy(dtype=float), summed["gpu_time_ms"].sum()
        )
    # Per-step counts can be fractional (18.8 kernels a step over five steps): keep them.
    whole = [f"{label} kernels" for label in labels if (out[f"{label} kernels"] % 1 == 0).all()]
    out = out.astype({column: "int64" for column in whole})
    ref = labels[0]
    ref_ms = out[f"{ref} gpu_time_ms"]
    for label in labels[1:]:
        diff = out[f"{label} gpu_time_ms"] - ref_ms
        pct = 100.0 * diff / ref_ms.where(ref_ms != 0)
        out[f"{label} − {ref} gpu_time_ms"] = diff
        out[f"{label} vs {ref} %"] = pct
        out[f"{label} within {tolerance_pct:g}%"] = (pct.abs() <= tolerance_pct) | (diff == 0)
    return out


def per_step(phases: pd.DataFrame) -> pd.DataFrame:
    """A phases table divided by each phase's range instances (its steps).

    Two captures of one config rarely hold the same number of steps (``profkit nsys``
    records every timed step, ``profkit torch`` one by default), so traces are compared per
    step. Rows without instances (``unattributed``) stay as they are.
    """
    steps = phases["instances"].where(phases["instances"] > 0, 1)
    out = phases.copy()
    out["kernels"] = phases["kernels"] / steps
    out["gpu_time_ms"] = phases["gpu_time_ms"] / steps
    return out


def _unique_labels(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    unique = []
    for label in labels:
        label = str(label).strip() or "trace"
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return unique


def _check(label: str, df: pd.DataFrame) -> pd.DataFrame:
    missing = [c for c in NEEDED if c not in df.columns]
    if missing:
        raise BadInput(f"{label}: the phases table lacks {', '.join(missing)}")
    return df[list(NEEDED)].astype({"phase": str})


def _phase_order(tables: list[pd.DataFrame]) -> list[str]:
    seen = list(dict.fromkeys(p for t in tables for p in t["phase"]))
    head = [p for p in PHASE_ORDER if p in seen]
    tail = [p for p in TRAILING if p in seen]
    middle = [p for p in seen if p not in head and p not in tail and p != TOTAL]
    return head + middle + tail
