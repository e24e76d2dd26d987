"""Outputs are written whole or not at all: a write that fails half way (a full disk) leaves
the earlier file as it was and no temporary file beside it."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app
from profkit.errors import BadInput
from profkit.files import written
from profkit.formats import write_text

DATA = Path(__file__).parent / "data"
TRACE = DATA / "torch-small-ctx128-train.json.gz"
runner = CliRunner()


def _disk_fills_after(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Every text written from now on stops after ``size`` characters with ENOSPC."""
    real = Path.write_text

    def full(self: Path, data: str, *args: object, **kwargs: object) -> int:
        real(self, data[:size], *args, **kwargs)  # type: ignore[arg-type]
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)


def test_a_full_disk_keeps_the_earlier_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "report.md"
    first = runner.invoke(app, ["kernels", str(TRACE), "--out", str(out), "--no-cache"])
    assert first.exit_code == 0, first.output
    before = out.read_bytes()
    assert len(before) > 1024
    _disk_fills_after(monkeypatch, 100)
    second = runner.invoke(
        app, ["kernels", str(TRACE), "--out", str(out), "--no-cache", "--top", "3"]
    )
    assert second.exit_code == 2
    assert second.output.strip().splitlines() == [
        f"error: cannot write {out}: {os.strerror(errno.ENOSPC)}"
    ]
    assert out.read_bytes() == before  # not truncated to the new report's first 100 bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_a_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    out = tmp_path / "table.csv"
    out.write_text("old\n")
    out.chmod(0o640)
    write_text(out, "new\n")
    assert out.read_text() == "new\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o640


def test_a_new_file_gets_the_umask_s_permissions(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        write_text(tmp_path / "new.md", "x")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.md").stat().st_mode) == 0o644


def test_an_interrupted_writer_leaves_no_file(tmp_path: Path) -> None:
    out = tmp_path / "never.png"
    with pytest.raises(KeyboardInterrupt), written(out) as temporary:
        temporary.write_bytes(b"half")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_place_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(BadInput, match="cannot write") as caught:
        write_text(tmp_path / "file" / "out.md", "x")
    assert "\n" not in str(caught.value)


def test_a_fifo_or_device_is_written_in_place_never_replaced(tmp_path: Path) -> None:
    """``--out /dev/null`` replaced the device node with a plain file (as root; others got
    "permission denied" for a temporary file in /dev). A FIFO stands in for the device
    here: its reader gets the whole report, and the FIFO is still a FIFO."""
    expected = tmp_path / "report.md"
    assert runner.invoke(app, ["kernels", str(TRACE), "--out", str(expected)]).exit_code == 0
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    result = runner.invoke(app, ["kernels", str(TRACE), "--out", str(fifo)])
    reader.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert got == [expected.read_bytes()]
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.md", "report.md"]


def test_a_symlink_is_kept_and_its_target_replaced(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    target = tmp_path / "kept" / "table.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(Path("kept") / "table.csv")
    write_text(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(Path("kept") / "new.csv")
    write_text(dangling, "made\n")
    assert dangling.is_symlink() and (tmp_path / "kept" / "new.csv").read_text() == "made\n"
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["new.csv", "table.csv"]


def test_a_device_that_fails_the_write_is_one_line(tmp_path: Path) -> None:
    """A FIFO whose reader left at once stands for a device that refuses the write
    (``/dev/full``): one line, no file made beside it."""
    fifo = tmp_path / "gone.md"
    os.mkfifo(fifo)
    opener = threading.Thread(target=lambda: os.close(os.open(fifo, os.O_RDONLY)))
    opener.start()
    with pytest.raises(BadInput, match=f"cannot write {fifo}: Broken pipe"), written(fifo) as place:
        assert place == fifo
        place.write_text("x" * 1_000_000)  # more than a pipe holds: the reader has left
    opener.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gone.md"]
