"""Property-based fuzzing: real fixtures, damaged, never end in a traceback.

Hypothesis damages the committed fixtures the way a disk, a copy or another tool would:
cells of the wrong type, missing tables, columns and keys, huge and non-finite numbers,
truncation, broken sidecars. Whatever it does, ``kernels``, ``diff``, ``memory summarize``,
``memory plot``, ``compare`` and ``report`` must exit 0, or exit 2 with exactly one
``error:`` line on stderr. Examples are derandomized and few (the CI machine has 2 cores):
the whole file runs in well under a minute. ``PROFKIT_FUZZ_EXAMPLES=N`` searches deeper.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import lzma
import os
import pickle
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from profkit.cli import app
from profkit.memory.snapshot import load_snapshot

DATA = Path(__file__).parent / "data"
PROBE = DATA / "nsys-2025.3-probe.sqlite"
CHROME = DATA / "torch-small-ctx128-forward.json.gz"
SNAPSHOT = DATA / "memory-tiny-ctx64-forward-fp32.pickle.xz"
RESULTS = DATA / "results-h100.db"
runner = CliRunner()


def fuzz_settings(examples: int) -> Any:
    """CI: a fixed, small budget. ``PROFKIT_FUZZ_EXAMPLES=500`` runs a deeper, random search."""
    deep = int(os.environ.get("PROFKIT_FUZZ_EXAMPLES", "0"))
    return settings(
        max_examples=deep or examples,
        derandomize=not deep,  # the same examples on every CI run: a failure reproduces
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def check_clean(*args: str | Path) -> Any:
    """Run profkit; assert exit 0, or exit 2 with one ``error:`` line and no traceback."""
    result = runner.invoke(app, [str(a) for a in args])
    shown = f"{args}\nexit {result.exit_code}\nstderr: {result.stderr!r}\n{result.exception!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), shown
    assert result.exit_code in (0, 2), shown
    assert "Traceback" not in result.stderr + result.stdout, shown
    if result.exit_code == 2:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), shown
    return result


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="profkit-fuzz-") as tmp:
        yield Path(tmp)


# Values a damaged file may hold where a number, a name or a list belongs.
HUGE = [2**63 - 1, -(2**63), 2**64 - 1, 2**70, 1e300, -1e300]
NON_FINITE = [float("nan"), float("inf"), float("-inf")]
ODD_NUMBERS = st.sampled_from([*HUGE, *NON_FINITE, -1, 0, 1.5])
ODD_TEXT = st.sampled_from(["", "abc", "nan", "inf", "1e400", "-5", "\x00", "é" * 3])
ODD_BLOBS = st.sampled_from([b"", b"\xff\xfe\xfa", b"abc", b"\x00" * 8])
CELL = st.one_of(ODD_NUMBERS, ODD_TEXT, ODD_BLOBS, st.none(), st.integers(-(2**63), 2**63 - 1))
JSON_VALUE = st.one_of(
    ODD_NUMBERS.filter(lambda v: not isinstance(v, float) or abs(v) < 1e308),
    ODD_TEXT,
    st.none(),
    st.booleans(),
    st.just([1, "a"]),
    st.just({"x": 1}),
    st.just(float("nan")),
)
BROKEN_SIDECARS = st.sampled_from(
    [
        '{"config": {"ctx": "abc"}}',
        '{"config": [1, 2]}',
        '{"config": {"size": "small", "ctx": 128, "batch": 1e400}}',
        '{"result": {"steps": [{"forward_ms": "x"}]}}',
        '{"phase_marks": [{"phase": 1, "time_us": "abc"}]}',
        '{"capture": {"max_memory_allocated_bytes": "lots"}}',
        "{ not json",
        "[]",
        '{"config": {"size": "small", "ctx": 128, "batch": 4, "mode": "train"}}',  # fine
    ]
)


def truncate(path: Path, fraction: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


# --- nsys SQLite exports -------------------------------------------------------------------

with sqlite3.connect(PROBE) as _db:
    NSYS_COLUMNS = {
        table: [r[1] for r in _db.execute(f'PRAGMA table_info("{table}")')]
        for (table,) in _db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
NSYS_TABLES = [
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS", "StringIds", "ThreadNames",
]  # fmt: skip


@st.composite
def nsys_damage(draw: st.DrawFn) -> tuple[str, ...] | tuple[Any, ...]:
    table = draw(st.sampled_from(NSYS_TABLES))
    kind = draw(st.sampled_from(["cell", "cell", "cell", "column", "table", "negative"]))
    column = draw(st.sampled_from(NSYS_COLUMNS[table]))
    if kind == "cell":
        return ("cell", table, column, draw(CELL), draw(st.booleans()))
    return (kind, table, column)


def damage_export(path: Path, damages: list[tuple[Any, ...]]) -> None:
    with sqlite3.connect(path) as db:
        for kind, table, column, *rest in damages:
            with contextlib.suppress(
                sqlite3.Error, OverflowError
            ):  # a table an earlier damage dropped
                if kind == "cell":
                    value, every_row = rest
                    where = "" if every_row else f'WHERE rowid = (SELECT min(rowid) FROM "{table}")'
                    db.execute(f'UPDATE "{table}" SET "{column}" = ? {where}', (value,))
                elif kind == "column":
                    db.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
                elif kind == "table":
                    db.execute(f'DROP TABLE "{table}"')
                elif kind == "negative" and "start" in NSYS_COLUMNS[table]:
                    db.execute(f'UPDATE "{table}" SET "end" = "start" - 1000 WHERE rowid % 2 = 0')


@fuzz_settings(10)
@given(
    damages=st.lists(nsys_damage(), min_size=1, max_size=3),
    cut=st.sampled_from([1.0, 1.0, 1.0, 0.5, 0.02]),
    sidecar=st.none() | BROKEN_SIDECARS,
    packed=st.booleans(),
)
def test_kernels_and_diff_on_damaged_nsys_exports(
    damages: list[tuple[Any, ...]], cut: float, sidecar: str | None, packed: bool
) -> None:
    with workdir() as tmp:
        path = tmp / "run.sqlite"
        shutil.copy(PROBE, path)
        damage_export(path, damages)
        truncate(path, cut)
        if sidecar is not None:
            (tmp / "run.profkit.json").write_text(sidecar)
        if packed:  # compressed inputs are read directly
            packed_path = tmp / "run.sqlite.xz"
            packed_path.write_bytes(lzma.compress(path.read_bytes(), preset=0))
            path.unlink()
            path = packed_path
        check_clean("kernels", path, "--format", "json")
        check_clean("diff", PROBE, path, "--format", "json")


# --- Chrome traces -------------------------------------------------------------------------

CHROME_DOC = json.loads(gzip.decompress(CHROME.read_bytes()))
EVENT_FIELDS = ["cat", "ts", "dur", "tid", "pid", "args", "name", "ph"]
ARG_FIELDS = ["correlation", "device", "stream", "grid", "block"]
HEADER_FIELDS = ["baseTimeNanoseconds", "deviceProperties", "profkit", "traceEvents"]


@st.composite
def chrome_damage(draw: st.DrawFn) -> tuple[Any, ...]:
    where = draw(st.sampled_from(["event", "event", "arg", "header"]))
    index = draw(st.integers(0, len(CHROME_DOC["traceEvents"]) - 1))
    fields = {"event": EVENT_FIELDS, "arg": ARG_FIELDS, "header": HEADER_FIELDS}[where]
    field = draw(st.sampled_from(fields))
    value = draw(st.one_of(JSON_VALUE, st.just(["a", "b"]), st.just("<delete>")))
    if where == "header" and field == "profkit":
        value = {"config": draw(st.sampled_from([[1], {"ctx": "abc"}, {"batch": 2**70}]))}
    return (where, index, field, value)


def damage_chrome(doc: dict[str, Any], damages: list[tuple[Any, ...]]) -> None:
    events = doc["traceEvents"]
    for where, index, field, value in damages:
        if where == "header":
            target = doc
        else:
            event = events[index % len(events)] if isinstance(events, list) and events else {}
            target = event.setdefault("args", {}) if where == "arg" else event
            if not isinstance(target, dict):
                continue
        if value == "<delete>":
            target.pop(field, None)
        else:
            target[field] = value


@fuzz_settings(8)
@given(
    damages=st.lists(chrome_damage(), min_size=1, max_size=6),
    same_event=st.booleans(),
    cut=st.sampled_from([1.0, 1.0, 1.0, 0.6]),
    suffix=st.sampled_from([".json", ".json.gz", ".json.xz"]),
)
def test_kernels_on_damaged_chrome_traces(
    damages: list[tuple[Any, ...]], same_event: bool, cut: float, suffix: str
) -> None:
    doc = copy.deepcopy(CHROME_DOC)
    if same_event:  # several fields of one event: ids and times of a kernel together
        damages = [(w, damages[0][1], f, v) for w, _, f, v in damages]
    damage_chrome(doc, damages)
    data = json.dumps(doc).encode()  # NaN and Infinity are written as such: invalid JSON
    data = data[: int(len(data) * cut)]
    with workdir() as tmp:
        path = tmp / f"trace{suffix}"
        packers = {".json": bytes, ".json.gz": gzip.compress, ".json.xz": lzma.compress}
        path.write_bytes(packers[suffix](data))
        check_clean("kernels", path, "--format", "json")


# --- memory snapshots ----------------------------------------------------------------------

SNAPSHOT_DATA = load_snapshot(SNAPSHOT)
SNAPSHOT_KEYS = {
    "segment": ["address", "total_size", "blocks", "device"],
    "block": ["size", "state", "address", "requested_size", "frames"],
    "entry": ["action", "addr", "size", "time_us", "frames", "device_free"],
    "frame": ["filename", "line", "name"],
}


@st.composite
def snapshot_damage(draw: st.DrawFn) -> tuple[Any, ...]:
    where = draw(st.sampled_from(["segment", "block", "entry", "entry", "frame", "oom", "top"]))
    index = draw(st.integers(0, 10_000))
    key = draw(st.sampled_from(SNAPSHOT_KEYS.get(where, ["segments", "device_traces"])))
    value = draw(st.one_of(JSON_VALUE, st.just("<delete>"), st.just(["frame"]), st.just(7)))
    return (where, index, key, value)


def damage_snapshot(snapshot: dict[str, Any], damages: list[tuple[Any, ...]]) -> None:
    segments = snapshot["segments"]
    trace = snapshot["device_traces"][0]
    for where, index, key, value in damages:
        if where == "top":
            target: Any = snapshot
        elif where == "segment":
            target = segments[index % len(segments)]
        elif where == "block":
            blocks = segments[index % len(segments)].get("blocks")
            if not isinstance(blocks, list) or not blocks:  # an earlier damage took them
                continue
            target = blocks[index % len(blocks)]
        elif where == "oom":
            trace.append({"action": "oom", "size": value, "device_free": "x", "time_us": 1})
            continue
        else:
            target = trace[index % len(trace)]
            if where == "frame":
                frames = target.setdefault("frames", [{}])
                if not frames:
                    frames.append({})
                target = frames[index % len(frames)]
        if value == "<delete>":
            target.pop(key, None)
        else:
            target[key] = value


@fuzz_settings(20)
@given(
    damages=st.lists(snapshot_damage(), min_size=1, max_size=3),
    protocol=st.sampled_from([0, 2, 4, 5]),
    cut=st.sampled_from([1.0, 1.0, 1.0, 0.5]),
    sidecar=st.none() | BROKEN_SIDECARS,
)
def test_memory_summarize_on_damaged_snapshots(
    damages: list[tuple[Any, ...]], protocol: int, cut: float, sidecar: str | None
) -> None:
    snapshot = copy.deepcopy(SNAPSHOT_DATA)
    damage_snapshot(snapshot, damages)
    with workdir() as tmp:
        path = tmp / "run.pickle"
        path.write_bytes(pickle.dumps(snapshot, protocol=protocol))
        truncate(path, cut)
        if sidecar is not None:
            (tmp / "run.profkit.json").write_text(sidecar)
        check_clean("memory", "summarize", path, "--format", "json")


@fuzz_settings(3)
@given(damages=st.lists(snapshot_damage(), min_size=1, max_size=2), sidecar=BROKEN_SIDECARS)
def test_memory_plot_on_damaged_snapshots(damages: list[tuple[Any, ...]], sidecar: str) -> None:
    snapshot = copy.deepcopy(SNAPSHOT_DATA)
    damage_snapshot(snapshot, damages)
    with workdir() as tmp:
        path = tmp / "run.pickle.xz"
        path.write_bytes(lzma.compress(pickle.dumps(snapshot, protocol=4), preset=0))
        (tmp / "run.profkit.json").write_text(sidecar)
        check_clean("memory", "plot", path, "-o", tmp / "run.svg", "--detail", "20")


# --- results DB: compare and report ----------------------------------------------------------

with sqlite3.connect(RESULTS) as _db:
    BENCH_COLUMNS = [r[1] for r in _db.execute("PRAGMA table_info(bench)")]


@st.composite
def db_damage(draw: st.DrawFn) -> tuple[Any, ...]:
    kind = draw(st.sampled_from(["cell", "cell", "cell", "column", "view", "drop", "foreign"]))
    return (kind, draw(st.sampled_from(BENCH_COLUMNS)), draw(CELL), draw(st.booleans()))


def damage_db(path: Path, damages: list[tuple[Any, ...]]) -> None:
    with sqlite3.connect(path) as db:
        for kind, column, value, every_row in damages:
            with contextlib.suppress(sqlite3.Error, OverflowError):
                if kind == "cell":
                    where = "" if every_row else "WHERE rowid = (SELECT min(rowid) FROM bench)"
                    db.execute(f'UPDATE bench SET "{column}" = ? {where}', (value,))
                elif kind == "column":
                    db.execute(f'ALTER TABLE bench DROP COLUMN "{column}"')
                elif kind == "view":
                    db.execute("ALTER TABLE bench RENAME TO bench_rows")
                    db.execute("CREATE VIEW bench AS SELECT * FROM bench_rows")
                elif kind == "drop":
                    db.execute("DROP TABLE bench")
                else:  # another tool's table of the same name
                    db.execute("DROP TABLE bench")
                    db.execute("CREATE TABLE bench (id INTEGER, note TEXT NOT NULL)")
                    db.execute("INSERT INTO bench VALUES (1, 'x')")


@fuzz_settings(14)
@given(
    damages=st.lists(db_damage(), min_size=1, max_size=3),
    field=st.sampled_from(["dtype", "compile", "warmup"]),
    cut=st.sampled_from([1.0, 1.0, 1.0, 0.5]),
)
def test_compare_on_damaged_results_dbs(
    damages: list[tuple[Any, ...]], field: str, cut: float
) -> None:
    with workdir() as tmp:
        db = tmp / "results.db"
        shutil.copy(RESULTS, db)
        damage_db(db, damages)
        truncate(db, cut)
        check_clean("compare", field, "--db", db, "--format", "json")


@fuzz_settings(2)
@given(damages=st.lists(db_damage(), min_size=1, max_size=2))
def test_report_on_damaged_results_dbs(damages: list[tuple[Any, ...]]) -> None:
    with workdir() as tmp:
        db = tmp / "results.db"
        shutil.copy(RESULTS, db)
        damage_db(db, damages)
        (tmp / "profiles").mkdir()
        check_clean("report", "--profiles", tmp / "profiles", "--db", db, "--out", tmp / "R.md")
