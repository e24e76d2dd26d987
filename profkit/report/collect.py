"""What there is to report: the results DB's rows and the artefacts in ``profiles/``.

:func:`collect` reads the ``bench``, ``attention`` and ``memory`` tables (the latest row
of each config, so a config run twice counts once) and lists the traces and snapshots
beside them. It reads no trace itself: the sections do, one file at a time, so one
unreadable file costs its own section, not the report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit.errors import BadInput
from profkit.memory.capture import MEMORY_COLUMNS
from profkit.run import bench as bench_lib
from profkit.run import results
from profkit.studies import attention_rows
from profkit.workload.config import RUN_FIELDS, WorkloadConfig

Row = dict[str, Any]

NSYS_SUFFIXES = (".sqlite",)
NSYS_REPORT_SUFFIXES = (".nsys-rep",)
TORCH_SUFFIXES = (".json.gz", ".pt.trace.json")
SNAPSHOT_SUFFIXES = (".pickle", ".pickle.gz", ".pickle.xz")

# What makes two rows of a table "the same config" (the latest one wins).
ATTENTION_KEY = (
    "impl", "compile", "dtype", "d_head", "seq", "batch", "causal", "iters", "warmup",
    "device", "device_name",
)  # fmt: skip
MEMORY_KEY = (*RUN_FIELDS, "device", "gpu")
MEMORY_REQUIRED = ("size", "ctx", "batch", "mode", "dtype", "status")
BENCH_KEY = ("device", "gpu_name", *RUN_FIELDS)


@dataclass
class Inventory:
    """Everything the report can draw on. Paths are sorted by name; rows are the latest per config."""

    profiles_dir: Path
    db_path: Path
    bench: list[Row] = field(default_factory=list)
    attention: list[Row] = field(default_factory=list)
    memory: list[Row] = field(default_factory=list)
    nsys: list[Path] = field(default_factory=list)
    """Nsight Systems exports (``.sqlite``), and ``.nsys-rep`` reports with no export beside them."""
    torch: list[Path] = field(default_factory=list)
    """torch.profiler Chrome traces (``.json.gz``)."""
    snapshots: list[Path] = field(default_factory=list)
    """CUDA memory snapshots (``.pickle``, also ``.pickle.xz`` / ``.pickle.gz``)."""

    @property
    def empty(self) -> bool:
        return not (
            self.bench or self.attention or self.memory or self.nsys or self.torch or self.snapshots
        )


def collect(profiles_dir: Path, db_path: Path) -> Inventory:
    """Read the results DB and list ``profiles_dir``; a missing DB or directory is just empty.

    Raises :class:`BadInput` for a DB that is not a results DB, or a ``profiles_dir`` that
    is a file.
    """
    inventory = Inventory(Path(profiles_dir), Path(db_path))
    if db_path.exists():
        inventory.bench = latest(bench_lib.load(db_path), BENCH_KEY)
        inventory.attention = latest(attention_rows.load(db_path), ATTENTION_KEY)
        inventory.memory = latest(memory_rows(db_path), MEMORY_KEY)
    if profiles_dir.is_dir():
        files = sorted(p for p in profiles_dir.iterdir() if p.is_file())
        inventory.nsys = _nsys_files(files, db_path)
        inventory.torch = [p for p in files if _ends(p, TORCH_SUFFIXES)]
        inventory.snapshots = [p for p in files if _ends(p, SNAPSHOT_SUFFIXES)]
    elif profiles_dir.exists():
        raise BadInput(f"--profiles {profiles_dir} is a file; give the directory of profiles")
    return inventory


def latest(rows: Iterable[Row], key_fields: Sequence[str]) -> list[Row]:
    """One row per config, in first-seen order: the latest finished one (``ok``, ``oom``),
    else the latest of any status (an ``error`` row shows only if nothing finished)."""
    chosen: dict[Any, Row] = {}
    for row in rows:
        key = tuple(str(row.get(f)) for f in key_fields)
        old = chosen.get(key)
        if old is None or row.get("status") != "error" or old.get("status") == "error":
            chosen[key] = row
    return list(chosen.values())


def memory_rows(db_path: Path) -> list[Row]:
    """Every ``profkit memory`` row in the results DB, oldest first, checked.

    Raises :class:`BadInput` when the ``memory`` table is not one profkit wrote; a cell of
    the wrong type, or a config value no run takes (size ``huge``, ctx 0), reads as null,
    and a row left without its config or status is left out, said in one warning
    (:func:`profkit.run.results.checked_rows`). Config fields an older table lacks take
    their defaults.
    """
    return results.checked_rows(db_path, "memory", MEMORY_REQUIRED, _memory_row)


def _memory_row(row: Row, bad: list[str]) -> Row:
    out = results.typed_cells(row, MEMORY_COLUMNS, bad)
    given = {name: out[name] for name in RUN_FIELDS if out[name] is not None}
    for name, value in given.items():  # the config's own checks, one field at a time
        try:
            WorkloadConfig(**{name: value})
        except BadInput:
            out[name] = given[name] = None
            bad.append(name)
    if all(out[name] is not None for name in MEMORY_REQUIRED):
        config = WorkloadConfig.from_dict({k: v for k, v in given.items() if v is not None})
        out.update({name: getattr(config, name) for name in RUN_FIELDS})
    return out


def _ends(path: Path, suffixes: Sequence[str]) -> bool:
    name = path.name.lower()
    return name.endswith(tuple(suffixes)) and not name.startswith(".")


def _nsys_files(files: list[Path], db_path: Path) -> list[Path]:
    exports = [p for p in files if _ends(p, NSYS_SUFFIXES) and not _same(p, db_path)]
    exported = {p.stem for p in exports}
    # A report with its export beside it is the same run: read the export, no nsys needed.
    reports = [p for p in files if _ends(p, NSYS_REPORT_SUFFIXES) and p.stem not in exported]
    return sorted([*exports, *reports], key=lambda p: p.name)


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def where(row: Row) -> str:
    """The machine a row was measured on: the GPU's name, else the device (``CPU``)."""
    name = row.get("gpu_name") or row.get("gpu") or _device_name(row)
    return str(name) if name else str(row.get("device") or "?").upper()


def _device_name(row: Row) -> str | None:
    name = row.get("device_name")
    return None if name in (None, "cpu", "mps") else str(name)


def group_by(rows: Iterable[Row], key: Callable[[Row], Any]) -> dict[Any, list[Row]]:
    """Rows grouped by ``key``, groups and rows in first-seen order."""
    groups: dict[Any, list[Row]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return groups
