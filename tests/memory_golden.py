"""What ``memory summarize`` and ``memory plot`` make of a snapshot, as plain JSON facts.

``tests/data/memory-golden.json`` holds these facts for every real snapshot fixture, as
computed by profkit at commit 3160c87, before the streaming reader and the columnar
timeline (which load every trace entry as Python objects):

    git archive 3160c87 | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base python tests/memory_golden.py > tests/data/memory-golden.json

test_memory_scale.py computes them again with today's code and wants the same JSON: the
summary (every call site, not just the top 10), every state's allocated, requested and
reserved bytes, every allocation's interval, sizes and call site, and what the picture is
made of (the bands drawn, their stacking, colours, labels, axes).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("memory-*.pickle.xz"))


def digest(values: Any) -> str:
    """sha256 of numbers (as little-endian int64 or float64) or of JSON."""
    if isinstance(values, np.ndarray):
        kind = "<f8" if values.dtype.kind == "f" else "<i8"
        data = np.ascontiguousarray(values.astype(kind)).tobytes()
    else:
        data = json.dumps(values, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def _allocations(timeline: Any) -> list[Any]:
    table = timeline.allocations
    return table.take(range(len(table))) if hasattr(table, "take") else list(table)


def _row(alloc: Any, site: str) -> list[Any]:
    end = -1 if alloc.end is None else alloc.end
    return [alloc.start, end, alloc.size, alloc.block_bytes, alloc.addr, site]


def facts(path: Path) -> dict[str, Any]:
    """Everything the summary and the picture of ``path`` are made of."""
    from profkit.memory import snapshot as snapshot_module
    from profkit.memory.plot import _layout
    from profkit.memory.summary import phase_of_events, phase_spans, site_label, summarize_file
    from profkit.memory.timeline import reconstruct
    from profkit.sidecar import read_sidecar

    read = getattr(snapshot_module, "read_snapshot", None) or snapshot_module.load_snapshot
    summary = summarize_file(path, top=1000)
    summary.pop("snapshot")
    timeline = reconstruct(read(path))
    marks = (read_sidecar(path) or {}).get("phase_marks") or []
    phase_of = phase_of_events(phase_spans(timeline, marks))
    layout = _layout(timeline, 2000, 10, marks)
    return {
        "summary": summary,
        "timeline": {
            "events": timeline.events,
            "peak_state": timeline.peak_state,
            "requested_bytes": digest(timeline.requested_bytes),
            "allocated_bytes": digest(timeline.allocated_bytes),
            "reserved_bytes": digest(timeline.reserved_bytes),
            "time_us": None if timeline.time_us is None else digest(timeline.time_us),
            "allocations": len(_allocations(timeline)),
            "allocation_rows": digest(
                [_row(a, site_label(a, phase_of)) for a in _allocations(timeline)]
            ),
        },
        "layout": {
            "events": layout.events,
            "peak": layout.peak,
            "spans": [list(span) for span in layout.spans],
            "drawn": digest([_row(a, layout.site_of[id(a)]) for a in layout.drawn]),
            "at_peak": digest([_row(a, layout.site_of[id(a)]) for a in layout.at_peak]),
            "site_rank": layout.site_rank,
            "color_of_site": layout.color_of_site,
            "xs": digest(layout.xs),
            "bottoms": digest(layout.bottoms),
            "top_gib": layout.top_gib,
        },
    }


if __name__ == "__main__":
    json.dump({p.name: facts(p) for p in FIXTURES}, sys.stdout, indent=1, sort_keys=True)
    print()
