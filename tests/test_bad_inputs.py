"""Each class of bad input, one targeted case at a time, through the real CLI on real files.

A user error is one ``error:`` line on stderr and exit status 2; what a reader can repair
(a negative duration, an odd event, a broken sidecar) is a counted warning and the work
goes on. ``test_fuzz_inputs.py`` searches the same classes at random.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from profkit.cli import app
from profkit.cli.app import READER_GONE_STATUS, _reader_gone
from profkit.errors import BadInput, ProfkitWarning
from profkit.files import check_readable, plain_copy
from profkit.memory.snapshot import load_snapshot
from profkit.run.proc import check_timeout
from profkit.sidecar import read_sidecar, sidecar_path, write_sidecar
from profkit.traces.load import load_columns

DATA = Path(__file__).parent / "data"
PROBE = DATA / "nsys-2025.3-probe.sqlite"
CHROME = DATA / "torch-small-ctx128-forward.json.gz"
SNAPSHOT = DATA / "memory-tiny-ctx64-forward-fp32.pickle.xz"
RESULTS = DATA / "results-h100.db"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
runner = CliRunner()


def invoke(*args: str | Path) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def one_error(result: Any, *needles: str) -> str:
    """Exit 2, exactly one ``error:`` line on stderr, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return str(lines[0])


def export(tmp_path: Path, *sql: str, params: tuple[Any, ...] = ()) -> Path:
    """A copy of the real probe export with ``sql`` applied to it."""
    path = tmp_path / "run.sqlite"
    shutil.copy(PROBE, path)
    with sqlite3.connect(path) as db:
        for statement in sql:
            db.execute(statement, params if "?" in statement else ())
    return path


def kernels_json(path: Path) -> Any:
    result = invoke("kernels", path, "--format", "json")
    assert result.exit_code == 0, (result.stderr, result.exception)
    return result, json.loads(result.stdout)


# --- nsys exports ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind"),
    [("abc", "text ('abc')"), (1.5, "a real number (1.5)"), (b"\x01\x02", "a blob")],
)
def test_nsys_wrong_cell_type_names_table_column_and_value(
    tmp_path: Path, value: Any, kind: str
) -> None:
    path = export(tmp_path, f"UPDATE {KERNEL} SET start = ? WHERE rowid = 3", params=(value,))
    one_error(invoke("kernels", path), str(path), f"{KERNEL}.start holds {kind}")


def test_nsys_missing_columns_are_named(tmp_path: Path) -> None:
    path = export(tmp_path, f"ALTER TABLE {KERNEL} DROP COLUMN gridX")
    one_error(invoke("kernels", path), f"table {KERNEL} lacks column(s) gridX")
    names = [f"ALTER TABLE {KERNEL} DROP COLUMN {c}" for c in ("demangledName", "mangledName")]
    path = export(tmp_path / "..", *names)
    one_error(invoke("kernels", path), "has no name column")


def test_nsys_dropped_string_ids_are_not_called_a_non_nsys_file(tmp_path: Path) -> None:
    path = export(tmp_path, "DROP TABLE StringIds")
    message = one_error(invoke("kernels", path), "no StringIds table", "export it again")
    assert "no nsys tables" not in message


def test_nsys_nvtx_text_as_blob_or_bad_utf8_still_reads(tmp_path: Path) -> None:
    path = export(
        tmp_path,
        "UPDATE NVTX_EVENTS SET text = CAST('forward' AS BLOB), textId = NULL "
        "WHERE rowid = (SELECT min(rowid) FROM NVTX_EVENTS WHERE eventType = 59)",
        "UPDATE StringIds SET value = CAST(X'66ff6f' AS TEXT) "
        f"WHERE id = (SELECT demangledName FROM {KERNEL} LIMIT 1)",
    )
    _, report = kernels_json(path)
    totals = report["totals"]
    assert (totals["kernels"], totals["memcpy"] + totals["memset"]) == (25, 6)  # 31 activities
    assert any("f\ufffdo" in k["name"] for k in report["kernels"])  # replacement character


def test_nsys_negative_durations_are_counted_and_said(tmp_path: Path) -> None:
    path = export(tmp_path, f'UPDATE {KERNEL} SET "end" = start - 500 WHERE rowid <= 4')
    _, report = kernels_json(path)
    assert report["source"]["clamped_activities"] == 4
    assert report["totals"]["kernels"] == 25  # kept, at 0 ms: counts agree with the table
    table = invoke("kernels", path)
    assert "4 GPU activities end before they start" in table.stdout


