"""The trace cache never fails or falsifies a command (issue 26).

Each bad input is built from the committed fixtures: an export replaced keeping its size
and mtime, every kind of cache file with a flipped bit or cut short, entries with codes
outside their tables, writers racing a reader, paths that are not UTF-8 or too long. The
command must exit 0 with the uncached run's numbers (or say one line and exit 2): never a
traceback, never a silent wrong number. The Hypothesis property damages one byte of an
entry anywhere and compares the whole JSON output with the uncached one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nsys_data import PROBE, SMALL_FP32, unpack
from report_checks import close_json
from typer.testing import CliRunner

from profkit.cli import app
from profkit.traces import cache
from profkit.traces import cache_files as files
from profkit.traces.nsys_columns import read_nsys_columns

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
CHROME = DATA / "torch-small-ctx128-forward.json.gz"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
runner = CliRunner()


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PROFKIT_CACHE", raising=False)
    return tmp_path / "cache"


def kernels_json(path: Path, *options: str) -> Any:
    """``profkit kernels PATH --format json``: exit 0, no word on stderr, the JSON."""
    result = runner.invoke(app, ["kernels", str(path), "--format", "json", *options])
    assert result.exit_code == 0, (result.exit_code, result.stderr, result.exception)
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def same_as_uncached(path: Path, *options: str) -> Any:
    """The cached command's output equals the uncached one's; returns it."""
    expected = kernels_json(path, "--no-cache", *options)
    close_json(kernels_json(path, *options), expected)
    return expected


def gpu_ms(report: Any) -> float:
    return float(sum(row["gpu_time_ms"] for row in report["phases"]))


def entry_files(path: Path) -> dict[str, Path]:
    entry = cache.entry_dir(path)
    return {p.name: p for p in sorted(entry.iterdir()) if not p.name.startswith(".")}


def loads(path: Path) -> bool:
    """Whether the cache holds a valid entry for ``path`` now."""
    return cache.load(cache.entry_dir(path), cache.identity(path)) is not None


# --- one identity rule -----------------------------------------------------------------------


def slower(source: Path, target: Path) -> None:
    """A copy of ``source`` whose kernels each last 0.1 ms longer (same size: SQLite pages)."""
    shutil.copy(source, target)
    with sqlite3.connect(target) as db:
        db.execute(f'UPDATE {KERNEL} SET "end" = "end" + 100000')
    db.close()
    assert target.stat().st_size == source.stat().st_size


@pytest.mark.parametrize("how", ["in place (cp -p, tar x)", "renamed over (rsync -a)"])
def test_an_export_replaced_keeping_size_and_mtime_is_read_again(
    cache_dir: Path, tmp_path: Path, how: str
) -> None:
    export = tmp_path / "run.sqlite"
    shutil.copy(PROBE, export)
    before = kernels_json(export)
    assert loads(export)
    other = tmp_path / "other.sqlite"
    slower(PROBE, other)
    stat = export.stat()
    if how.startswith("in place"):
        with export.open("r+b") as handle:
            handle.write(other.read_bytes())
    else:
        os.replace(other, export)
    os.utime(export, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (export.stat().st_size, export.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    after = same_as_uncached(export)
    assert gpu_ms(after) > gpu_ms(before) + 2  # 31 activities, 0.1 ms each: the new numbers


def test_the_identity_sees_a_change_in_the_middle_by_the_ctime_and_at_the_ends_by_bytes(
    tmp_path: Path,
) -> None:
    export = unpack(SMALL_FP32, tmp_path)
    first = cache.identity(export)
    stat = export.stat()
    middle = stat.st_size // 2
    assert cache.FINGERPRINT < middle < stat.st_size - cache.FINGERPRINT
    time.sleep(0.01)  # a ctime tick apart, on file systems with coarse clocks
    with export.open("r+b") as handle:
        handle.seek(middle)
        byte = handle.read(1)
        handle.seek(middle)
        handle.write(bytes([byte[0] ^ 1]))
    os.utime(export, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = cache.identity(export)
    assert {k for k in first if first[k] != second[k]} == {"ctime_ns"}
    with export.open("r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x7f")
    os.utime(export, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cache.identity(export)["ends"] != first["ends"]


def test_a_trace_changed_while_it_is_read_is_not_stored(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from profkit.traces import load as loader

    export = tmp_path / "run.sqlite"
    shutil.copy(PROBE, export)
    real = loader.read_nsys_columns

    def read_then_touch(*args: Any, **kwargs: Any) -> Any:
        columns = real(*args, **kwargs)
        os.utime(export)  # the file changed under the read
        return columns

    monkeypatch.setattr(loader, "read_nsys_columns", read_then_touch)
    kernels_json(export)
    assert not loads(export)


# --- one integrity rule ----------------------------------------------------------------------

ENTRY_FILES = [
    cache.INDEX,
    cache.ACTIVITIES,
    cache.RANGES,
    "derived-attribution.arrow",
    "derived-sums.arrow",
    "derived-inference_check.arrow",
]


@pytest.mark.parametrize("name", ENTRY_FILES)
@pytest.mark.parametrize("where", ["start", "middle", "seal"])
def test_a_flipped_bit_in_any_cache_file_is_found_and_rebuilt(
    cache_dir: Path, tmp_path: Path, name: str, where: str
) -> None:
    export = tmp_path / "run.sqlite"
    shutil.copy(PROBE, export)
    expected = kernels_json(export)  # builds the entry with its derived files
    target = entry_files(export)[name]
    data = bytearray(target.read_bytes())
    at = {"start": 10, "middle": len(data) // 2, "seal": len(data) - 3}[where]
    data[at] ^= 0x10
    target.write_bytes(bytes(data))
    close_json(same_as_uncached(export), expected)
    columns = cache.load(cache.entry_dir(export), cache.identity(export))
    assert columns is not None
    if target.read_bytes() == bytes(data):  # a derived file this query did not need: left out
        assert name.removeprefix("derived-").removesuffix(".arrow") not in columns.derived
    same_as_uncached(export, "--range", "forward")  # needs every derived file
    assert target.read_bytes() != bytes(data)  # rebuilt, or the derived file written again


@pytest.mark.parametrize("name", ENTRY_FILES)
@pytest.mark.parametrize("keep", [0, 7, 0.5, -20])
def test_a_cut_short_cache_file_is_found_and_rebuilt(
    cache_dir: Path, tmp_path: Path, name: str, keep: float
) -> None:
    export = tmp_path / "run.sqlite"
    shutil.copy(CHROME, export.with_name("t.json.gz"))
    export = export.with_name("t.json.gz")
    kernels_json(export)  # the kept sums
    expected = kernels_json(export, "--range", "forward")  # the kept attribution
    target = entry_files(export)[name]
    data = target.read_bytes()
    target.write_bytes(data[: int(len(data) * keep) if isinstance(keep, float) else keep])
    close_json(same_as_uncached(export, "--range", "forward"), expected)
    assert loads(export)


def test_a_damaged_cache_found_by_the_cli_never_costs_a_line(
    cache_dir: Path, tmp_path: Path
) -> None:
    """The one-bit damage of the issue: a GPU time changed with exit 0. Now the seal
    fails, the entry is rebuilt, stderr says nothing."""
    export = unpack(SMALL_FP32, tmp_path)
    expected = kernels_json(export, "--no-cache")
    kernels_json(export)
    target = entry_files(export)[cache.ACTIVITIES]
    data = bytearray(target.read_bytes())
    data[len(data) // 3] ^= 0x04
    target.write_bytes(bytes(data))
    result = runner.invoke(app, ["kernels", str(export), "--format", "json"])
    assert result.exit_code == 0 and result.stderr == ""
    close_json(json.loads(result.stdout), expected)


# --- codes outside their tables (sealed, so only a forged or buggy entry has them) ----------


def reseal_column(path: Path, name: str, change: Any) -> None:
    """Rewrite column ``name`` of the entry's activities with ``change(array)``, sealed."""
    import pyarrow as pa

    target = cache.entry_dir(path) / cache.ACTIVITIES
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        table = files.read_table(files.read_sealed(folder, target.name))
    finally:
        os.close(folder)
    array = table.column(name).to_numpy().copy()
    change(array)
    index = table.schema.get_field_index(name)
    table = table.set_column(index, name, pa.array(array))
    files.write_table(target, table)


