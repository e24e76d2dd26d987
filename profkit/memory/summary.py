"""What a snapshot says: the peak, when it happened, and which code holds the memory then.

:func:`summarize` turns a loaded snapshot (plus, when known, the capture's sidecar: the
workload config, the allocator's own peak counters, phase marks) into the plain dict of
``profkit memory summarize --format json``; :func:`summary_tables` makes its tables.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profkit.errors import BadInput
from profkit.memory.snapshot import read_snapshot
from profkit.memory.timeline import Allocation, Timeline, reconstruct
from profkit.memory.trace_columns import SnapshotColumns
from profkit.sidecar import read_sidecar

GIB = 1024**3
MIB = 1024**2
# Frames inside torch, the standard library or synthetic modules are not "call sites": the
# line a user wants is the first one of their own code on the way down.
_LIBRARY_FRAME = re.compile(
    r"(^|[/\\])torch[/\\]|[/\\]lib[/\\]python3[.\d]*[/\\](?!site-packages|dist-packages)|^<"
)
NO_STACK = "(no Python stack)"
BEFORE_TRACE = "(no stack; allocated before the trace)"


def short_path(filename: str) -> str:
    """The last two components of a path: ``profkit/workload/model.py``."""
    parts = re.split(r"[/\\]", filename)
    return "/".join(parts[-2:])


def call_site(frames: Sequence[dict[str, Any]]) -> str | None:
    """``file:line function`` of the innermost frame outside torch and the stdlib.

    Falls back to the innermost Python frame, then the innermost frame of any kind;
    None when there are no frames.
    """
    if not frames:
        return None
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    own = [f for f in python if not _LIBRARY_FRAME.search(str(f["filename"]))]
    frame = (own or python or list(frames))[0]
    return f"{short_path(str(frame.get('filename', '?')))}:{frame.get('line', '?')} {frame.get('name', '?')}"


def site_label(alloc: Allocation, phase_of: dict[int, str]) -> str:
    """The call site an allocation is grouped under, with a stand-in when it has no stack."""
    site = call_site(alloc.frames)
    if site is not None:
        return site if alloc.start >= 0 or alloc.end is None else f"{site} (freed here)"
    if alloc.start < 0:
        return BEFORE_TRACE
    phase = phase_of.get(alloc.start)
    # Autograd runs the backward on its own C++ threads, which have no Python stack.
    return f"{NO_STACK} in {phase}" if phase else NO_STACK


def group_by_site(
    allocations: Sequence[Allocation], phase_of: dict[int, str] | None = None
) -> list[dict[str, Any]]:
    """Allocations grouped by call site, largest total first."""
    groups: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"size_bytes": 0, "block_bytes": 0, "count": 0, "largest_bytes": 0}
    )
    for alloc in allocations:
        group = groups[site_label(alloc, phase_of or {})]
        group["size_bytes"] += alloc.size
        group["block_bytes"] += alloc.block_bytes
        group["count"] += 1
        group["largest_bytes"] = max(group["largest_bytes"], alloc.size)
    rows = [{"site": site, **values} for site, values in groups.items()]
    return sorted(rows, key=lambda r: (-r["size_bytes"], r["site"]))


def phase_spans(timeline: Timeline, marks: Sequence[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """``(phase, first_state, last_state)`` for each recorded phase, placed by time.

    The capture records when each phase ended, on the allocator's clock (wall-clock
    microseconds); phases without a mark inside the trace are dropped.
    """
    if timeline.time_us is None or timeline.events == 0 or not marks:
        return []
    times = timeline.time_us
    spans = []
    first = 0
    for mark in marks:
        t = mark.get("time_us")
        if t is None or not times[0] <= t <= times[-1] + 1_000_000:
            continue
        last = int(np.searchsorted(times, t, side="right"))  # events before the mark
        if last > first:
            spans.append((str(mark["phase"]), first, last))
        first = last
    return spans


def phase_of_events(spans: list[tuple[str, int, int]]) -> dict[int, str]:
    """Event index -> the phase it happened in (see :func:`phase_spans`)."""
    # Event index i leads to state i + 1; a span covers states (first, last].
    return {state - 1: name for name, first, last in spans for state in range(first + 1, last + 1)}


def residual_stream_bytes(config: dict[str, Any]) -> int | None:
    """batch x ctx x d_model x 4 bytes: one residual-stream activation.

    The residual stream stays fp32 under bf16/fp16 autocast too: the blocks add their
    autocast outputs to the fp32 embedding output, which promotes the sum to fp32.
    """
    from profkit.workload.specs import SIZES

    spec = SIZES.get(str(config.get("size")))
    if spec is None or "ctx" not in config:
        return None
    return int(config.get("batch", 4)) * int(config["ctx"]) * spec.d_model * 4


def summarize(
    snapshot: SnapshotColumns | dict[str, Any],
    top: int = 10,
    device: int | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The peak and what holds it; the ``memory summarize`` JSON contract plus extras."""
    if top < 1:
        raise BadInput(f"--top must be at least 1, got {top}")
    timeline = reconstruct(snapshot, device)
    meta = meta or {}
    spans = phase_spans(timeline, meta.get("phase_marks") or [])
    peak = timeline.peak_state
    live = timeline.live_at(peak)
    sites = group_by_site(live, phase_of_events(spans))
    peak_bytes = int(timeline.allocated_bytes[peak])
    config = meta.get("config") or {}
    capture = meta.get("capture") or {}
    summary: dict[str, Any] = {
        "peak_allocated_bytes": peak_bytes,
        "allocated_at_start_bytes": int(timeline.allocated_bytes[0]),
        "reserved_bytes": int(timeline.reserved_bytes[-1]),
        "top_allocations": [
            {"size_bytes": r["size_bytes"], "count": r["count"], "site": r["site"]}
            | {"block_bytes": r["block_bytes"], "largest_bytes": r["largest_bytes"]}
            for r in sites[:top]
        ],
        "peak_requested_bytes": int(timeline.requested_bytes.max()),
        "peak_event_index": peak - 1 if peak > 0 else None,
        "peak_time_ms": timeline.state_time_ms(peak) if peak > 0 else None,
        "peak_phase": next((n for n, a, b in spans if a < peak <= b), None),
        "allocated_at_end_bytes": int(timeline.allocated_bytes[-1]),
        "peak_reserved_bytes": int(timeline.reserved_bytes.max()),
        "live_allocations_at_peak": len(live),
        "events": timeline.events,
        "trace_ms": timeline.state_time_ms(timeline.events),
        "device": timeline.device,
        "oom_events": [
            {
                "event": o["event"],
                "size_bytes": o.get("size"),
                "device_free_bytes": o.get("device_free"),
            }
            for o in timeline.oom_events
        ],
        "inconsistent_events": timeline.inconsistent_events,
        "residual_stream_bytes": residual_stream_bytes(config) if config else None,
        "config": config or None,
        "capture": capture or None,
    }
    return summary


