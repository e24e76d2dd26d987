"""``nsys export`` goes to a temporary name and is renamed into place only on success.

nsys cannot run here, so a stand-in ``nsys`` script plays it: a real executable invoked
with nsys's argv, writing to the ``--output`` it is given as nsys does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).parent / "data" / "nsys-2025.3-probe.sqlite"

HALF_THEN_FAIL = f"""#!{sys.executable}
import sys
out = sys.argv[sys.argv.index("--output") + 1]
with open(out, "wb") as f:
    f.write(open({str(PROBE)!r}, "rb").read()[:4096])  # half an export
print("Error: export failed: disk quota exceeded", file=sys.stderr)
sys.exit(1)
"""
GOOD = f"""#!{sys.executable}
import shutil, sys
shutil.copy({str(PROBE)!r}, sys.argv[sys.argv.index("--output") + 1])
"""
GARBAGE_BUT_EXIT_0 = f"""#!{sys.executable}
import sys
open(sys.argv[sys.argv.index("--output") + 1], "w").write("not a database")
"""


def fake_nsys(tmp: Path, name: str, script: str) -> Path:
    path = tmp / name
    path.write_text(script)
    path.chmod(0o755)
    return path


def kernels(tmp: Path, nsys: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "profkit", "kernels", "run.nsys-rep", "--nsys", str(nsys)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_failed_export_leaves_nothing_a_later_run_would_reuse(tmp_path: Path) -> None:
    (tmp_path / "run.nsys-rep").write_bytes(b"a report")
    failed = kernels(tmp_path, fake_nsys(tmp_path, "nsys-fails", HALF_THEN_FAIL))
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1
    assert "nsys export of run.nsys-rep failed (1): Error: export failed" in failed.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nsys-fails", "run.nsys-rep"]

    garbage = kernels(tmp_path, fake_nsys(tmp_path, "nsys-garbage", GARBAGE_BUT_EXIT_0))
    assert garbage.returncode == 2 and "failed (0)" in garbage.stderr
    assert not (tmp_path / "run.sqlite").exists()

    # The next run exports again (nothing half-written to reuse) and analyses the export.
    good = kernels(tmp_path, fake_nsys(tmp_path, "nsys-good", GOOD))
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "run.sqlite").read_bytes() == PROBE.read_bytes()
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


MAGIC_THEN_ZEROS = f"""#!{sys.executable}
import sys
data = open({str(PROBE)!r}, "rb").read()
open(sys.argv[sys.argv.index("--output") + 1], "wb").write(data[:16] + bytes(len(data) - 16))
"""


def test_an_export_that_only_starts_like_sqlite_is_never_kept(tmp_path: Path) -> None:
    """It passes the 16-byte magic check: its header and size are checked too."""
    (tmp_path / "run.nsys-rep").write_bytes(b"a report")
    bad = kernels(tmp_path, fake_nsys(tmp_path, "nsys-zeros", MAGIC_THEN_ZEROS))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "nsys export of run.nsys-rep wrote a damaged database" in bad.stderr
    assert not (tmp_path / "run.sqlite").exists()
    good = kernels(tmp_path, fake_nsys(tmp_path, "nsys-good", GOOD))
    assert good.returncode == 0, good.stderr


def test_a_kept_export_damaged_later_is_exported_again(tmp_path: Path) -> None:
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"a report")
    nsys = fake_nsys(tmp_path, "nsys-good", GOOD)
    expected = kernels(tmp_path, nsys)
    assert expected.returncode == 0, expected.stderr
    kept = tmp_path / "run.sqlite"
    for damage in (PROBE.read_bytes()[:8192], PROBE.read_bytes()[:16] + b"\x00" * 8192):
        kept.write_bytes(damage)  # newer than the report: it would be reused as it is
        again = kernels(tmp_path, nsys)
        assert again.returncode == 0, again.stderr
        assert again.stdout == expected.stdout
        assert kept.read_bytes() == PROBE.read_bytes()
    kept.write_bytes(PROBE.read_bytes()[:8192])
    missing = kernels(tmp_path, tmp_path / "no-nsys-here")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "its export run.sqlite is damaged" in missing.stderr


def test_a_relative_nsys_path_runs_that_file(tmp_path: Path) -> None:
    """``--nsys ./tools/nsys`` (and ``tools/nsys``) is the file there: ``Path("./nsys")``
    prints as ``nsys``, which exec looked up on PATH (a traceback: no such file)."""
    (tmp_path / "tools").mkdir()
    fake_nsys(tmp_path / "tools", "nsys", GOOD)
    for given in ("./tools/nsys", "tools/nsys"):
        (tmp_path / "run.nsys-rep").write_bytes(b"a report")
        (tmp_path / "run.sqlite").unlink(missing_ok=True)
        result = _run(tmp_path, given)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "run.sqlite").read_bytes() == PROBE.read_bytes()


def _run(tmp: Path, nsys: str) -> subprocess.CompletedProcess[str]:
    """``kernels`` with ``--nsys`` exactly as typed (a Path would drop a leading ``./``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "profkit", "kernels", "run.nsys-rep", "--nsys", nsys]
    return subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=120)


def test_an_nsys_that_cannot_be_run_by_export_is_one_line(tmp_path: Path) -> None:
    """Executable bit, no format: exec fails, as it did with a traceback before."""
    (tmp_path / "run.nsys-rep").write_bytes(b"a report")
    broken = fake_nsys(tmp_path, "nsys", "not a program at all\n")
    result = _run(tmp_path, str(broken))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: reading run.nsys-rep needs Nsight Systems")
    assert f"cannot run {broken}: Exec format error" in result.stderr