def reseal_index(path: Path, change: Any) -> None:
    target = cache.entry_dir(path) / cache.INDEX
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        index = json.loads(bytes(files.read_sealed(folder, target.name)))
    finally:
        os.close(folder)
    change(index)
    files.write_json(target, index)


def _set(array: np.ndarray, value: int) -> None:
    array[len(array) // 2] = value


CODES = {
    "name beyond the names": ("name", lambda a, i: _set(a, len(i["names"]))),
    "negative name": ("name", lambda a, i: _set(a, -1)),
    "launch thread beyond the threads": ("launch_thread", lambda a, i: _set(a, len(i["threads"]))),
    "launch thread below -1": ("launch_thread", lambda a, i: _set(a, -2)),
    "shape beyond the shapes": ("shape", lambda a, i: _set(a, len(i["shapes"]))),
}


@pytest.mark.parametrize(
    ("case", "source"),
    [(case, CHROME) for case in CODES]
    # an export's entry keeps no shapes: they are read from the export by row id
    + [(case, PROBE) for case in CODES if not case.startswith("shape")],
    ids=[f"{case}-chrome" for case in CODES]
    + [f"{case}-export" for case in CODES if not case.startswith("shape")],
)
def test_codes_outside_their_tables_are_caught(
    cache_dir: Path, tmp_path: Path, case: str, source: Path
) -> None:
    """A schema-valid entry, resealed, whose codes point past their lookup tables: refused
    on opening, and the trace read again in the same run (the output the uncached one)."""
    trace = tmp_path / source.name
    shutil.copy(source, trace)
    expected = kernels_json(trace)
    entry = cache.entry_dir(trace)
    folder = os.open(entry, os.O_RDONLY)
    index = json.loads(bytes(files.read_sealed(folder, cache.INDEX)))
    os.close(folder)
    column, change = CODES[case]
    reseal_column(trace, column, lambda array: change(array, index))
    assert not loads(trace)
    close_json(same_as_uncached(trace), expected)
    assert loads(trace)


TABLES = {
    "unknown kind": lambda i: i["kinds"].__setitem__(0, "bogus"),
    "a name that is a number": lambda i: i["names"].__setitem__(0, 5),
    "fewer kinds than names": lambda i: i["kinds"].pop(),
    "thread id past 64 bits": lambda i: i["threads"].__setitem__(0, 2**70),
    "thread name keyed by text": lambda i: i["meta"].__setitem__("thread_names", {"abc": "x"}),
    "rows that disagree": lambda i: i.__setitem__("rows", i["rows"] + 1),
    "kernel rows past the activities": lambda i: i["kernel_rows"].__setitem__("count", 10**9),
    "kernel runs out of order": lambda i: i["kernel_rows"].__setitem__("starts", [0, 5, 3]),
    "reversed launch bounds": lambda i: i.__setitem__("launch_bounds", [5, 1]),
    "an unknown array": lambda i: i["arrays"].append("no_such_array"),
    "meta that is a list": lambda i: i.__setitem__("meta", []),
}


@pytest.mark.parametrize("case", list(TABLES))
def test_lookup_tables_that_do_not_check_out_are_rebuilt(
    cache_dir: Path, tmp_path: Path, case: str
) -> None:
    export = tmp_path / "run.sqlite"
    shutil.copy(PROBE, export)
    expected = kernels_json(export)

    def change(index: dict[str, Any]) -> None:
        if case.startswith("kernel runs"):
            index["kernel_rows"]["rowids"] = [0, 1, 2]
        TABLES[case](index)

    reseal_index(export, change)
    assert not loads(export)
    close_json(same_as_uncached(export), expected)


# --- racing writers --------------------------------------------------------------------------

WRITER = """
import sys, time
from pathlib import Path
from profkit.traces import cache
from profkit.traces.nsys_columns import read_nsys_columns
export = Path(sys.argv[1])
columns = read_nsys_columns(export)
entry, expected = cache.entry_dir(export), cache.identity(export)
print("ready", flush=True)
sys.stdin.readline()
until, stored = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < until:
    stored += cache.store(entry, expected, columns)
print(stored, flush=True)
"""


def test_two_writers_storing_one_entry_never_fail_a_reader_or_lose_the_entry(
    cache_dir: Path, tmp_path: Path
) -> None:
    export = tmp_path / "run.sqlite"
    shutil.copy(PROBE, export)
    expected = kernels_json(export, "--no-cache")
    fresh = read_nsys_columns(export)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(export), "3"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for _ in range(2)
    ]
    for writer in writers:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    for writer in writers:
        assert writer.stdin is not None
        writer.stdin.write("go\n")
        writer.stdin.flush()
    hits = misses = commands = 0
    until = time.monotonic() + 3
    while time.monotonic() < until:
        columns = cache.load(cache.entry_dir(export), cache.identity(export))
        if columns is None:
            misses += 1
        else:
            hits += 1
            assert (
                columns.names == fresh.names and columns.threads.tolist() == fresh.threads.tolist()
            )
            for name, array in fresh.arrays.items():
                np.testing.assert_array_equal(columns.arrays[name], array)
        if hits % 20 == 1 and commands < 3:  # a whole command, adding derived files meanwhile
            commands += 1
            close_json(kernels_json(export), expected)
    stored = [int(writer.communicate(timeout=60)[0].strip()) for writer in writers]
    assert all(writer.returncode == 0 for writer in writers)
    assert sum(stored) > 10 and hits > 10, (stored, hits, misses)
    assert loads(export)  # a good entry is left
    close_json(kernels_json(export), expected)
    leftovers = [p.name for p in cache.entry_dir(export).parent.iterdir() if p.name[0] == "."]
    assert leftovers == []