def test_nsys_backwards_ranges_are_counted(tmp_path: Path) -> None:
    path = export(tmp_path, 'UPDATE NVTX_EVENTS SET "end" = start - 1 WHERE eventType = 59')
    _, report = kernels_json(path)
    assert report["source"]["clamped_ranges"] >= 1


def test_nsys_text_in_nvtx_times_is_one_line(tmp_path: Path) -> None:
    path = export(tmp_path, "UPDATE NVTX_EVENTS SET start = 'soon' WHERE eventType = 59")
    one_error(invoke("kernels", path), "NVTX_EVENTS.start holds text ('soon')")


def test_compressed_export_reads_directly_and_is_kept(tmp_path: Path) -> None:
    packed = tmp_path / "probe.sqlite.gz"
    packed.write_bytes(gzip.compress(PROBE.read_bytes()))
    assert len(load_columns(packed, cache=False)) == 31
    assert packed.is_file() and not (tmp_path / "probe.sqlite").exists()
    cut = tmp_path / "cut.sqlite.xz"
    cut.write_bytes(lzma.compress(PROBE.read_bytes())[:5_000])
    one_error(invoke("kernels", cut), "is a truncated or corrupt xz file")


def test_plain_copy_unpacks_into_a_temporary_directory(tmp_path: Path) -> None:
    packed = tmp_path / "probe.sqlite.xz"
    packed.write_bytes(lzma.compress(PROBE.read_bytes(), preset=0))
    with plain_copy(packed, "an export") as plain:
        assert plain.read_bytes() == PROBE.read_bytes() and plain.parent != tmp_path
    assert not plain.exists()
    with plain_copy(PROBE, "an export") as same:
        assert same == PROBE


# --- Chrome traces -----------------------------------------------------------------------------


def chrome(tmp_path: Path, damage: Any, suffix: str = ".json") -> Path:
    doc = json.loads(gzip.decompress(CHROME.read_bytes()))
    damage(doc)
    path = tmp_path / f"trace{suffix}"
    data = json.dumps(doc).encode()
    path.write_bytes(lzma.compress(data) if suffix.endswith(".xz") else data)
    return path


def kernel_events(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def test_chrome_odd_events_are_dropped_or_fixed_and_counted(tmp_path: Path) -> None:
    _, clean = kernels_json(CHROME)

    def damage(doc: dict[str, Any]) -> None:
        kernels = kernel_events(doc)
        kernels[0]["cat"] = ["kernel", "gpu"]  # a list: not a category -> malformed
        kernels[1]["ts"] = "nan"  # not finite: dropped
        kernels[2]["dur"] = "inf"  # inf: dropped (a bare 1e400 is invalid JSON to orjson)
        kernels[3]["dur"] = -5.0  # negative: kept as 0
        kernels[4]["tid"] = kernels[4]["args"]["correlation"] = 2**64 - 1  # unsigned ids
        kernels[5]["args"]["stream"] = 2**70  # beyond 64 bits: unknown

    kernels = kernel_events(json.loads(gzip.decompress(CHROME.read_bytes())))
    assert len(kernels) > 6
    damage_path = chrome(tmp_path, damage, ".json.xz")
    text = damage_path.read_bytes()
    assert text  # the .xz is read directly
    _, report = kernels_json(damage_path)
    source = report["source"]
    # cat list + ts nan + dur inf: three kernels gone; one kept at 0 ms.
    assert report["totals"]["kernels"] == clean["totals"]["kernels"] - 3
    assert source["dropped_events"] == 3 and source["clamped_activities"] == 1
    table = invoke("kernels", damage_path).stdout
    assert "skipped 1 malformed events" in table
    assert "2 events with a non-finite or out-of-range time" in table
    assert "1 events with a negative duration (counted as 0)" in table


def test_chrome_broken_profkit_record_is_one_warning(tmp_path: Path) -> None:
    def damage(doc: dict[str, Any]) -> None:
        doc["profkit"] = {"config": {"size": "small", "ctx": "abc"}}
        doc["deviceProperties"] = 7
        doc["baseTimeNanoseconds"] = 2**70

    result, report = kernels_json(chrome(tmp_path, damage))
    assert "config" not in report["source"]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "ctx is 'abc', not a whole number >= 1" in warnings[0]


# --- memory snapshots ----------------------------------------------------------------------------


def snapshot_file(tmp_path: Path, damage: Any, protocol: int = 4) -> Path:
    data = load_snapshot(SNAPSHOT)
    damage(data)
    path = tmp_path / "run.pickle"
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path


def first_alloc(data: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in data["device_traces"][0] if e["action"] == "alloc")


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda d: d["segments"][0]["blocks"][0].pop("state"), "blocks[0] has no 'state'"),
        (lambda d: d["segments"][0].pop("total_size"), "segments[0] has no 'total_size'"),
        (lambda d: first_alloc(d).update(frames=["x.py:1"]), "is 'x.py:1', not a frame"),
        (lambda d: first_alloc(d).update(frames=[7]), "frames[0] is 7, not a frame"),
        (lambda d: first_alloc(d).update(size=2**70), "size is 1180591620717411303424"),
        (lambda d: first_alloc(d).update(size=1e300), ".size is 1e+300, not a whole number"),
        (lambda d: d["segments"][0].update(address=float("inf")), "address is inf"),
        (lambda d: first_alloc(d).update(time_us="abc"), "time_us is 'abc', not a time"),
        (
            lambda d: d["device_traces"][0].append({"action": "oom", "size": "lots"}),
            ".size is 'lots'",
        ),
    ],
)
def test_snapshot_structure_errors_name_the_entry(tmp_path: Path, damage: Any, needle: str) -> None:
    path = snapshot_file(tmp_path, damage)
    for command in ("summarize", "plot"):
        one_error(invoke("memory", command, path), "not a usable CUDA memory snapshot", needle)


