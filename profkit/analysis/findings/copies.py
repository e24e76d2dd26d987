"""``pageable_copy``: host<->device copies from or to pageable host memory inside the steps.

A copy from pageable memory is staged by the driver through a pinned buffer: the host
waits for it, it cannot overlap compute, and it moves at a fraction of the link's speed;
a copy to pageable memory (``.item()``, ``.cpu()``) blocks the host until it is done. The
copies' host memory kind comes from the trace (:attr:`HostTrace.gpu_copy`: nsys'
``srcKind``/``dstKind``, Kineto's ``Memcpy HtoD (Pageable -> Device)``).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from profkit.analysis.findings.host import (
    MIN_RECOVERABLE_SHARE,
    Places,
    outermost,
    span_of,
    step_starts,
)
from profkit.analysis.findings.model import Finding, lacking, ms
from profkit.traces.host_calls import COPY_DIRECTIONS, MEM_KINDS

if TYPE_CHECKING:
    import pandas as pd

    from profkit.traces.host_calls import HostTrace

PAGEABLE = 0
"""``MEM_KINDS``' number for pageable host memory."""


def pageable_copy(
    host: HostTrace, ranges: pd.DataFrame, rank: int | None, notes: list[str], phases: set[str]
) -> list[Finding]:
    """One process's pageable copies that start on the GPU after its first step began
    (a model's weights copied in before training are not the step's).

    recoverable_ms: the copies' GPU time, what copies from pinned memory on a side stream,
    overlapped with compute, would at best hide."""
    why = (
        "finding pageable_copy needs the copies' host memory kinds (srcKind/dstKind of "
        "CUPTI_ACTIVITY_KIND_MEMCPY); this export has none"
    )
    if len(host.gpu_start) < 2 or lacking(host.copy_kinds, notes, why):
        return []
    top = outermost(ranges, phases)
    steps = step_starts(top)
    copy = host.gpu_copy.astype(np.int64)
    chosen = (copy >= 0) & (copy % 8 == PAGEABLE)
    if len(steps):
        chosen &= host.gpu_start >= steps[0]
    at = np.flatnonzero(chosen)
    if not len(at):
        return []
    span = float(span_of(host))
    took = (host.gpu_end[at] - host.gpu_start[at]).astype(np.int64)
    total = float(took.sum())
    if not span or total / span < MIN_RECOVERABLE_SHARE:
        return []
    direction = [COPY_DIRECTIONS[int(c) // 8] for c in copy[at]]
    memory = [MEM_KINDS.get(int(c) % 8, "unknown") for c in copy[at]]
    size = host.gpu_bytes[at]
    by_direction: dict[str, dict[str, float]] = {}
    for d, b, t in zip(direction, size, took, strict=True):
        entry = by_direction.setdefault(d, {"count": 0, "bytes": 0, "time_ms": 0.0})
        entry["count"] += 1
        entry["bytes"] += int(b)
        entry["time_ms"] = round(entry["time_ms"] + ms(t), 6)
    place = Places(top).inside(host.gpu_start[at])
    step_of = np.searchsorted(steps, host.gpu_start[at], side="right") - 1
    rows = [
        {"direction": direction[i], "host_memory": memory[i], "bytes": int(size[i]),
         "ms": ms(took[i]), "step": int(step_of[i]) if len(steps) else None,
         "phase": place[i]}
        for i in np.argsort(-took, kind="stable")[:10]
    ]  # fmt: skip
    common = Counter(p for p in place if p in phases).most_common(1)
    moved = int(size.sum())
    return [Finding(
        "pageable_copy", ms(total), total / span,
        {"count": len(at), "bytes": moved, "time_ms": ms(total),
         "gb_per_s": round(moved / total, 3) if total else None,
         "by_direction": by_direction, "span_ms": ms(span), "rows": rows},
        f"{len(at)} copies between the host's pageable memory and the GPU take {ms(total):.2f} "
        "ms inside the steps: copy from pinned memory (DataLoader(pin_memory=True), "
        "tensor.pin_memory()) with .to(device, non_blocking=True), and keep values on the "
        "GPU instead of .item()/.cpu() every step.",
        rank, common[0][0] if common else None,
    )]  # fmt: skip