def test_old_leftovers_of_killed_writers_are_removed_new_ones_kept(
    cache_dir: Path, tmp_path: Path
) -> None:
    export = tmp_path / "run.sqlite"
    shutil.copy(PROBE, export)
    folder = cache.entry_dir(export).parent
    folder.mkdir(parents=True)
    old, new = folder / ".writing-old", folder / ".replaced-new"
    for leftover in (old, new):
        (leftover / "entry").mkdir(parents=True)
    long_ago = time.time() - 2 * cache.LEFTOVER_S
    os.utime(old, (long_ago, long_ago))
    kernels_json(export)
    assert not old.exists() and new.exists()


# --- paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize("trace", [PROBE, CHROME], ids=["export", "chrome"])
def test_paths_that_are_not_utf8_are_read_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace: Path
) -> None:
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    folder.mkdir()
    odd = folder / (os.fsdecode(b"run\xff") + "".join(trace.suffixes))
    shutil.copy(trace, odd)
    cache_folder = tmp_path / os.fsdecode(b"cache\xfe")
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(cache_folder))
    same_as_uncached(odd)
    assert loads(odd)
    same_as_uncached(odd)  # from the entry


def test_a_cache_folder_too_long_for_the_file_system_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for folder in (tmp_path / ("c" * 300), tmp_path.joinpath(*["d" * 250] * 20)):
        monkeypatch.setenv("PROFKIT_CACHE_DIR", str(folder))
        same_as_uncached(PROBE)
        same_as_uncached(CHROME, "--phase", "forward")