def test_snapshot_messages_say_what_the_file_is(tmp_path: Path) -> None:
    proto0 = tmp_path / "p0.pickle"
    proto0.write_bytes(pickle.dumps({"hello": [1, 2]}, protocol=0))
    one_error(invoke("memory", "summarize", proto0), "holds a pickled dict, not a CUDA memory")
    one_error(invoke("memory", "summarize", "/dev/urandom"), "is a device or socket")
    valid0 = snapshot_file(tmp_path, lambda d: None, protocol=0)  # any protocol is fine
    assert invoke("memory", "summarize", valid0).exit_code == 0
    noise = tmp_path / "noise.pickle"
    noise.write_bytes(os.urandom(4096).replace(b"(", b"x"))
    message = one_error(invoke("memory", "summarize", noise))
    assert "empty" not in message and ("not a pickle" in message or "corrupt" in message)
    # An nsys export (compressed or not) is named as what it is: "S" opens protocol 0's STRING.
    export = DATA / "nsys-2025.3-h100-small-fp32.sqlite.xz"
    for command in ("summarize", "plot"):
        one_error(invoke("memory", command, export), "is an SQLite database", "not a CUDA memory")


def test_plot_into_a_file_parent_says_so(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    message = one_error(
        invoke("memory", "plot", SNAPSHOT, "-o", tmp_path / "file" / "x.png"), "is a file"
    )
    assert "File exists" not in message


# --- not a regular file ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["kernels", "{fifo}"],
        ["diff", str(PROBE), "{fifo}"],
        ["memory", "summarize", "{fifo}"],
        ["memory", "plot", "{fifo}", "-o", "{tmp}/x.png"],
        ["compare", "dtype", "--db", "{fifo}"],
    ],
)
def test_a_fifo_is_refused_at_once(tmp_path: Path, args: list[str]) -> None:
    fifo = tmp_path / "input"
    os.mkfifo(fifo)
    filled = [a.format(fifo=fifo, tmp=tmp_path) for a in args]
    one_error(invoke(*filled), f"{fifo} is a FIFO, not a regular file")


