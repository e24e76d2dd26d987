"""Progress of Chrome trace reads: bytes of the file on disk, as the bar shows them.

Real torch.profiler fixtures (``tests/data/torch-*.json.gz``), read in small chunks so that
the callback hears many times: the positions rise to exactly the file's size on disk (the
compressed size of a ``.gz`` / ``.xz``), and what is read is the same with or without a
listener. The nsys side (rows read / total) is tested in ``test_scale.py``.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from column_checks import assert_same_columns
from rich.console import Console
from typer.testing import CliRunner

from profkit.cli import app, render
from profkit.traces.chrome import read_chrome_columns
from profkit.traces.load import load_columns, load_columns_of

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("torch-*.json.gz"))
TRAIN = DATA / "torch-small-ctx128-train.json.gz"
RANKS = [
    DATA / "torch-h200x2-small-ddp2-rank0.json.gz",
    DATA / "torch-h200x2-small-ddp2-rank1.json.gz",
]
SMALL_CHUNK = 64 << 10


class Heard(list[tuple[int, int, str]]):
    """A progress callback keeping every call."""

    def __call__(self, done: int, total: int, unit: str = "rows", /) -> None:
        self.append((done, total, unit))

    def positions(self) -> list[int]:
        return [done for done, _, _ in self]


def assert_rises_to(heard: Heard, size: int, calls: int = 5) -> None:
    assert len(heard) >= calls
    assert {unit for _, _, unit in heard} == {"bytes"}
    assert {total for _, total, _ in heard} == {size}
    done = heard.positions()
    assert done == sorted(done) and done[0] > 0
    assert done[-1] == size


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_a_gzip_trace_reports_compressed_bytes_up_to_its_size(path: Path) -> None:
    heard = Heard()
    columns = read_chrome_columns(path, chunk_bytes=SMALL_CHUNK, progress=heard)
    assert_rises_to(heard, path.stat().st_size)  # the compressed size, not the JSON's
    assert heard.positions()[-1] < len(gzip.decompress(path.read_bytes()))
    assert len(set(heard.positions())) >= 3  # the position really moves while streaming
    assert_same_columns(columns, read_chrome_columns(path, chunk_bytes=SMALL_CHUNK))


@pytest.mark.parametrize("kind", ["json", "json.xz"])
def test_plain_and_xz_traces_report_their_own_bytes(kind: str, tmp_path: Path) -> None:
    text = gzip.decompress(TRAIN.read_bytes())
    path = tmp_path / f"train.{kind}"
    path.write_bytes(lzma.compress(text) if kind.endswith("xz") else text)
    heard = Heard()
    columns = read_chrome_columns(path, chunk_bytes=SMALL_CHUNK, progress=heard)
    assert_rises_to(
        heard, path.stat().st_size, calls=3 if kind.endswith("xz") else len(text) // SMALL_CHUNK
    )
    assert columns.meta["events"] == len(json.loads(text)["traceEvents"])


def test_a_whole_document_read_reports_the_whole_file_once() -> None:
    heard = Heard()
    read_chrome_columns(TRAIN, chunk_bytes=None, progress=heard)
    assert heard == [(TRAIN.stat().st_size, TRAIN.stat().st_size, "bytes")]


def test_load_columns_passes_the_progress_to_the_chrome_reader() -> None:
    heard = Heard()
    listened = load_columns(TRAIN, cache=False, progress=heard)
    assert_rises_to(heard, TRAIN.stat().st_size, calls=2)
    silent = load_columns(TRAIN, cache=False)
    for name, values in silent.arrays.items():
        np.testing.assert_array_equal(listened.arrays[name], values)
    assert listened.names == silent.names and listened.shapes == silent.shapes
    pd.testing.assert_frame_equal(listened.ranges, silent.ranges)


def test_several_traces_share_one_progress_in_bytes_of_all_files() -> None:
    heard = Heard()
    files = load_columns_of(RANKS, cache=False, progress=heard)
    sizes = [p.stat().st_size for p in RANKS]
    assert_rises_to(heard, sum(sizes))
    assert sizes[0] in heard.positions()  # the first file ends where the second starts
    for columns, path in zip(files, RANKS, strict=True):
        assert_same_columns(columns, read_chrome_columns(path))


def test_the_cli_off_a_terminal_draws_no_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render, "SHOW_AFTER_S", 0.0)  # a bar from the first report on a terminal
    for paths in ([TRAIN], RANKS):
        args = ["kernels", *map(str, paths), "--no-cache", "-f", "json"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["totals"]["kernels"] > 0
        assert result.stderr == ""
    result = CliRunner().invoke(app, ["diff", str(TRAIN), str(RANKS[0]), "-f", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) and result.stderr == ""


def test_the_bar_on_a_terminal_says_megabytes(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
    monkeypatch.setattr(render, "err_console", screen)
    monkeypatch.setattr(render, "SHOW_AFTER_S", 0.0)
    with render.read_progress(TRAIN.name) as progress:
        read_chrome_columns(TRAIN, chunk_bytes=SMALL_CHUNK, progress=progress)
    drawn = screen.file.getvalue()  # type: ignore[attr-defined]
    assert f"reading {TRAIN.name}" in drawn and "0.4/0.4 MB" in drawn


def test_amounts_read_in_their_units() -> None:
    assert render.amount_read(1_234, 10_962, "rows") == "1,234/10,962 rows"
    assert render.amount_read(123_456, 386_151, "bytes") == "0.1/0.4 MB"
    assert render.amount_read(1_250_000_000, 3_400_000_000, "bytes") == "1.25/3.40 GB"
