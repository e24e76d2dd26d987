"""What a finding is, and how severe a share of the captured time makes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

HIGH_SHARE = 0.20
"""A finding whose recoverable time is at least this share of the captured span is
``high``; at least :data:`MEDIUM_SHARE`, ``medium``; else ``low``."""
MEDIUM_SHARE = 0.05


@dataclass
class Finding:
    """One finding (docs/FINDINGS.md). ``share`` is ``recoverable_ms`` over the span it
    was measured on (the rank's captured GPU span, or the job's GPU time)."""

    kind: str
    recoverable_ms: float
    share: float
    evidence: dict[str, Any]
    advice: str
    rank: int | None = None
    phase: str | None = None
    gaps: pd.DataFrame | None = field(default=None, repr=False)
    """The GPU-idle gaps a host rule attributes (``start``, ``end``, ``launch``, ``cause``,
    ns): what the lanes picture marks; not in the JSON."""
    severity: str = field(init=False)

    def __post_init__(self) -> None:
        self.severity = (
            "high" if self.share >= HIGH_SHARE else "medium" if self.share >= MEDIUM_SHARE
            else "low"
        )  # fmt: skip

    def measured_over(self, span_ms: float) -> None:
        """Take ``share`` (and so ``severity``) over ``span_ms`` instead."""
        self.share = min(1.0, self.recoverable_ms / span_ms)
        self.__post_init__()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "recoverable_ms": round(self.recoverable_ms, 6),
            "share": round(self.share, 6),
            "rank": self.rank,
            "phase": self.phase,
            "evidence": self.evidence,
            "advice": self.advice,
        }


def ms(ns: float) -> float:
    return round(float(ns) / 1e6, 6)


def kernel_evidence(rows: pd.DataFrame, time_ms: float, total_ms: float) -> dict[str, Any]:
    """The evidence of a rule over rows of the kernel table (``name``, ``instances``,
    ``total_ms``): launches, kernels, their time and share of the GPU time, the top rows."""
    return {
        "count": int(rows["instances"].sum()),
        "kernels": len(rows),
        "time_ms": round(time_ms, 6),
        "share_of_gpu_time": round(time_ms / total_ms, 4),
        "rows": [
            {"name": r["name"], "instances": int(r["instances"]),
             "total_ms": round(float(r["total_ms"]), 6)}
            for _, r in rows.head(10).iterrows()
        ],
    }  # fmt: skip


def lacking(has: bool, notes: list[str], why: str) -> bool:
    """Whether a rule lacks what it needs (``has`` False); then ``why`` goes to the notes,
    which say each line once."""
    if not has:
        notes.append(why)
    return not has