def test_check_readable_messages(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no such file"):
        check_readable(tmp_path / "none", "a trace")
    with pytest.raises(BadInput, match="is a directory, not a trace"):
        check_readable(tmp_path, "a trace")
    assert check_readable(PROBE, "a trace") == PROBE


# --- sidecars ----------------------------------------------------------------------------------


BROKEN = [
    ('{"config": {"ctx": "abc"}}', "config.ctx is 'abc', not a whole number >= 1"),
    ('{"config": [1, 2]}', "config is a list, not an object"),
    ('{"config": {"batch": 1e400}}', "config.batch is inf, not a finite number"),
    ('{"phase_marks": [{"phase": "forward", "time_us": "x"}]}', "time_us is 'x'"),
    ('{"result": {"steps": [{"forward_ms": "slow"}]}}', "forward_ms is 'slow'"),
    ("{ not json", "not valid JSON"),
]


@pytest.mark.parametrize(("text", "why"), BROKEN)
def test_broken_sidecar_is_one_warning_everywhere(tmp_path: Path, text: str, why: str) -> None:
    trace = tmp_path / "run.sqlite"
    shutil.copy(PROBE, trace)
    snapshot = tmp_path / "snap.pickle.xz"
    shutil.copy(SNAPSHOT, snapshot)
    for artefact in (trace, snapshot):
        sidecar_path(artefact).write_text(text)
    for args in (
        ["kernels", trace],
        ["diff", trace, trace],
        ["memory", "summarize", snapshot],
        ["memory", "plot", snapshot, "-o", tmp_path / "snap.svg", "--detail", "10"],
    ):
        result = invoke(*args)
        assert result.exit_code == 0, (args, result.stderr, result.exception)
        warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
        assert len(set(warnings)) == 1 and why in warnings[0], (args, result.stderr)


def test_sidecar_naming_and_atomic_round_trip(tmp_path: Path) -> None:
    for name in ("run.sqlite", "run.nsys-rep", "run.pickle", "run.pickle.xz", "run.json.gz"):
        assert sidecar_path(tmp_path / name) == tmp_path / "run.profkit.json"
    record = {"config": {"size": "tiny", "ctx": 16, "batch": 2}, "timings_s": {"x": float("nan")}}
    write_sidecar(sidecar_path(tmp_path / "run.sqlite"), record)
    assert read_sidecar(tmp_path / "run.pickle") == {
        "config": {"size": "tiny", "ctx": 16, "batch": 2},
        "timings_s": {"x": None},  # JSON has no NaN: written as null, read back clean
    }
    assert list(tmp_path.iterdir()) == [tmp_path / "run.profkit.json"]  # no temporary left
    sidecar_path(tmp_path / "run.sqlite").write_text('{"config": "abc"}')
    with pytest.warns(ProfkitWarning, match="config is 'abc', not an object"):
        assert read_sidecar(tmp_path / "run.sqlite") is None


# --- results DB, options, output ---------------------------------------------------------------


def results_db(tmp_path: Path, *sql: str) -> Path:
    path = tmp_path / "results.db"
    shutil.copy(RESULTS, path)
    with sqlite3.connect(path) as db:
        for statement in sql:
            db.execute(statement)
    return path


def test_bench_view_or_foreign_table_is_one_line(tmp_path: Path) -> None:
    view = results_db(
        tmp_path, "ALTER TABLE bench RENAME TO rows", "CREATE VIEW bench AS SELECT * FROM rows"
    )
    one_error(invoke("compare", "dtype", "--db", view), "'bench' is a view, not a table")
    foreign = results_db(tmp_path, "DROP TABLE bench", "CREATE TABLE bench (id, note)")
    one_error(invoke("compare", "dtype", "--db", foreign), "lacks column(s) size, ctx, batch")


def test_compare_without_size_column_says_so(tmp_path: Path) -> None:
    path = results_db(tmp_path, "ALTER TABLE bench DROP COLUMN size")
    one_error(invoke("compare", "dtype", "--db", path), "its bench table lacks column(s) size")


def test_wrong_typed_cells_read_as_null_with_one_warning(tmp_path: Path) -> None:
    path = results_db(tmp_path, "UPDATE bench SET step_ms = 'fast' WHERE rowid = 1")
    result = invoke("compare", "dtype", "--db", path, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("warning:") == 1 and "(step_ms)" in result.stderr


@pytest.mark.parametrize(
    ("column", "cell"),
    [
        ("forward_times_ms", "not json"),
        ("forward_times_ms", "[" * 50_000 + "]" * 50_000),  # deeper than a JSON parser goes
        ("ranks", "{broken"),
        ("ranks", "[" * 50_000 + "]" * 50_000),
        ("ranks", "[1, 2]"),  # JSON, but not the ranks' records
    ],
    ids=[
        "list not json",
        "list nested 50,000 deep",
        "ranks not json",
        "ranks nested",
        "ranks not records",
    ],
)
def test_cells_that_are_not_their_json_read_as_null_with_one_warning(
    tmp_path: Path, column: str, cell: str
) -> None:
    """compare and report read the rest of the DB; the bad cell is null, said once."""
    add = "ALTER TABLE bench ADD COLUMN ranks TEXT" if column == "ranks" else "SELECT 1"
    path = results_db(tmp_path, add)
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE bench SET {column} = ? WHERE rowid = 1", (cell,))
    result = invoke("compare", "dtype", "--db", path, "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("warning:") == 1 and f"({column})" in result.stderr
    report = invoke(
        "report", "--db", path, "--profiles", tmp_path / "none", "--out", tmp_path / "R.md"
    )
    assert report.exit_code == 0, report.stderr
    assert (tmp_path / "R.md").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0"])
def test_timeout_must_be_finite_and_positive(value: str) -> None:
    with pytest.raises(BadInput, match="--timeout must be a positive number of seconds"):
        check_timeout(float(value))
    args = ["bench", "--size", "tiny", "--device", "cpu", "--timeout", value]
    one_error(invoke(*args), "--timeout must be")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["kernels", "--bogus"], "No such option: --bogus"),
        (["kernels"], "Missing argument"),
        (["bench", "--steps", "abc"], "Invalid value for '--steps'"),
        (["no-such-command"], "No such command"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], needle: str) -> None:
    one_error(invoke(*args), needle, "--help`)")


def run_cli(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "profkit", *args], env=env, capture_output=True, **kwargs
    )


