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