def summarize_file(path: Path, top: int = 10, device: int | None = None) -> dict[str, Any]:
    """Read ``path`` safely (its trace as columns), read its sidecar if any, summarize it."""
    snapshot = read_snapshot(path)
    summary = summarize(snapshot, top, device, read_sidecar(path))
    summary["snapshot"] = str(path)
    return summary


def fmt_bytes(value: int | float | None) -> str:
    """``12.34 GiB`` / ``56.7 MiB`` / ``890 B`` (binary units)."""
    if value is None:
        return "—"
    if abs(value) >= GIB:
        return f"{value / GIB:,.2f} GiB"
    if abs(value) >= MIB:
        return f"{value / MIB:,.1f} MiB"
    if abs(value) >= 1024:
        return f"{value / 1024:,.1f} KiB"
    return f"{int(value):,} B"


def summary_tables(summary: dict[str, Any]) -> list[tuple[str, pd.DataFrame]]:
    """The overview (metric, value) and the call-site table, for rendering."""
    return [
        ("Memory snapshot", pd.DataFrame(_overview_rows(summary), columns=["metric", "value"])),
        ("Largest live allocations at the peak, by call site", _sites_table(summary)),
    ]


def _peak_at(summary: dict[str, Any]) -> str:
    if summary["peak_event_index"] is None:
        return "before the first event"
    when = f"event {summary['peak_event_index']:,} of {summary['events']:,}"
    if summary["peak_time_ms"] is not None:
        when += f", {summary['peak_time_ms']:,.1f} ms into the trace"
    if summary["peak_phase"]:
        when += f", in {summary['peak_phase']}"
    return when


def _overview_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    peak = summary["peak_allocated_bytes"]
    rows: list[tuple[str, str]] = [
        ("peak allocated", f"{fmt_bytes(peak)} ({peak:,} B)"),
        ("peak requested (memory_viz's peak)", fmt_bytes(summary["peak_requested_bytes"])),
        ("peak at", _peak_at(summary)),
        ("allocated at start of trace", fmt_bytes(summary["allocated_at_start_bytes"])),
        ("allocated at dump", fmt_bytes(summary["allocated_at_end_bytes"])),
        ("reserved at dump", fmt_bytes(summary["reserved_bytes"])),
        ("peak reserved in trace", fmt_bytes(summary["peak_reserved_bytes"])),
        ("live allocations at peak", f"{summary['live_allocations_at_peak']:,}"),
    ]
    recorded = (summary.get("capture") or {}).get("max_memory_allocated_bytes")
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        diff = (peak - recorded) / recorded * 100 if recorded else 0.0
        rows.append(
            (
                "max_memory_allocated at capture",
                f"{fmt_bytes(recorded)} ({diff:+.2f}% vs reconstructed)",
            )
        )
    if summary.get("residual_stream_bytes"):
        cfg = summary["config"]
        d_model = summary["residual_stream_bytes"] // (
            int(cfg.get("batch", 4)) * int(cfg["ctx"]) * 4
        )
        rows.append(
            (
                "one residual-stream activation",
                f"{fmt_bytes(summary['residual_stream_bytes'])} (batch {cfg.get('batch', 4)} "
                f"x ctx {cfg['ctx']} x d_model {d_model} x 4 B, fp32)",
            )
        )
    for oom in summary["oom_events"]:
        rows.append(
            (
                "OOM",
                f"event {oom['event']:,}: asked {fmt_bytes(oom['size_bytes'])}, "
                f"{fmt_bytes(oom['device_free_bytes'])} free on the device",
            )
        )
    if summary["inconsistent_events"]:
        rows.append(("inconsistent trace events", f"{summary['inconsistent_events']:,}"))
    return rows


def _sites_table(summary: dict[str, Any]) -> pd.DataFrame:
    peak = summary["peak_allocated_bytes"]
    return pd.DataFrame(
        [
            {
                "site": r["site"],
                "allocations": r["count"],
                "MiB": r["size_bytes"] / MIB,
                "largest MiB": r["largest_bytes"] / MIB,
                "% of peak": r["size_bytes"] / peak * 100 if peak else None,
            }
            for r in summary["top_allocations"]
        ],
        columns=["site", "allocations", "MiB", "largest MiB", "% of peak"],
    )
