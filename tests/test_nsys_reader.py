"""Reading Nsight Systems SQLite exports: real H100 exports, old schemas, every bad input."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from nsys_data import (
    GRAPH_NODES,
    GRAPH_WHOLE,
    MAIN,
    OLD_NO_KERNELS,
    PROBE,
    SMALL_BF16,
    SMALL_FP32,
    STATS,
    TINY_COMPILE,
    WORKER,
    Export,
    unpack,
)
from report_checks import assert_columns_are_the_export
from synthetic import report

from profkit.errors import BadInput, MissingTool, ProfkitWarning
from profkit.traces.columns import ActivityColumns
from profkit.traces.load import load_columns
from profkit.traces.nsys_columns import read_nsys_columns

PROBE_MAIN, PROBE_AUTOGRAD = 281494723495065, 281494723495102
RANGE_COLUMNS = ["name", "start", "end", "thread", "depth", "domain"]


@pytest.fixture(scope="session")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nsys")


def kinds(columns: ActivityColumns) -> np.ndarray:
    """Each activity's kind: kernel, memcpy, memset or graph."""
    return np.array(columns.kinds)[columns.arrays["name"]]


def names(columns: ActivityColumns) -> np.ndarray:
    """Each activity's full name."""
    return np.array(columns.names, dtype=object)[columns.arrays["name"]]


def launches(columns: ActivityColumns) -> dict[str, tuple[int, int]]:
    """Per activity name (each once): its launch call's start and thread (-1: none)."""
    threads = columns.launch_threads(columns.arrays["launch_thread"])
    return {
        str(n): (int(t), int(th))
        for n, t, th in zip(names(columns), columns.arrays["launch_start"], threads, strict=True)
    }


def test_probe_export_columns_follow_the_schema() -> None:
    columns = read_nsys_columns(PROBE, None, True)  # with GPU starts and devices
    arrays, r = columns.arrays, columns.ranges
    assert {n: str(a.dtype) for n, a in arrays.items()} == {
        "name": "int32", "duration": "int64", "launch_start": "int64", "launch_thread": "int16",
        "start": "int64", "device": "int16",
    }  # fmt: skip
    assert list(r.columns) == RANGE_COLUMNS
    assert pd.Series(kinds(columns)).value_counts().to_dict() == {"kernel": 25, "memset": 6}
    assert int(arrays["duration"].sum()) == 16_909_599
    assert int(arrays["duration"][kinds(columns) == "kernel"].sum()) == 16_903_327
    # Every activity found its launch call; the backward ones on autograd's own thread.
    assert (arrays["launch_start"] >= 0).all()
    threads = columns.launch_threads(arrays["launch_thread"])
    assert pd.Series(threads).value_counts().to_dict() == {PROBE_MAIN: 17, PROBE_AUTOGRAD: 14}
    assert (arrays["launch_start"] < arrays["start"]).all()
    assert r["name"].tolist() == ["forward", "backward"] * 3
    assert r["depth"].tolist() == [0] * 6 and set(r["domain"]) == {""}
    assert set(r["thread"]) == {PROBE_MAIN}
    assert columns.meta["tool_version"] == "2025.3.2.0"
    assert columns.meta["gpu"] == "NVIDIA H100 80GB HBM3"
    assert columns.meta["thread_names"][PROBE_AUTOGRAD] == "pt_autograd_0"
    assert columns.meta["sidecar"] is None
    assert_columns_are_the_export(columns, PROBE)  # each launch is its own call's, in SQL


def test_probe_names_grids_and_copies() -> None:
    columns = read_nsys_columns(PROBE)
    every = names(columns)
    shapes = columns.shapes_at(np.arange(len(columns)))
    gemm = [i for i, n in enumerate(every) if n.startswith("sm80_xmma_gemm")]
    assert len(gemm) == 3
    assert {shapes[i] for i in gemm} == {("16,32,1", "256,1,1")}
    cutlass = [n for n in every if "Kernel2" in n]
    assert (
        cutlass[0]
        == "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(T1::Params)"
    )
    memsets = np.flatnonzero(kinds(columns) == "memset")
    assert set(every[memsets]) == {"[CUDA memset]"} and {shapes[i] for i in memsets} == {("", "")}


