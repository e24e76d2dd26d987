"""A multi-rank trace is attributed once: its tables must be what attributing again gives.

The columnar engine builds the whole trace's tables and every rank's from one plan and
one attribution (:func:`profkit.analysis.engine.analyze_columns` with the trace's rank
layout). Checked here against the plain way, on the real 2-GPU fixtures: the whole-trace
tables against the same columns analysed as one trace (no layout), and each rank's tables
against that rank alone — for the export, a copy keeping only that process's rows (chosen
in plain SQL by the process bits of each activity's ``globalPid`` and each call's and
range's ``globalTid``, independently of profkit's rank code); for the per-rank torch
traces, that rank's file read alone.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from nsys_data import DATA, unpack
from synthetic import report

from profkit.analysis import engine
from profkit.analysis.report_types import KernelReport, RankedReport
from profkit.traces.load import load_columns

DDP2 = "nsys-2025.3-h200x2-small-ddp2"
TORCH = [DATA / f"torch-h200x2-small-ddp2-rank{r}.json.gz" for r in (0, 1)]
TABLES = ("phases", "ranges", "kernels", "overall", "categories")
PROCESS = "(({} >> 24) & 16777215)"  # the process bits of a globalPid / globalTid
ACTIVITIES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
              "CUPTI_ACTIVITY_KIND_MEMSET")  # fmt: skip
CALLS_AND_RANGES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")
PHASE_NAMES = "('forward', 'backward', 'optimizer')"
NAME = "coalesce(text, (SELECT value FROM StringIds WHERE id = textId))"


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(DDP2, tmp_path_factory.mktemp("ranks"))


def _copy(export: Path, folder: Path, *sql: str) -> Path:
    """A copy of the export (and its sidecar) in ``folder``, changed by ``sql``."""
    folder.mkdir()
    shutil.copy(export, folder)
    shutil.copy(DATA / f"{DDP2}.profkit.json", folder)
    copy = folder / export.name
    with sqlite3.connect(copy) as db:
        for statement in sql:
            db.execute(statement)
    return copy


def _alone(export: Path, pid: int) -> Path:
    """The export with only the rows of one process: activities by their process, calls
    and ranges by their thread's."""
    keep = [f"DELETE FROM {t} WHERE {PROCESS.format('globalPid')} != {pid}" for t in ACTIVITIES]
    keep += [f"DELETE FROM {t} WHERE {PROCESS.format('globalTid')} != {pid}"
             for t in CALLS_AND_RANGES]  # fmt: skip
    return _copy(export, export.parent / f"{export.stem}-alone{pid}", *keep)


def _last_pid(export: Path) -> int:
    with sqlite3.connect(export) as db:
        return int(db.execute(f"SELECT max({PROCESS.format('globalPid')}) "
                              "FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0])  # fmt: skip


def _same(got: KernelReport, want: KernelReport, notes: bool = True) -> None:
    for table in TABLES:
        pd.testing.assert_frame_equal(getattr(got, table), getattr(want, table), check_exact=True)
    assert got.totals == want.totals
    if notes:
        assert got.notes == want.notes
    assert got.source["phase_source"] == want.source["phase_source"]


OPTIONS = [
    {},
    {"phases": "inferred"},
    {"phase": "backward"},
    {"range": "computing softmax"},
]


def _ranked(paths: Path | list[Path], options: dict[str, str]) -> RankedReport:
    """The report of these files, checking that the activities are attributed once."""
    plans, attributions = [], []
    with pytest.MonkeyPatch.context() as patch:
        plan_of, attributed = engine.plan_of, engine.attributed
        patch.setattr(engine, "plan_of", lambda *a, **k: plans.append(1) or plan_of(*a, **k))
        patch.setattr(engine, "attributed",
                      lambda *a, **k: attributions.append(1) or attributed(*a, **k))  # fmt: skip
        ranked = report(paths, **options)
    assert len(plans) == 1 and len(attributions) <= 1
    assert isinstance(ranked, RankedReport) and len(ranked.ranks) == 2
    return ranked


def _check(export: Path, options: dict[str, str]) -> None:
    """The whole trace's tables and each rank's match the plain way."""
    ranked = _ranked(export, options)
    _same(ranked, engine.analyze_columns(load_columns(export, cache=False), **options))  # type: ignore[arg-type]
    for entry in ranked.ranks:
        _same(entry.report, report(_alone(export, entry.info["pid"]), **options))


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_nsys_export_whole_and_per_rank_tables(
    export: Path, tmp_path: Path, options: dict[str, str]
) -> None:
    _check(_copy(export, tmp_path / "copy"), options)


def _joined_thread_ids(notes: list[str], pid: int) -> list[str]:
    """Notes of one rank's file alone, its thread ids written as the joined run's
    (process bits above the thread id)."""
    return [re.sub(r"thread (\d+)", lambda m: f"thread {pid << 24 | int(m[1])}", n) for n in notes]


@pytest.mark.parametrize("options", OPTIONS[:3], ids=str)
def test_torch_traces_per_rank_tables(options: dict[str, str]) -> None:
    ranked = _ranked(TORCH, options)
    for entry, path in zip(ranked.ranks, TORCH, strict=True):
        alone = report(path, **options)
        _same(entry.report, alone, notes=False)
        if "phases" in options:  # the note names the run's autograd threads, every rank's
            # (the phase story's notes count each scope's own kernels: a rank's, the job's)
            story = ("Phases from ", "Recognized: ")
            mine = [n for n in entry.report.notes if not n.startswith(story)]
            whole = [n for n in ranked.notes if not n.startswith(story)]
            assert mine == whole and len(whole) == 1
            assert "rank 0 thread 1177 (python3), rank 1 thread 1180" in whole[0]
        else:
            assert entry.report.notes == _joined_thread_ids(alone.notes, entry.info["pid"])


def test_one_rank_annotated_the_other_inferred(export: Path, tmp_path: Path) -> None:
    """Rank 1 without its phase ranges: its phases are inferred (and numbered as its own)."""
    last = _last_pid(export)
    path = _copy(export, tmp_path / "mixed",
                 f"DELETE FROM NVTX_EVENTS WHERE {PROCESS.format('globalTid')} = {last} "
                 f"AND eventType = 59 AND {NAME} IN {PHASE_NAMES}")  # fmt: skip
    ranked = report(path)
    assert ranked.source["phase_source"] == "mixed"
    assert [e.report.source["phase_source"] for e in ranked.ranks] == ["annotated", "inferred"]  # type: ignore[attr-defined]
    _check(path, {})


def test_a_rank_with_its_ranges_in_another_domain(export: Path, tmp_path: Path) -> None:
    """A rank that would look for its phases in another NVTX domain finds them there."""
    last = _last_pid(export)
    thread = f"(SELECT globalTid FROM NVTX_EVENTS WHERE {PROCESS.format('globalTid')} = {last} LIMIT 1)"  # fmt: skip
    path = _copy(export, tmp_path / "domain",
                 f"INSERT INTO NVTX_EVENTS (start, eventType, globalTid, domainId, text) "
                 f"VALUES (0, 75, {thread}, 9, 'lib')",
                 f"UPDATE NVTX_EVENTS SET domainId = 9 WHERE eventType = 59 "
                 f"AND {PROCESS.format('globalTid')} = {last}")  # fmt: skip
    ranked = report(path)
    rank1 = ranked.ranks[1].report  # type: ignore[attr-defined]
    assert rank1.phases["phase"].tolist()[:3] == ["forward", "backward", "optimizer"]
    assert set(rank1.ranges["domain"]) == {"lib"}
    _check(path, {})
