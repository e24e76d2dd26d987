"""How big the columnar cache (:mod:`.cache`) may grow, what it holds, and clearing it.

Each entry holds a trace's compact columns (~100 MB for a 3-million-kernel export), so the
cache is capped: after an entry is written, the least recently used ones are removed until
the cache holds at most ``$PROFKIT_CACHE_MAX_MB`` (default :data:`DEFAULT_MAX_MB`; 0 keeps
every entry). An entry counts as used when it is written or read (its folder's mtime,
touched on every hit). ``profkit cache`` shows what the cache holds, ``profkit cache
clear`` empties it. An entry is removed the way one is replaced: moved aside by a rename,
then deleted, so a process reading it keeps the files it opened.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from profkit.errors import BadInput

ENV_MAX = "PROFKIT_CACHE_MAX_MB"
DEFAULT_MAX_MB = 2048  # about twenty 3-million-kernel exports


@dataclass(frozen=True)
class Entry:
    """One cached trace: where it came from, its folder, its size and when it was last used."""

    trace: str
    folder: Path
    size_bytes: int
    used_at: float  # seconds since the epoch


def max_bytes() -> int:
    """The cap in bytes from ``$PROFKIT_CACHE_MAX_MB`` (0: no cap)."""
    text = os.environ.get(ENV_MAX, "").strip()
    if not text:
        return DEFAULT_MAX_MB << 20
    try:
        value = float(text)
    except ValueError:
        raise BadInput(f"{ENV_MAX} must be a number of MB (0: no cap); got {text!r}") from None
    if not value >= 0:
        raise BadInput(f"{ENV_MAX} must be >= 0 (MB; 0: no cap); got {text!r}")
    return int(value * (1 << 20))


NAME_LENGTH = 24
"""An entry's folder is named by this many hex digits (of a hash of its trace's path)."""
_ENTRY_NAME = re.compile(f"[0-9a-f]{{{NAME_LENGTH}}}")


def entries(root: Path, index: str) -> list[Entry]:
    """Every entry under ``root`` (the cache's folder of entries; each entry's ``index``
    file names its trace), most recently used first. Only folders named as entries are:
    ``PROFKIT_CACHE_DIR`` may point into a user's own files, which clearing and trimming
    must never remove."""
    found = []
    with contextlib.suppress(OSError):
        for child in os.scandir(root):
            if not _ENTRY_NAME.fullmatch(child.name) or not child.is_dir(follow_symlinks=False):
                continue
            folder = Path(child.path)
            found.append(Entry(_trace_of(folder / index), folder, _size(folder), _used_at(folder)))
    return sorted(found, key=lambda e: e.used_at, reverse=True)


def touch(folder: Path) -> None:
    """Mark an entry used now (a cache hit), so that trimming keeps it longest."""
    with contextlib.suppress(OSError):
        os.utime(folder)


def trim(root: Path, index: str, keep: Path | None = None, limit: int | None = None) -> list[Entry]:
    """Remove the least recently used entries under ``root`` until they hold at most
    ``limit`` bytes (default :func:`max_bytes`; 0: no cap); ``keep`` (the entry just
    written) stays. Returns the entries removed."""
    try:
        limit = max_bytes() if limit is None else limit
    except BadInput:
        return []  # a bad cap is said by `profkit cache`; a read keeps working
    if limit <= 0:
        return []
    held = entries(root, index)
    total = sum(e.size_bytes for e in held)
    removed = []
    for entry in reversed(held):  # oldest first
        if total <= limit:
            break
        if keep is not None and entry.folder == keep:
            continue
        if _remove(entry.folder):
            total -= entry.size_bytes
            removed.append(entry)
    return removed


def clear(root: Path, index: str) -> list[Entry]:
    """Remove every entry under ``root``; returns those removed."""
    return [e for e in entries(root, index) if _remove(e.folder)]


def _remove(folder: Path) -> bool:
    try:
        aside = Path(tempfile.mkdtemp(prefix=".replaced-", dir=folder.parent))
        os.replace(folder, aside / "entry")
    except OSError:
        return False  # gone meanwhile, or not ours to remove
    shutil.rmtree(aside, ignore_errors=True)
    return True


def _trace_of(index: Path) -> str:
    """The trace an entry stands for, from its index (JSON, then the file's seal)."""
    try:
        text = index.read_bytes().decode("latin-1")
        value, _ = json.JSONDecoder().raw_decode(text)
        return str(value["identity"]["path"])
    except (OSError, ValueError, KeyError, TypeError):
        return "?"


def _size(folder: Path) -> int:
    total = 0
    for path, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(path, name)).st_size
    return total


def _used_at(folder: Path) -> float:
    try:
        return folder.stat().st_mtime
    except OSError:
        return 0.0
