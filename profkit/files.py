"""Output paths checked before the work: one place says why a path cannot be written.

Commands call :func:`check_writable` on every path they will write (``--out``, ``--db``,
``--report``) before running anything, so a typo costs a second, not a whole sweep.
"""

from __future__ import annotations

import os
import tempfile
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