@pytest.mark.parametrize(
    ("name", "kernels", "memcpy", "memset", "kernel_ns"),
    [
        (SMALL_FP32, 3858, 98, 72, 37_341_626),
        (SMALL_BF16, 4326, 98, 0, 20_745_051),
        (TINY_COMPILE, 280, 0, 0, 1_304_202),
    ],
)
def test_workload_exports_match_nsys_own_totals(
    unpacked: Path, name: str, kernels: int, memcpy: int, memset: int, kernel_ns: int
) -> None:
    columns = read_nsys_columns(unpack(name, unpacked))
    counts = pd.Series(kinds(columns)).value_counts().to_dict()
    assert counts == {
        key: n for key, n in (("kernel", kernels), ("memcpy", memcpy), ("memset", memset)) if n
    }
    # nsys stats --report cuda_gpu_kern_sum on the same export: same instances and time.
    nsys = pd.read_csv(STATS / f"{name}_cuda_gpu_kern_sum.csv")
    assert nsys["Instances"].sum() == kernels
    kernel_time = int(columns.arrays["duration"][kinds(columns) == "kernel"].sum())
    assert kernel_time == nsys["Total Time (ns)"].sum() == kernel_ns
    assert (columns.arrays["launch_start"] >= 0).all()
    assert columns.meta["sidecar"]["config"]["size"] in ("small", "tiny")


def test_nested_ranges_get_depths_and_other_domains_keep_theirs(unpacked: Path) -> None:
    r = read_nsys_columns(unpack(SMALL_FP32, unpacked)).ranges
    depth = r.groupby("name")["depth"].agg(set).to_dict()
    assert depth["forward"] == depth["backward"] == depth["optimizer"] == {0}
    assert depth["scaled dot product attention"] == {1}
    assert depth["computing softmax"] == depth["final matmul"] == {2}
    # CUB's own NVTX domain ("CCCL"), opened on the autograd thread: kept, in its domain.
    cub = r[r["domain"] == "CCCL"]
    assert cub["name"].tolist() == ["cub::DeviceRadixSort"] * 2 and set(cub["depth"]) == {0}
    assert r.groupby("name").size()["computing attention scores"] == 24  # 12 layers x 2 steps


def test_cuda_graphs_traced_per_node_and_as_a_whole(unpacked: Path) -> None:
    nodes = read_nsys_columns(unpack(GRAPH_NODES, unpacked))
    # A replay's nodes share its one launch call (one correlation id in the export).
    launch = pd.Series(
        list(zip(nodes.arrays["launch_start"], nodes.arrays["launch_thread"], strict=True))
    )
    replayed = launch[launch.map(launch.value_counts()) > 1]
    assert len(replayed) == 12  # 3 replays x (gemm, softmax, memset, sum)
    assert all(start >= 0 for start, _ in replayed)
    whole = read_nsys_columns(unpack(GRAPH_WHOLE, unpacked))
    graphs = np.flatnonzero(kinds(whole) == "graph")
    assert names(whole)[graphs].tolist() == ["[CUDA graph 1]"] * 3
    assert int(whole.arrays["duration"][graphs].sum()) == 245_281
    assert (whole.arrays["launch_start"][graphs] >= 0).all()
    # The start/end range around the replays, and the push/pop ranges inside it.
    r = whole.ranges
    assert r.loc[r["name"] == "replays", "depth"].tolist() == [0]
    assert set(r.loc[r["name"] == "forward", "depth"]) == {1}
    assert set(r.loc[r["domain"] == "mylib", "name"]) == {"lib op"}


