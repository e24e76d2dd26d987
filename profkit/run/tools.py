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
from profkit.files import export_path
from profkit.run.proc import die_with_parent

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
                # Absolute: ``Path("./nsys")`` prints as ``nsys``, which exec looks up on PATH.
                return path.absolute()
            found = None if os.sep in str(candidate) else shutil.which(str(candidate))
            if found:  # a command name, as on a command line (--nsys nsys-2025.3)
                return Path(found)
            raise MissingTool(f"{origin} points to {path}, which is not an executable file")
    found = shutil.which("nsys")
    if found:
        return Path(found)
    raise MissingTool(f"Nsight Systems (nsys) was not found: {INSTALL_HINT}")


def nsys_version(nsys: Path) -> str | None:
    """``2025.3.1`` style version of an nsys executable, or None if it does not say."""
    try:
        out = subprocess.run(
            [str(nsys), "--version"], capture_output=True, text=True, errors="replace", timeout=60
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
    ``force`` is set. nsys writes to a temporary name in the same directory, renamed into
    place only when the export succeeded: a failed or interrupted export leaves no
    half-written ``.sqlite`` that a later run would take for a fresh one.
    """
    if not report.is_file():
        raise BadInput(f"no such file: {report}")
    target = export_path(report)
    if target.exists() and not force and target.stat().st_mtime >= report.stat().st_mtime:
        return target
    exe = find_nsys(nsys)
    partial = target.with_name(f".{target.stem}.partial-{os.getpid()}.sqlite")
    argv = [
        str(exe), "export", "--type", "sqlite", "--force-overwrite", "true",
        "--output", str(partial), str(report),
    ]  # fmt: skip
    try:
        try:
            proc = subprocess.run(  # an nsys that fails may print bytes of any encoding
                argv, capture_output=True, text=True, errors="replace", preexec_fn=die_with_parent()
            )
        except OSError as exc:  # not a program (no format, gone since it was found)
            raise MissingTool(f"cannot run {exe}: {exc.strerror or exc}") from None
        if proc.returncode != 0 or not _is_sqlite(partial):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BadInput(f"nsys export of {report} failed ({proc.returncode}): {tail[0]}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False
