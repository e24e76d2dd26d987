"""``profkit memory``: one snapshot per config, each in its own process, and the peak tables.

Each config runs in a child (:func:`profkit.run.child.run_child` with the ``memory`` capture):
warm-up steps, then the allocator's history over the timed steps, dumped to
``OUT_DIR/NAME.pickle`` (protocol 4, for pytorch.org/memory_viz) with a sidecar
``NAME.profkit.json`` (the config, the allocator's own peak counters, the phase marks)
that ``memory summarize`` and ``memory plot`` read. An OOM becomes a row with status
``oom`` and still leaves its snapshot; the sweep goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.errors import BadInput, MissingTool
from profkit.memory.summary import GIB, residual_stream_bytes
from profkit.run.child import run_child
from profkit.run.environment import environment
from profkit.run.proc import check_timeout
from profkit.run.recorder import DEFAULT_MAX_ENTRIES, STACKS
from profkit.run.results import DEFAULT_DB, check_db, record
from profkit.run.torchrun import check_nproc, rank_snapshot_path
from profkit.sidecar import sidecar_path, write_sidecar
from profkit.workload import cuda
from profkit.workload.config import RUN_FIELD_TYPES, RUN_FIELDS, WorkloadConfig

PHASE_COLUMNS = {
    "model_bytes": "after model creation",
    "after_forward_bytes": "after forward",
    "after_backward_bytes": "after backward",
    "after_optimizer_bytes": "after optimizer step",
    "peak_allocated_bytes": "peak allocated",
    "peak_reserved_bytes": "peak reserved",
}
CONFIG_FIELDS = RUN_FIELDS
# The columns of a ``memory`` results row (:func:`result_row` writes them) and their types,
# which the report checks the rows it reads back against.
MEMORY_COLUMNS: dict[str, type] = {
    **RUN_FIELD_TYPES,
    **{name: str for name in ("device", "status", "error", "snapshot", "gpu")},
    **{name: int for name in PHASE_COLUMNS},
    **{f"{name}_bytes": int for name in ("peak_requested", "residual_stream", "snapshot")},
}


def check_capture(configs: list[WorkloadConfig], max_entries: int, stacks: str) -> None:
    """Fail early, in the parent, on what no child could do."""
    if stacks not in STACKS:
        raise BadInput(f"unknown --stacks {stacks!r}; choose one of: {', '.join(STACKS)}")
    if max_entries < 1:
        raise BadInput(f"--max-entries must be at least 1, got {max_entries}")
    for config in configs:
        if config.device not in ("auto", "cuda"):
            raise BadInput(
                f"--device {config.device}: snapshots record the CUDA caching allocator; "
                "use --device cuda (or auto)"
            )
    if cuda.device_count() == 0:
        raise MissingTool(
            "memory snapshots need a CUDA device and none is visible here "
            "(`profkit memory summarize` and `profkit memory plot` work anywhere)"
        )
    for config in configs:
        check_nproc(config, "cuda")


def snapshot_stem(config: WorkloadConfig, name: str | None, sweep: bool) -> str:
    """``NAME`` for one config, ``NAME-<config label>`` in a sweep, else ``memory-<label>``."""
    if name and not sweep:
        return name
    return f"{name or 'memory'}-{config.label()}"


def snapshot_path(out_dir: Path, config: WorkloadConfig, name: str | None, sweep: bool) -> Path:
    """``OUT_DIR/STEM.pickle`` (:func:`snapshot_stem`); ranks add ``-rankR`` to it."""
    return out_dir / f"{snapshot_stem(config, name, sweep)}.pickle"


def written_paths(configs: list[WorkloadConfig], out_dir: Path, name: str | None) -> list[Path]:
    """The snapshots (one per rank of a several-rank config) and sidecars a capture of
    ``configs`` writes (what its --out must not name)."""
    paths = []
    for config in configs:
        snapshot = snapshot_path(out_dir, config, name, len(configs) > 1)
        ranks = [rank_snapshot_path(snapshot, r) for r in range(config.nproc)]
        for written in ranks if config.nproc > 1 else [snapshot]:
            paths += [written, sidecar_path(written)]
    return paths


def capture(
    configs: list[WorkloadConfig],
    out_dir: Path = Path("profiles"),
    name: str | None = None,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    stacks: str = "python",
    timeout_s: float | None = None,
    on_config: Callable[[int, WorkloadConfig], None] | None = None,
    db_path: Path = DEFAULT_DB,
) -> list[dict[str, Any]]:
    """Capture one snapshot per config; return one row per config (see :func:`result_row`).

    Each row is committed to the ``memory`` table of the results DB as soon as its config
    finishes, so an interrupted sweep keeps every finished config.
    """
    check_capture(configs, max_entries, stacks)
    check_timeout(timeout_s)
    check_db(db_path)
    if name is not None and (not name or "/" in name or name.startswith(".")):
        raise BadInput(f"--name {name!r}: give a plain file name (no '/')")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    rows = []
    for index, config in enumerate(configs):
        if on_config:
            on_config(index, config)
        snapshot = snapshot_path(out_dir, config, name, len(configs) > 1)
        options = {"snapshot": str(snapshot), "max_entries": max_entries, "stacks": stacks}
        result = run_child(config, "memory", timeout_s=timeout_s, capture_options=options)
        if config.nproc > 1:  # each rank wrote NAME-rankR.pickle; the row shows rank 0's
            snapshot = rank_snapshot_path(snapshot, 0)
        row = result_row(result, snapshot)
        _write_sidecar(snapshot, result, row)
        record(db_path, "memory", {**row, **environment()})
        rows.append(row)
    return rows


def result_row(result: dict[str, Any], snapshot: Path) -> dict[str, Any]:
    """One flat row: the config, the status, the memory after each phase and the peaks."""
    config = result["config"]
    memory = result.get("memory") or {}
    row: dict[str, Any] = {key: config.get(key) for key in CONFIG_FIELDS}
    row.update(
        device=result.get("device"),
        status=result["status"],
        error=result.get("error"),
        model_bytes=memory.get("model_bytes"),
        after_forward_bytes=memory.get("after_forward_bytes"),
        after_backward_bytes=memory.get("after_backward_bytes"),
        after_optimizer_bytes=memory.get("after_optimizer_bytes"),
        peak_allocated_bytes=memory.get("max_memory_allocated_bytes"),
        peak_reserved_bytes=memory.get("max_memory_reserved_bytes"),
        peak_requested_bytes=memory.get("peak_requested_bytes"),
        residual_stream_bytes=residual_stream_bytes(config),
        snapshot=str(snapshot) if snapshot.exists() else None,
        snapshot_bytes=memory.get("snapshot_bytes"),
        gpu=memory.get("device_name"),
    )
    if memory.get("snapshot_error"):
        row["error"] = (row["error"] + "; " if row["error"] else "") + memory["snapshot_error"]
    return row


def _write_sidecar(snapshot: Path, result: dict[str, Any], row: dict[str, Any]) -> None:
    if not snapshot.exists():
        return
    memory = result.get("memory") or {}
    sidecar = {
        "config": result["config"],
        "status": result["status"],
        "error": result.get("error"),
        "phase_marks": memory.get("phase_marks", []),
        "capture": {k: v for k, v in memory.items() if k != "phase_marks"},
        "row": row,
    }
    write_sidecar(sidecar_path(snapshot), sidecar)


def _gib(value: int | None) -> float | None:
    return None if value is None else value / GIB


def _label(row: dict[str, Any]) -> str:
    return WorkloadConfig.from_dict({**row, "device": "auto"}).label()


def phase_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Per config: GiB allocated after each phase, and the peaks."""
    records = []
    for row in rows:
        record: dict[str, Any] = {"config": _label(row), "status": row["status"]}
        for key, title in PHASE_COLUMNS.items():
            record[f"{title} (GiB)"] = _gib(row.get(key))
        record["snapshot"] = row.get("snapshot") or "—"
        records.append(record)
    return pd.DataFrame(records)


