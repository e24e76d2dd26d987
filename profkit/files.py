"""Paths checked at the edge: why an output cannot be written, why an input cannot be read.

Commands call :func:`check_writable` on every path they will write (``--out``, ``--db``,
``--report``) before running anything, so a typo costs a second, not a whole sweep, and
:func:`check_output` on every output: one that names an input, the results DB or an
existing database, trace or snapshot is refused, so ``--out`` can never destroy data. Every
reader opens its input through :func:`check_readable` / :func:`open_input`: a missing file,
a directory, a FIFO or a device is refused in one line, and compressed inputs (xz, gzip,
bzip2, recognised by their first bytes) are read directly.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import shutil
import stat
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from profkit.errors import BadInput

PROFILES_DIR = Path("profiles")
"""Where runs write their artefacts (traces, exports, snapshots, the results DB) by default."""
REPORTS_DIR = Path("reports")
"""Where runs write their markdown reports by default. Committed results live elsewhere
(``docs/results/``), so no command and no README example can overwrite them."""
DEFAULT_DB = PROFILES_DIR / "results.db"
"""The results database every command reads and writes unless given ``--db``. Here, not in
:mod:`profkit.run.results` (which imports sqlite_utils, and with it pandas), so that the
options that show it as a default are declared without importing pandas."""


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
    if path.exists() and not path.is_file():
        # A device or FIFO (/dev/null, a shell's >(...)) is written in place, and opening a
        # FIFO to try would wait for its reader, then hand it an end of file.
        if not os.access(path, os.W_OK):
            raise BadInput(f"cannot write {path}: permission denied")
        return
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


def check_out_dir(path: Path | str, option: str = "--out-dir") -> None:
    """Raise :class:`BadInput` unless ``path`` is a directory files can be written in, or one
    that can be made; creates nothing (a probe file comes and goes in the nearest existing
    directory)."""
    path = Path(path)
    if _exists(path) and not path.is_dir():
        raise BadInput(f"{option} {path} is a file, not a directory (give a new or existing one)")
    ancestor = next(p for p in (path, *path.parents) if _exists(p))
    if not ancestor.is_dir():
        raise BadInput(f"cannot create {path}: its parent {ancestor} is a file, not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=ancestor, prefix=".profkit-write-check-"):
            pass
    except OSError as exc:
        raise BadInput(f"cannot create {path}: {exc.strerror or exc}") from None


# What an existing file holds, told by its first bytes (or, for an nsys report, its name).
# Outputs of profkit are text, CSV, JSON and pictures: none of these may be overwritten by one.
_SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_SHORT_PATH = 400
"""Full paths (bytes) shorter than this SQLite always opens. Its unix VFS opens none longer
than about 500 bytes (``MAX_PATHNAME``, 512, less room for a journal's suffix): a longer
one fails as "unable to open database file", which reads like a damaged file."""
_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_SNIFF_BYTES = 4096
SIDECAR_SUFFIX = ".profkit.json"  # profkit.sidecar's files (that module imports this one)
# Keys that open a torch.profiler / Chrome trace (``schemaVersion`` comes first in torch's).
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"displayTimeUnit"')


def file_kind(path: Path) -> str | None:
    """What ``path`` holds if it is data profkit reads (and must never overwrite), else None.

    ``an SQLite database`` (a results DB or an nsys export), ``an Nsight Systems report``,
    ``a Chrome trace``, ``a compressed file`` (a ``.json.gz`` trace, a ``.pickle.xz``
    snapshot), ``a pickle`` (a memory snapshot) or ``a profkit sidecar`` (the
    ``NAME.profkit.json`` beside an artefact, which ``kernels`` and ``diff`` read; told by
    name, through symlinks). Text, CSV, markdown, JSON tables and pictures are None:
    writing a new version of those is what ``--out`` is for.
    """
    if path.suffix.lower() == ".nsys-rep":
        return "an Nsight Systems report"
    with contextlib.suppress(OSError):
        if path.is_file() and path.resolve().name.lower().endswith(SIDECAR_SUFFIX):
            return "a profkit sidecar (what profkit recorded about a run, read beside it)"
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


def check_not_written(
    path: Path, written: Iterable[Path], option: str = "--out", what: str = "a file this run writes"
) -> None:
    """Refuse (:class:`BadInput`) an output path that is one of the files the command is
    about to write itself (a trace, a snapshot, a report, another output): the output would
    replace it, or it the output."""
    for target in written:
        if _same_file(Path(path), Path(target)):
            alias = "" if str(path) == str(target) else f" ({target})"
            raise BadInput(f"{option} {path} is {what}{alias}: give {option} another file")


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


# Inputs ------------------------------------------------------------------------------------

COMPRESSION_SUFFIXES = (".xz", ".gz", ".bz2")  # what compressed inputs' names end in
_COMPRESSED = (  # magic bytes -> format; inputs are recognised by content, not by name
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
)
_STREAM_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)


@contextlib.contextmanager
def written(path: Path) -> Iterator[Path]:
    """Where to write ``path``'s new content: a temporary file beside it, renamed over
    ``path`` once the block ends, removed if it fails. A full disk, an interrupt or a
    writer's error leaves ``path`` as it was (its old content, or no file); only a
    finished file ever bears the name. An unwritable place is one :class:`BadInput` line.

    A symbolic link is kept: the file it points to is replaced. A device, FIFO or socket
    (``/dev/null``, ``/dev/stdout``, a shell's ``>(...)``) is written in place: it has no
    content to keep, and a rename would put a plain file where the device was (as root,
    in ``/dev`` itself)."""
    if path.exists() and not path.is_file() and not path.is_dir():  # through links
        try:
            yield path
        except OSError as exc:  # /dev/full: no space left
            raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
        return
    path = _real(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    except OSError as exc:
        check_writable(path)  # says why when it can (a parent that is a file, ...)
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        if path.exists():  # keep what the old file allowed (mkstemp makes it 0600)
            os.chmod(temporary, stat.S_IMODE(path.stat().st_mode))
        else:
            os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _real(path: Path) -> Path:
    """``path``, or where its symbolic link(s) lead (a dangling link: where it would)."""
    if not path.is_symlink():
        return path
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a loop: the rename below then says so
        return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_readable(path: Path | str, what: str) -> Path:
    """Raise :class:`BadInput` unless ``path`` is a regular file we can read; return it.

    ``what`` names the expected kind of file ("a memory snapshot"). Anything but a regular
    file is refused at once: a FIFO would block the first read forever, and a device such
    as ``/dev/urandom`` never ends.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise BadInput(f"no such file: {path}") from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise BadInput(f"{path} is a directory, not {what}")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise BadInput(f"{path} is {kind}, not a regular file")
    if not os.access(path, os.R_OK):
        raise BadInput(f"cannot read {path}: permission denied")
    return path


def compression_of(path: Path) -> str | None:
    """``"xz"``, ``"gzip"`` or ``"bzip2"`` when the file's first bytes say so, else None."""
    try:
        with path.open("rb") as handle:
            head = handle.read(6)
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    return next((name for magic, name in _COMPRESSED if head.startswith(magic)), None)


def open_input(path: Path | str, what: str) -> IO[bytes]:
    """Open a checked input for reading, decompressing ``.xz``/``.gz``/``.bz2`` on the fly.

    Compression is recognised by content, so ``run.pickle.xz`` and a gzip file named
    ``trace.json`` both read. Errors of the decompressor surface on read; wrap reads in
    :func:`reading` to turn them into one line.
    """
    path = check_readable(path, what)
    kind = compression_of(path)
    try:
        if kind == "xz":
            return lzma.open(path, "rb")  # type: ignore[return-value]
        if kind == "gzip":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        if kind == "bzip2":
            return bz2.open(path, "rb")  # type: ignore[return-value]
        return path.open("rb")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def open_tracked_input(
    path: Path | str, what: str
) -> Iterator[tuple[IO[bytes], Callable[[], int]]]:
    """:func:`open_input` for the block, with ``position()``: how many bytes of the file on
    disk the reading has consumed so far (compressed bytes for ``.xz``/``.gz``/``.bz2``;
    the file's size once the stream is read to its end). Readers report progress with it.
    """
    path = check_readable(path, what)
    kind = compression_of(path)
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    with raw:
        if kind is None:
            yield raw, raw.tell
            return
        with _decompressing(raw, kind) as stream:
            yield stream, raw.tell


def _decompressing(raw: IO[bytes], kind: str) -> IO[bytes]:
    """``raw`` read through the decompressor of ``kind`` (which leaves ``raw`` open)."""
    if kind == "xz":
        return lzma.LZMAFile(raw, "rb")  # type: ignore[return-value]
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return bz2.BZ2File(raw, "rb")  # type: ignore[return-value]


@contextlib.contextmanager
def reading(path: Path | str) -> Iterator[None]:
    """Turn a decompressor's or the disk's error inside the block into one :class:`BadInput`."""
    try:
        yield
    except _STREAM_ERRORS as exc:
        detail = str(exc) or type(exc).__name__
        kind = compression_of(Path(path))
        what = f"a truncated or corrupt {kind} file" if kind else "truncated or corrupt"
        raise BadInput(f"{path} is {what} ({detail})") from None


def read_input(path: Path | str, what: str) -> bytes:
    """All bytes of an input (decompressed), or one :class:`BadInput` line."""
    with open_input(path, what) as stream, reading(path):
        return stream.read()


@contextlib.contextmanager
def plain_copy(path: Path | str, what: str) -> Iterator[Path]:
    """``path`` itself, or a decompressed temporary copy of it for the block's duration.

    For readers that need a real file (SQLite): an ``.xz``/``.gz`` input is unpacked into a
    temporary directory, never beside the original, and removed afterwards.
    """
    path = check_readable(path, what)
    if compression_of(path) is None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="profkit-unpacked-") as tmp:
        target = Path(tmp) / path.name
        with open_input(path, what) as src, target.open("wb") as dst, reading(path):
            shutil.copyfileobj(src, dst, 1 << 20)
        yield target
