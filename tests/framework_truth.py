"""The truth of a framework capture's phases, computed with plain SQL and plain JSON.

The programs of examples/frameworks/ mark each phase as it really runs (NVTX start/end
ranges in the domain ``truth`` on nsys exports, ``truth:NAME`` record_function ranges in
torch.profiler traces). A kernel's phase is the mark open in its process when its launch
call started; a kernel under no mark is ``unattributed``. Nothing of profkit is used here.
"""

from __future__ import annotations

import bisect
import gzip
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

Figures = dict[str, tuple[int, int]]
"""Per phase: (kernels, summed kernel duration in ns)."""


def _phase_at(marks: list[tuple[int, int, str]], time: int) -> str:
    starts = [m[0] for m in marks]
    i = bisect.bisect_right(starts, time) - 1
    while i >= 0:  # marks do not nest; look back in case one ended early
        start, end, name = marks[i]
        if start <= time < end:
            return name
        if end <= time:
            break
        i -= 1
    return "unattributed"


def _add(figures: Figures, phase: str, duration: int) -> None:
    kernels, time = figures.get(phase, (0, 0))
    figures[phase] = (kernels + 1, time + duration)


def nsys_truth(path: Path) -> dict[int, Figures]:
    """Per process id: the truth's figures of an nsys SQLite export."""
    with sqlite3.connect(path) as db:
        domains = {
            (tid >> 24 & 0xFFFFFF, dom)
            for tid, dom, text in db.execute(
                "SELECT globalTid, domainId, text FROM NVTX_EVENTS WHERE eventType = 75"
            )
            if text == "truth"
        }
        marks: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
        for start, end, tid, dom, name in db.execute(
            "SELECT e.start, e.end, e.globalTid, e.domainId, coalesce(e.text, s.value) "
            "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE e.eventType IN (59, 60) ORDER BY e.start"
        ):
            pid = tid >> 24 & 0xFFFFFF
            if (pid, dom) in domains:
                marks[pid].append((start, end, name))
        figures: dict[int, Figures] = defaultdict(dict)
        launches = (
            "SELECT r.globalTid >> 24 & 16777215, r.start, k.end - k.start "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN {table} r "
            "ON r.correlationId = k.correlationId AND r.globalTid >> 24 = k.globalPid >> 24"
        )
        tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
            if table in tables:
                for pid, launch, duration in db.execute(launches.format(table=table)):
                    _add(figures[pid], _phase_at(marks.get(pid, []), launch), duration)
    return dict(figures)


def chrome_truth(path: Path) -> Figures:
    """The truth's figures of one torch.profiler trace (one process)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    marks = sorted(
        (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000), e["name"][len("truth:") :])
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") == "user_annotation"  # not its gpu_user_annotation twin
        and str(e.get("name", "")).startswith("truth:")
    )
    launch = {
        e["args"]["correlation"]: round(e["ts"] * 1000)
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in ("cuda_runtime", "cuda_driver")
        and "correlation" in e.get("args", {})
    }
    figures: Figures = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            at = launch.get(e["args"]["correlation"])
            phase = "unattributed" if at is None else _phase_at(marks, at)
            _add(figures, phase, round(e["dur"] * 1000))
    return figures
