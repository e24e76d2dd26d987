"""NVTX ranges of an Nsight Systems export: push/pop and start/end, with domain names.

Part of the nsys reader (:mod:`.nsys_columns`). Names come from ``text`` or ``textId`` ->
``StringIds``; domains are named by their ``NvtxDomainCreate`` events; event type ids come
from ``ENUM_NSYS_EVENT_TYPE`` where the export has it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import numpy as np
import pandas as pd

from profkit.traces.depth import nesting_depth
from profkit.traces.schema import PROCESS_MASK, PROCESS_SHIFT, RANGE_COLUMNS, conform
from profkit.traces.sqlite_scan import check_integers

NVTX_TABLE = "NVTX_EVENTS"
NVTX_COLUMNS = ("start", "end", "eventType", "globalTid")  # the ones an export always has
RANGE_EVENT_TYPES = {
    "NvtxPushPopRange": 59,
    "NvtxStartEndRange": 60,
    "NvtxtPushPopRange": 70,
    "NvtxtStartEndRange": 71,
}
DOMAIN_CREATE_EVENT = ("NvtxDomainCreate", 75)


def nvtx_rows(
    conn: sqlite3.Connection, tables: dict[str, list[str]]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Raw NVTX range rows ``(start, end, globalTid, domainId, text)`` and domain creations."""
    cols = tables.get(NVTX_TABLE)
    if not cols:
        return [], []
    types = _event_types(conn, tables)
    range_types = [types.get(name, default) for name, default in RANGE_EVENT_TYPES.items()]
    domain_create = types.get(DOMAIN_CREATE_EVENT[0], DOMAIN_CREATE_EVENT[1])
    # CAST: a name stored as a blob (or as a number) still reads as text.
    text = "CAST(coalesce(e.text, s.value) AS TEXT)" if "textId" in cols else "CAST(e.text AS TEXT)"
    join = "LEFT JOIN StringIds s ON s.id = e.textId" if "textId" in cols else ""
    domain = "ifnull(e.domainId, 0)" if "domainId" in cols else "0"
    every_type = ",".join(map(str, [*range_types, domain_create]))
    integers = ["start", "end", "globalTid", *(["domainId"] if "domainId" in cols else [])]
    check_integers(conn, NVTX_TABLE, integers, where=f"eventType IN ({every_type})")
    query = (
        f"SELECT e.start, e.end, e.globalTid, {domain}, {text} "
        f"FROM {NVTX_TABLE} e {join} WHERE e.eventType IN ({{types}})"
    )
    rows = conn.execute(query.format(types=",".join(map(str, range_types)))).fetchall()
    created = conn.execute(query.format(types=domain_create)).fetchall()
    return rows, created


def build_ranges(
    rows: list[tuple[Any, ...]],
    created: list[tuple[Any, ...]],
    trace_end: int,
    meta: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """The ranges table from :func:`nvtx_rows`' rows; ranges left open end at ``trace_end``.

    A range that ends before it starts (a damaged export) ends at its start instead; how
    many is ``meta["clamped_ranges"]``, and a warning in ``meta["warnings"]`` says so.
    """
    if not rows:
        return conform(pd.DataFrame({c: [] for c in RANGE_COLUMNS}), RANGE_COLUMNS)
    frame = pd.DataFrame(rows, columns=["start", "end", "thread", "domain_id", "name"])
    domain_names = {
        (_pid(int(tid or 0)), int(dom)): str(name or "") for _, _, tid, dom, name in created
    }
    frame["thread"] = frame["thread"].fillna(-1).astype(np.int64)
    frame["start"] = frame["start"].astype(np.int64)
    # A range still open when the capture stopped has no end: it lasts to the trace's end
    # (never a phase: it would swallow the rest of the capture).
    open_rows = frame["end"].isna().to_numpy()
    if open_rows.any() and meta is not None:
        _note_unclosed(frame[open_rows], meta)
    frame["end"] = frame["end"].fillna(max(trace_end, int(frame["start"].max()))).astype(np.int64)
    backwards = frame["end"].to_numpy() < frame["start"].to_numpy()
    if backwards.any() and meta is not None:
        meta["clamped_ranges"] = int(backwards.sum())
        meta.setdefault("warnings", []).append(
            f"{int(backwards.sum()):,} NVTX ranges end before they start (negative duration "
            "in the export); they count as ending where they start"
        )
    frame["end"] = np.maximum(frame["end"].to_numpy(), frame["start"].to_numpy())
    frame["name"] = frame["name"].fillna("(unnamed)")
    domain_ids = frame["domain_id"].fillna(0).astype(np.int64).to_numpy()
    pids = (frame["thread"].to_numpy() >> PROCESS_SHIFT) & PROCESS_MASK
    frame["domain"] = [
        "" if d == 0 else domain_names.get((p, d), f"domain {d}")
        for p, d in zip(pids.tolist(), domain_ids.tolist(), strict=True)
    ]
    thread_codes = pd.factorize(frame["thread"].to_numpy())[0].astype(np.int64)
    lane = thread_codes * (int(domain_ids.max()) + 1) + domain_ids  # (thread, domain)
    frame["depth"] = nesting_depth(lane, frame["start"].to_numpy(), frame["end"].to_numpy())
    frame = frame.sort_values(["start", "depth"], kind="stable")
    return conform(frame, RANGE_COLUMNS)


def _note_unclosed(frame: pd.DataFrame, meta: dict[str, Any]) -> None:
    """``meta["unclosed_ranges"]``: (thread, start) of each range left open, and a warning."""
    thread = frame["thread"].fillna(-1).astype(np.int64)
    meta["unclosed_ranges"] = [
        [int(t), int(s)] for t, s in zip(thread, frame["start"], strict=True)
    ]
    names = frame["name"].fillna("(unnamed)").astype(str).value_counts()
    listed = ", ".join(f"{n} ×{c}" if c > 1 else str(n) for n, c in names.head(5).items())
    meta.setdefault("warnings", []).append(
        f"{len(frame):,} NVTX ranges were still open when the capture ended ({listed}"
        f"{', ...' if len(names) > 5 else ''}): they count as ranges to its end, never as phases"
    )


def _pid(global_tid: int) -> int:
    return (global_tid >> PROCESS_SHIFT) & PROCESS_MASK


def _event_types(conn: sqlite3.Connection, tables: dict[str, list[str]]) -> dict[str, int]:
    if "ENUM_NSYS_EVENT_TYPE" not in tables:
        return {}
    return {
        str(name): int(i) for i, name in conn.execute("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE")
    }
