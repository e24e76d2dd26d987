"""Finding Nsight Systems and exporting ``.nsys-rep`` reports to SQLite.

Lookup order: an explicit ``--nsys PATH``, then ``$PROFKIT_NSYS``, then ``nsys`` on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from profkit.errors import BadInput, MissingTool

INSTALL_HINT = (
    "install Nsight Systems (https://developer.nvidia.com/nsight-systems) and put `nsys` "
    "on PATH, or pass --nsys PATH / set PROFKIT_NSYS"
)


def find_nsys(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The nsys executable to use, or :class:`MissingTool` saying what to install or pass."""
    for candidate, origin in (
        (explicit, "--nsys"),
        (os.environ.get("PROFKIT_NSYS"), "PROFKIT_NSYS"),
    ):
        if candidate:
            path = Path(candidate)
            if path.is_file() and os.access(path, os.X_OK):
                return path
            raise MissingTool(f"{origin} points to {path}, which is not an executable file")
    found = shutil.which("nsys")
    if found:
        return Path(found)
    raise MissingTool(f"Nsight Systems (nsys) was not found: {INSTALL_HINT}")


def nsys_version(nsys: Path) -> str | None:
    """``2025.3.1`` style version of an nsys executable, or None if it does not say."""
    try:
        out = subprocess.run(
            [str(nsys), "--version"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d{4}\.\d+(?:\.\d+)*)", out)
    return match.group(1) if match else None


def export_sqlite(
    report: Path, nsys: str | os.PathLike[str] | None = None, force: bool = False
) -> Path:
    """Export ``report`` (``.nsys-rep``) to SQLite beside it, reusing a fresh export.

    The export is cached as ``<stem>.sqlite``; it is redone when the report is newer or
    ``force`` is set.
    """
    if not report.is_file():
        raise BadInput(f"no such file: {report}")
    target = report.with_suffix(".sqlite")
    if target.exists() and not force and target.stat().st_mtime >= report.stat().st_mtime:
        return target
    exe = find_nsys(nsys)
    argv = [
        str(exe), "export", "--type", "sqlite", "--force-overwrite", "true",
        "--output", str(target), str(report),
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0 or not target.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BadInput(f"nsys export of {report} failed ({proc.returncode}): {tail[0]}")
    return target