def peak_table(rows: list[dict[str, Any]]) -> pd.DataFrame | None:
    """The sweep's peak allocated GiB: one row per size and context, a column per
    mode and dtype (``forward fp32``, ``train bf16``...); ``OOM`` where it ran out."""
    if len(rows) < 2:
        return None
    cells: dict[tuple[Any, ...], dict[str, str]] = {}
    columns: list[str] = []
    for row in rows:
        key = (row["size"], row["ctx"], row["batch"], row["attention"], row["compile"])
        column = f"{row['mode']} {row['dtype']}"
        if column not in columns:
            columns.append(column)
        peak = row.get("peak_allocated_bytes")
        if row["status"] == "oom":
            value = "OOM"
        elif row["status"] != "ok" or peak is None:
            value = row["status"]
        else:
            value = f"{peak / GIB:,.2f}"
        cells.setdefault(key, {})[column] = value
    table = []
    for (size, ctx, batch, attention, compiled), values in cells.items():
        record: dict[str, Any] = {"size": size, "ctx": ctx}
        if any(k[2] != 4 for k in cells):
            record["batch"] = batch
        if any(k[3] != "naive" for k in cells):
            record["attention"] = attention
        if any(k[4] for k in cells):
            record["compile"] = compiled
        record.update({c: values.get(c, "—") for c in columns})
        table.append(record)
    return pd.DataFrame(table)


def capture_tables(rows: list[dict[str, Any]]) -> list[tuple[str, pd.DataFrame]]:
    tables = [
        (
            "Memory by phase (GiB = 1024^3 bytes; allocated after the last timed step's phases)",
            phase_table(rows),
        )
    ]
    peaks = peak_table(rows)
    if peaks is not None:
        tables.append(("Peak allocated memory (GiB)", peaks))
    return tables