def test_export_without_kernels_says_why(tmp_path: Path) -> None:
    path = unpack(OLD_NO_KERNELS, tmp_path)
    with pytest.raises(BadInput) as caught:
        read_nsys_columns(path)
    message = str(caught.value)
    assert "no CUDA kernels were traced" in message and "CUPTI_ACTIVITY_KIND_KERNEL" in message
    assert "2022.4.2.1" in message and "too old" in message and "\n" not in message


def test_export_without_cuda_tracing_says_to_trace_cuda(tmp_path: Path) -> None:
    export = Export(tmp_path / "nvtx-only.sqlite")
    export.range("forward", 0, 10)
    export.conn.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    export.conn.execute("DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    with pytest.raises(BadInput, match=r"CUDA was not traced.*-t cuda,nvtx"):
        read_nsys_columns(export.save())


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    text = tmp_path / "notes.sqlite"
    text.write_text("forward 12 ms\nbackward 30 ms\n")
    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes(PROBE.read_bytes()[:50_000])
    corrupt = tmp_path / "corrupt.sqlite"
    data = bytearray(PROBE.read_bytes())
    for offset in range(3 * 4096, len(data), 4096):
        data[offset : offset + 64] = b"\xff" * 64
    corrupt.write_bytes(bytes(data))
    empty_db = tmp_path / "empty-db.sqlite"
    sqlite3.connect(empty_db).execute("PRAGMA user_version = 1").connection.commit()
    other_db = tmp_path / "other.sqlite"
    sqlite3.connect(other_db).execute("CREATE TABLE results (x)").connection.commit()
    return {
        "missing": (tmp_path / "nope.sqlite", "no such file"),
        "directory": (tmp_path, "is a directory"),
        "empty file": (empty, "is empty (0 bytes)"),
        "not sqlite": (text, "is not an SQLite database"),
        "truncated": (truncated, "is truncated: 50,000 bytes where its header promises 339,968"),
        "corrupt": (corrupt, "is corrupt"),
        "empty database": (empty_db, "is an empty SQLite database"),
        "not nsys": (other_db, "not an Nsight Systems SQLite export"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "directory",
        "empty file",
        "not sqlite",
        "truncated",
        "corrupt",
        "empty database",
        "not nsys",
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path: Path, case: str) -> None:
    path, expected = _bad_inputs(tmp_path)[case]
    with pytest.raises(BadInput) as caught:
        load_columns(path, cache=False)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "locked.sqlite"
    path.write_bytes(PROBE.read_bytes())
    path.chmod(0)
    with pytest.raises(BadInput, match="cannot read"):
        load_columns(path, cache=False)


def test_2022_era_columns_text_names_and_driver_calls(tmp_path: Path) -> None:
    """No globalPid/shortName/textId, EXPORT_META_DATA, a launch found in the DRIVER table."""
    export = Export(
        tmp_path / "old.sqlite",
        pid_column=False,
        short_names=False,
        text_ids=False,
        meta_table="EXPORT_META_DATA",
    )
    export.range("forward", 0, 1_000)
    export.range("open at capture end", 2_000, None)
    export.kernel("gemm_kernel", 100, 50, launch_at=10)
    export.kernel("ampere_sgemm_128x64_tn", 300, 70, launch_at=20, api="cuLaunchKernel",
                  table="CUPTI_ACTIVITY_KIND_DRIVER")  # fmt: skip
    export.kernel("lost_kernel", 5_000, 30, launch_at=None)
    path = export.save()
    columns = read_nsys_columns(path)
    assert launches(columns) == {
        "gemm_kernel": (10, MAIN),
        "ampere_sgemm_128x64_tn": (20, MAIN),  # found in the DRIVER table
        "lost_kernel": (-1, -1),
    }
    # No shortName column: the report's short name is the full name's.
    overall = report(path, top=0).overall.set_index("name")
    assert overall.loc["gemm_kernel", "short_name"] == "gemm_kernel"
    r = columns.ranges.set_index("name")
    assert r.loc["forward", "end"] == 1_000
    assert r.loc["open at capture end", "end"] == 5_030  # the trace's last GPU end
    assert columns.meta["tool_version"] == "2099.1.0"


def test_launches_are_matched_per_process(tmp_path: Path) -> None:
    """Two processes reuse correlation id 1: each kernel gets its own process's launch."""
    export = Export(tmp_path / "two.sqlite")
    other_thread = (1 << 48) | (200 << 24) | 200
    export.kernel("a_kernel", 100, 10, launch_at=50, correlation=1)
    export.kernel("b_kernel", 100, 10, launch_at=70, correlation=1, thread=other_thread, pid=200)
    found = launches(read_nsys_columns(export.save()))
    assert found == {"a_kernel": (50, MAIN), "b_kernel": (70, other_thread)}


def test_launch_calls_with_unusual_names_are_still_found(tmp_path: Path) -> None:
    """The fast path reads launch-like API calls only; anything else is found in a second pass."""
    export = Export(tmp_path / "odd.sqlite")
    export.kernel("k", 100, 10, launch_at=40, api="cudaSomethingNew_v99000", thread=WORKER)
    assert launches(read_nsys_columns(export.save())) == {"k": (40, WORKER)}


def test_sidecar_is_read_and_a_broken_one_is_a_warning(tmp_path: Path) -> None:
    export = Export(tmp_path / "run.sqlite")
    export.kernel("k", 100, 10, launch_at=40)
    path = export.save()
    (tmp_path / "run.profkit.json").write_text(json.dumps({"config": {"size": "large"}}))
    assert read_nsys_columns(path).meta["sidecar"]["config"] == {"size": "large"}
    (tmp_path / "run.profkit.json").write_text("{not json")
    with pytest.warns(ProfkitWarning, match=r"ignored .*run\.profkit\.json: not valid JSON"):
        columns = read_nsys_columns(path)
    assert columns.meta["sidecar"] is None and len(columns) == 1


def test_load_columns_dispatches_by_content_and_suffix(tmp_path: Path) -> None:
    renamed = tmp_path / "profile.data"
    renamed.write_bytes(PROBE.read_bytes())
    read = load_columns(renamed, cache=False)
    assert len(read) == 31 and read.meta["format"] == "nsys-sqlite"  # SQLite magic: an export
    unknown = tmp_path / "trace.txt"
    unknown.write_text("hello")
    with pytest.raises(BadInput, match="not a supported trace"):
        load_columns(unknown, cache=False)


def test_nsys_rep_without_nsys_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROFKIT_NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"not really a report")
    with pytest.raises(MissingTool) as caught:
        load_columns(report, cache=False)
    message = str(caught.value)
    assert "install Nsight Systems" in message and "--nsys" in message
    assert "nsys export --type sqlite run.nsys-rep" in message


def test_nsys_rep_is_exported_once_and_cached(tmp_path: Path) -> None:
    """A stand-in for nsys (none can run here) that "exports" by copying a real export."""
    calls = tmp_path / "calls"
    fake = tmp_path / "nsys"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'while [ "$1" != "--output" ]; do shift; done\n'
        f'cp {PROBE} "$2"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"report")
    first = load_columns(report, nsys=fake, cache=False)
    second = load_columns(report, nsys=fake, cache=False)
    assert len(first) == len(second) == 31
    assert len(calls.read_text().splitlines()) == 1  # the second read used the cached .sqlite
    assert (tmp_path / "run.sqlite").exists()


def test_reading_is_the_same_on_one_or_many_chunks(
    unpacked: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Columns read in chunks of rowids stay aligned row for row."""
    from profkit.traces import nsys_columns

    path = unpack(SMALL_FP32, unpacked)
    whole = read_nsys_columns(path)
    monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", 97)
    chunked = read_nsys_columns(path)
    assert (chunked.names, chunked.kinds) == (whole.names, whole.kinds)
    for name, array in whole.arrays.items():
        np.testing.assert_array_equal(chunked.arrays[name], array, err_msg=name)
    np.testing.assert_array_equal(chunked.threads, whole.threads)
    pd.testing.assert_frame_equal(chunked.ranges, whole.ranges)
    assert_columns_are_the_export(chunked, path)


def test_a_missing_plugin_is_a_plain_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from profkit.traces import load as loader

    monkeypatch.setattr(loader, "PLUGINS", {".trace.gz": "profkit.traces.not_written_yet"})
    path = tmp_path / "run.trace.gz"
    path.write_bytes(b"\x1f\x8b")
    with pytest.raises(BadInput, match="not a supported trace"):
        load_columns(path, cache=False)  # the plugin module does not exist: a plain message


def test_sealed_calls_hold_no_second_copy_of_the_calls() -> None:
    """Calls stored out of key order are sorted at seal: a copy, after which the buffer
    they were written to must be let go (at 33 M calls, keeping both held 0.6 GB more)."""
    from profkit.traces import nsys_columns

    calls = nsys_columns._Calls(tid0=100, base=0, capacity=1_000)
    chunk = {
        "key": np.array([5, 3, 9]),
        "start": np.array([10, 20, 30]),
        "thread": np.zeros(3, np.int64),
    }
    calls.add(calls.prepare(chunk))
    buffer = calls.parts[0].key
    calls.seal()
    assert calls.key.tolist() == [3, 5, 9] and calls.start.tolist() == [20, 10, 30]
    assert not np.shares_memory(calls.key, buffer)
    assert all(value is not buffer for value in vars(calls).values()) and not calls.parts
    assert calls.lookup(np.array([9, 4]))[0].tolist() == [30, -1]


def test_scans_of_several_tables_share_one_window_and_keep_their_rows() -> None:
    """``stream_scans`` runs tables one after the other through one window of chunks (the
    next table's chunks are read while the last one's are taken): each table's chunks come
    in rowid order, whole, and tagged with their scan and bounds."""
    from profkit.traces import sqlite_scan

    tables = ["CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"]
    conn = sqlite_scan.open_readonly(PROBE)
    scans = [
        sqlite_scan.Scan(t, {"id": "correlationId"}, chunks=sqlite_scan.chunk_bounds(conn, t, 7))
        for t in tables
    ]
    with sqlite_scan.ParallelReader(PROBE, threads=3) as reader:
        got = list(reader.stream_scans(conn, scans, ahead=2))
    assert [index for index, _, _ in got] == sorted(index for index, _, _ in got)
    for index, table in enumerate(tables):
        assert [b for i, b, _ in got if i == index] == scans[index].chunks
        read = np.concatenate([chunk["id"] for i, _, chunk in got if i == index]).tolist()
        sql = f"SELECT ifnull(correlationId, -1) FROM {table} ORDER BY rowid"
        assert read == [row[0] for row in conn.execute(sql)]
        assert len(scans[index].chunks or []) > 2  # several chunks a table, more than the window
    conn.close()


def test_a_bad_call_late_in_the_read_is_one_error_and_leaves_no_thread_waiting(
    unpacked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Activities are read ahead while the last calls are still being taken (one window
    across the tables); a call that fails the read (a correlation id of text, in its last
    chunk) ends the read with its error, and the chunks in flight do not keep it waiting."""
    import shutil
    import threading

    from profkit.traces import nsys_columns

    path = tmp_path / "bad-call.sqlite"
    shutil.copy(unpack(SMALL_FP32, unpacked), path)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 'abc' WHERE rowid = "
            "(SELECT max(r.rowid) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            "JOIN CUPTI_ACTIVITY_KIND_KERNEL k USING (correlationId))"
        )
    monkeypatch.setattr(nsys_columns, "CHUNK_ROWS", 500)  # many chunks, activities read ahead
    failed: list[BaseException] = []

    def read() -> None:
        try:
            nsys_columns.read_nsys_columns(path)
        except BaseException as exc:
            failed.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=120)
    assert not reader.is_alive(), "the read hangs"
    assert len(failed) == 1 and isinstance(failed[0], BadInput)
    assert "correlationId holds text ('abc')" in str(failed[0])
