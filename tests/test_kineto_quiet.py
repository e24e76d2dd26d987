"""Kineto's start and stop lines stay off stderr; everything else written there stays.

The lines are those torch 2.13's Kineto wrote to descriptor 2 in ``profkit demo``; the
end-to-end check runs ``profkit torch`` as a real process, since only a process's own
descriptor 2 shows them (the CLI runner sees Python's ``sys.stderr`` alone).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from profkit.run.quiet import Quietly, kineto_quiet, without_kineto_lines

SEEN = (
    b"STAGE:2026-11-23 17:41:45 4215:4215 SyncActivityProfilerHandler.cpp:51] Completed Stage: "
    b"Warm Up\n"
    b"USDT:2026-11-23 17:41:35 4154:4154 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
    b"USDT:2026-11-23 17:41:35 4154:4154 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"
)


def test_only_kineto_lines_are_dropped() -> None:
    others = b"warning: a user's own line\nUSDT is a word here\n[partial"
    assert without_kineto_lines(b"before\n" + SEEN + others) == b"before\n" + others


def test_the_block_drops_kineto_lines_and_writes_the_rest_back(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with kineto_quiet():
        os.write(2, SEEN[:60])  # a line may come in pieces
        os.write(2, SEEN[60:] + b"kept\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "kept\nafter\n"


def test_a_context_manager_is_entered_and_exited_quietly(
    capfd: pytest.CaptureFixture[str],
) -> None:
    class Noisy:
        def __enter__(self) -> str:
            os.write(2, SEEN.splitlines(keepends=True)[0])
            return "entered"

        def __exit__(self, *exc: object) -> bool:
            os.write(
                2,
                b"".join(SEEN.splitlines(keepends=True)[1:]) + f"exit {exc[0].__name__}\n".encode(),
            )  # type: ignore[union-attr]
            return True  # what it returns is passed on: here, the error is swallowed

    with Quietly(Noisy()) as value:
        assert value == "entered"
        raise KeyError
    assert capfd.readouterr().err == "exit KeyError\n"


def test_profkit_torch_prints_no_kineto_lines(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "profkit", "torch", "--size", "tiny", "--ctx", "16", "--steps",
         "1", "--warmup", "1", "--device", "cpu", "--out-dir", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "USDT:" not in done.stderr and "STAGE:" not in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith(f"wrote {out}")
    assert len(list(out.glob("*.json.gz"))) == 2


def test_torch_warning_about_cycles_is_hidden() -> None:
    """torch warns when a profiler prepares a second trace; profkit records one cycle."""
    import warnings

    from torch.profiler import profile, profiler

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler._WARNINGS_SHOWN.clear()  # torch says it once per process
        prof = profile()
        prof.start()
        prof.stop()
        with kineto_quiet():
            prof.start()
            prof.stop()
        assert not [w for w in caught if "clears events" in str(w.message)]
        profiler._WARNINGS_SHOWN.clear()
        prof.start()  # outside the block torch's warning is torch's to give
        prof.stop()
    assert [w for w in caught if "clears events" in str(w.message)]


def test_without_a_temporary_file_the_block_runs_as_it_is(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import tempfile

    ran = []
    saved, tempfile.tempdir = tempfile.tempdir, str(tmp_path / "gone")  # no such folder
    try:
        with kineto_quiet():
            ran.append(True)
            os.write(2, b"said\n")
    finally:
        tempfile.tempdir = saved
    assert ran == [True] and capfd.readouterr().err == "said\n"
