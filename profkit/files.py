"""Output paths checked before the work: one place says why a path cannot be written.

Commands call :func:`check_writable` on every path they will write (``--out``, ``--db``,
``--report``) before running anything, so a typo costs a second, not a whole sweep, and
:func:`check_output` on every output: one that names an input, the results DB or an
existing database, trace or snapshot is refused, so ``--out`` can never destroy data.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from profkit.errors import BadInput

PROFILES_DIR = Path("profiles")
"""Where runs write their artefacts (traces, exports, snapshots, the results DB) by default."""
REPORTS_DIR = Path("reports")
"""Where runs write their markdown reports by default. Committed results live elsewhere
(``docs/results/``), so no command and no README example can overwrite them."""


def output_dirs(out_dir: Path | None, reports_dir: Path | None = None) -> tuple[Path, Path]:
    """``(artefacts dir, reports dir)`` of a run.

    A directory the user named holds every file the command writes, its report included;
    without one, artefacts go to ``profiles/`` and the report to ``reports/``.
    """
    if reports_dir is None:
        reports_dir = out_dir if out_dir is not None else REPORTS_DIR
    return (out_dir if out_dir is not None else PROFILES_DIR), reports_dir


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # e.g. a parent we may not search: treat as there, let the probe say why
        return True


def check_writable(path: Path | str) -> None:
    """Raise :class:`BadInput` unless ``path`` can be written; creates nothing.

    An existing file is opened for appending (not truncated); for a new one, a probe file is
    created and removed in the nearest existing ancestor directory. ``os.access`` alone is
    not enough: as root it says yes to ``/proc`` and to read-only mounts.
    """
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"cannot write {path}: it is a directory")
    ancestor = next(p for p in (path.parent, *path.parent.parents) if _exists(p))
    if not ancestor.is_dir():
        raise BadInput(f"cannot write {path}: its parent {ancestor} is a file, not a directory")
    try:
        if path.exists():
            with path.open("ab"):
                pass
        else:
            with tempfile.NamedTemporaryFile(dir=ancestor, prefix=".profkit-write-check-"):
                pass
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
    if not os.access(ancestor, os.W_OK | os.X_OK):  # a probe may pass where later writes fail
        raise BadInput(f"cannot write {path}: permission denied")


# What an existing file holds, told by its first bytes (or, for an nsys report, its name).
# Outputs of profkit are text, CSV, JSON and pictures: none of these may be overwritten by one.
_SQLITE_MAGIC = b"SQLite format 3\x00"
_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_SNIFF_BYTES = 4096
# Keys that open a torch.profiler / Chrome trace (``schemaVersion`` comes first in torch's).
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"displayTimeUnit"')


def file_kind(path: Path) -> str | None:
    """What ``path`` holds if it is data profkit reads (and must never overwrite), else None.

    ``an SQLite database`` (a results DB or an nsys export), ``an Nsight Systems report``,
    ``a Chrome trace``, ``a compressed file`` (a ``.json.gz`` trace, a ``.pickle.xz``
    snapshot) or ``a pickle`` (a memory snapshot). Text, CSV, markdown, JSON tables and
    pictures are None: writing a new version of those is what ``--out`` is for.
    """
    if path.suffix.lower() == ".nsys-rep":
        return "an Nsight Systems report"
    try:
        with path.open("rb") as handle:
            head = handle.read(_SNIFF_BYTES)
    except OSError:
        return None
    if head.startswith(_SQLITE_MAGIC):
        return "an SQLite database"
    if head.startswith((_GZIP_MAGIC, _XZ_MAGIC)):
        return "a compressed file"
    if len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5:  # PROTO opcode, protocol 2-5
        return "a pickle"
    if head.lstrip().startswith(b"{") and any(key in head for key in _TRACE_KEYS):
        return "a Chrome trace"
    return None


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: resolved (symlinks, ``..``) or the same inode."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def export_path(report: Path) -> Path:
    """Where the SQLite export of an ``.nsys-rep`` goes (beside it): ``run.nsys-rep`` -> ``run.sqlite``."""
    return report.with_suffix(".sqlite")


def check_output(
    path: Path | str, inputs: Iterable[Path | str | None] = (), option: str = "--out"
) -> None:
    """Refuse (:class:`BadInput`, one line) an output path that would destroy data; creates nothing.

    Refused: a path that is one of ``inputs`` (the files the command reads, its results
    DB), by any spelling (relative, through a symlink, a hard link) — or the SQLite export
    an ``.nsys-rep`` input is read through; and an existing file of a kind profkit reads
    (:func:`file_kind`: a database, a trace, a snapshot). Then :func:`check_writable`.
    Commands call this before any work, so nothing has been measured or written yet.
    """
    path = Path(path)
    for given in inputs:
        if given is None:
            continue
        given = Path(given)
        candidates = [given]
        if given.suffix.lower() == ".nsys-rep":
            candidates.append(export_path(given))
        for candidate in candidates:
            if _same_file(path, candidate):
                raise BadInput(
                    f"{option} {path} is the input {candidate}: writing it would destroy it "
                    f"(give {option} another file)"
                )
    if path.is_file():
        kind = file_kind(path)
        if kind is not None:
            raise BadInput(
                f"{option} {path} is {kind}; profkit will not overwrite it with its output "
                f"(give {option} another file)"
            )
    check_writable(path)