def test_a_trace_deeper_than_the_longest_path_is_read_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reached by a relative path: its resolved path is longer than PATH_MAX, its entry's
    name is a hash of it all the same."""
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for _ in range(20):
        os.mkdir("d" * 250)
        os.chdir("d" * 250)
    shutil.copy(CHROME, "t.json.gz")
    assert len(str(Path("t.json.gz").resolve())) > 4096
    same_as_uncached(Path("t.json.gz"))
    assert loads(Path("t.json.gz"))


# --- the property: any one byte of an entry, damaged ------------------------------------------

PROPERTY_TRACES = {"export": PROBE, "chrome": CHROME}


@contextlib.contextmanager
def cache_at(folder: Path) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("PROFKIT_CACHE_DIR", "PROFKIT_CACHE")}
    os.environ["PROFKIT_CACHE_DIR"] = str(folder)
    os.environ.pop("PROFKIT_CACHE", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per trace: its copy, the uncached JSON, and its full entry (with derived files)."""
    root = tmp_path_factory.mktemp("property")
    made: dict[str, Any] = {"root": root}
    with cache_at(root / "cache"):
        for key, source in PROPERTY_TRACES.items():
            trace = root / source.name
            shutil.copy(source, trace)
            expected = kernels_json(trace, "--no-cache")
            close_json(kernels_json(trace), expected)
            entry = {n: p.read_bytes() for n, p in entry_files(trace).items()}
            assert set(ENTRY_FILES) <= set(entry)
            made[key] = (trace, expected, entry)
    return made


@settings(
    max_examples=int(os.environ.get("PROFKIT_FUZZ_EXAMPLES", "0")) or 40,
    derandomize=not os.environ.get("PROFKIT_FUZZ_EXAMPLES"),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_one_byte_damaged_in_an_entry_gives_the_uncached_output(
    pristine: dict[str, Any], data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(list(PROPERTY_TRACES)), "trace")
    trace, expected, entry = pristine[key]
    name = data.draw(st.sampled_from(sorted(entry)), "file")
    damaged = bytearray(entry[name])
    offset = data.draw(st.integers(0, len(damaged) - 1), "offset")
    damaged[offset] = data.draw(st.integers(0, 255), "value")
    with cache_at(pristine["root"] / "cache"):
        folder = cache.entry_dir(trace)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for other, content in entry.items():
            (folder / other).write_bytes(bytes(damaged) if other == name else content)
        close_json(kernels_json(trace), expected)