def test_full_or_closed_stdout_is_one_line_not_a_traceback() -> None:
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [sys.executable, "-m", "profkit", "kernels", str(PROBE), "--format", "json"],
            stdout=full,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode() == "error: cannot write the output: No space left on device\n"


def test_closed_stdout_is_one_line_unless_the_output_goes_to_out(tmp_path: Path) -> None:
    """Started with stdout closed (`profkit sizes >&-`), profkit has nowhere to print: one
    line before any work; with --out the results go to the file and it succeeds."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def closed(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "profkit", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: os.close(1),  # the child starts with stdout closed
        )

    done = closed("sizes")
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode().startswith("error: stdout is closed")
    assert done.stderr.count(b"\n") == 1
    done = closed("sizes", "--out", str(tmp_path / "sizes.md"))
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    assert "2.7B" in (tmp_path / "sizes.md").read_text()


def test_a_reader_leaving_the_pipe_ends_profkit_quietly_with_141() -> None:
    """`profkit kernels T | head -c 1`: no message, status 141 (as SIGPIPE gives `cat`)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    big = DATA / "nsys-2025.3-h100-small-fp32.sqlite.xz"  # tables well past a pipe's buffer
    proc = subprocess.Popen(
        [sys.executable, "-m", "profkit", "kernels", str(big), "--top", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(1)  # the output had begun
    proc.stdout.close()  # the reader leaves, as `| head -c 1` does
    stderr = proc.stderr.read().decode()
    proc.wait()
    assert (proc.returncode, stderr) == (READER_GONE_STATUS, "")


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],  # typer prints help through its own rich console
        ["memory", "--help"],  # a sub-group
        ["sizes"],  # a rich table
        ["sizes", "--format", "json"],  # plain text through the command's flush
        ["kernels", str(PROBE), "--format", "csv"],
    ],
    ids=" ".join,
)
def test_every_kind_of_output_into_a_pipe_nobody_reads_is_quiet(args: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before profkit writes a byte
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "profkit", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (READER_GONE_STATUS, "")


def test_an_unread_pipe_is_told_from_a_pipe_still_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only stdout's (or stderr's) own reader leaving is quiet; another broken pipe is a bug."""
    read_end, write_end = os.pipe()
    with open(write_end, "w") as stdout, open(os.devnull, "w") as stderr:
        monkeypatch.setattr(sys, "stdout", stdout)
        monkeypatch.setattr(sys, "stderr", stderr)
        assert not _reader_gone()
        os.close(read_end)
        assert _reader_gone()


def test_a_timestamp_from_another_era_is_one_line(tmp_path: Path) -> None:
    path = export(
        tmp_path,
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = 9223372036854775807",
    )
    one_error(invoke("kernels", path), "its timestamps span 106,752 days", "damaged timestamp")


def test_chrome_thread_id_at_the_int64_edge_reads(tmp_path: Path) -> None:
    def damage(doc: dict[str, Any]) -> None:
        launch = next(e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime")
        launch["tid"] = 2**63 - 1

    _, report = kernels_json(chrome(tmp_path, damage))
    _, clean = kernels_json(CHROME)
    assert report["totals"] == clean["totals"]


def test_a_missing_default_db_points_at_the_one_the_demo_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After `profkit demo` (profiles/demo/results.db), commands that read the default
    profiles/results.db say where a results DB is instead of only that it is missing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROFKIT_DB", raising=False)
    (tmp_path / "profiles" / "demo").mkdir(parents=True)
    shutil.copy(RESULTS, tmp_path / "profiles" / "demo" / "results.db")
    one_error(
        invoke("compare", "dtype"),
        "no results database at profiles/results.db",
        "give --db profiles/demo/results.db",
    )
    one_error(invoke("report"), "nothing to report", "give --profiles profiles/demo")
    assert not (tmp_path / "reports").exists()


def test_a_snapshot_or_results_db_given_to_kernels_says_what_reads_it() -> None:
    one_error(invoke("kernels", SNAPSHOT), "is not a supported trace", "profkit memory summarize")
    one_error(
        invoke("kernels", RESULTS, "--no-cache"),
        "is an SQLite database but not an Nsight Systems SQLite export",
        "it is a profkit results DB",
    )


def test_report_with_a_db_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    """An explicit --db that does not exist is a typo, not a report of the traces alone
    (without --run, which makes it)."""
    out = tmp_path / "r" / "R.md"
    (tmp_path / "profiles").mkdir()
    shutil.copy(CHROME, tmp_path / "profiles" / CHROME.name)
    one_error(
        invoke("report", "--db", tmp_path / "nope.db", "--profiles", tmp_path / "profiles",
               "--out", out),
        "no results database at",
    )  # fmt: skip
    assert not out.parent.exists()


RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
LAST_PROCESS = f"(SELECT max((globalTid >> 24) & 16777215) FROM {RUNTIME})"


@pytest.mark.parametrize(
    ("sql", "blind"),
    [
        (f"DROP TABLE {RUNTIME}", "device(s) 0, 1"),
        (
            f"DELETE FROM {RUNTIME} WHERE (globalTid >> 24) & 16777215 = {LAST_PROCESS}",
            "device(s) 1",
        ),
    ],
    ids=["no launch rows", "one rank's launch rows gone"],
)
def test_rank_of_a_two_gpu_export_without_launch_rows(tmp_path: Path, sql: str, blind: str) -> None:
    """The 2-GPU DDP export without (some of) its CUDA API calls: the whole job still reads
    with every kernel, and --rank says in one line why it cannot tell the ranks apart."""
    from nsys_data import unpack

    path = unpack("nsys-2025.3-h200x2-small-ddp2", tmp_path)
    with sqlite3.connect(path) as db:
        db.execute(sql)
    _, whole = kernels_json(path)
    assert whole["totals"]["kernels"] == 12_360
    assert whole["totals"]["gpu_time_ms"] == pytest.approx(238.164326)
    for rank in ("0", "1"):
        one_error(invoke("kernels", path, "--no-cache", "--rank", rank),
                  "ran on 2 devices", f"those of {blind} have no CUDA API calls")  # fmt: skip


def deep_folder(root: Path, length: int) -> Path:
    """A folder under ``root`` whose full path is ``length`` bytes or a little more."""
    folder = root
    while len(os.fsencode(folder)) < length:
        folder /= "d" * min(200, max(length - len(os.fsencode(folder)), 1))
    folder.mkdir(parents=True)
    return folder


def test_an_export_with_a_full_path_too_long_for_sqlite_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite opens no path longer than about 500 bytes ("unable to open database file", as
    if the file were damaged): the export is read through a short hard link, by its full
    path or a relative one, and the link is gone afterwards."""
    links = tmp_path / "tmp"
    links.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(links))
    _, expected = kernels_json(PROBE)
    deep = deep_folder(tmp_path / "deep", 620) / "run.sqlite"
    shutil.copy(PROBE, deep)
    for given in (deep, Path(os.path.relpath(deep))):
        _, report = kernels_json(given)
        assert report["totals"] == expected["totals"]
        assert report["phases"] == expected["phases"]
    assert list(links.iterdir()) == []
    with monkeypatch.context() as patched:  # no file system where a hard link can be made
        patched.setattr(os, "link", lambda *_: (_ for _ in ()).throw(PermissionError(1, "no")))
        one_error(invoke("kernels", deep, "--no-cache"),
                  "its full path is", "longer than SQLite opens", "move it, or link it (ln)")  # fmt: skip
    db = deep.with_name("results.db")
    shutil.copy(RESULTS, db)
    one_error(invoke("compare", "dtype", "--db", db), "longer than SQLite opens (about 500)")
