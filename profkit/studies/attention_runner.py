"""Running the attention grid with each cell isolated, in this process or in children.

Why not one child process per cell by default: the default grid has 20 cells per
variant, and each child pays for importing torch, creating a CUDA context and (compiled)
re-warming Inductor — seconds per cell, more than many cells take. An OOM does not need
a new process: the allocator raises, the cell's tensors are released with the exception
and ``empty_cache`` hands the memory back. Other failures (a CUDA error, say) can leave
the context unusable, and we cannot cheaply tell which, so after any non-OOM failure the
remaining cells move to fresh child processes (``python -m profkit.studies.attention_runner``),
each child stopping at its own first such failure. A child that dies mid-cell (killed,
segfault) turns that cell into an ``error`` (or ``oom``) row and the next child goes on.
``isolate="process"`` runs every cell in its own child from the start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from profkit.run.proc import child_env, die_with_parent, kill_tree, private_tempdir, watch_parent
from profkit.studies.attention import (
    AttentionSettings,
    Cell,
    measure_cell,
    new_row,
    prime_device,
)
from profkit.workload.config import resolve_device

OnStart = Callable[[Cell], None]
OnDone = Callable[[dict[str, Any]], None]
POLL_S = 0.2
STDERR_TAIL_CHARS = 2_000


def run_attention(
    settings: AttentionSettings,
    on_start: OnStart | None = None,
    on_done: OnDone | None = None,
    db_path: Path | None = None,
) -> list[dict[str, Any]]:
    """Every cell of the grid, one row each (``ok``, ``oom`` or ``error``), in grid order.

    ``on_start(cell)`` and ``on_done(row)`` report progress. Raises ``MissingTool`` when
    the device is not available, before running anything. On Ctrl-C the cells not yet
    finished come back as ``interrupted`` rows (any running child is killed first).
    """
    settings = settings.replace(device=resolve_device(settings.device))
    cells = settings.cells()
    finished: list[dict[str, Any]] = []

    def done(row: dict[str, Any]) -> None:
        finished.append(row)
        if on_done:
            on_done(row)

    try:
        rows = run_cells(settings, cells, on_start, done)
    except KeyboardInterrupt:
        # Keep what finished: the rest become ``interrupted`` rows, the caller decides.
        rows = finished + [
            {**new_row(settings, cell, torch.device("cpu")), "status": "interrupted", "pid": None}
            for cell in cells[len(finished) :]
        ]
        for row in rows[len(finished) :]:
            row.update(device=settings.device, device_name=None)
    if db_path is not None:
        record_results(rows, db_path)
    return rows


def run_cells(
    settings: AttentionSettings,
    cells: Sequence[Cell],
    on_start: OnStart | None = None,
    on_done: OnDone | None = None,
) -> list[dict[str, Any]]:
    """Run ``cells`` on ``settings.device`` (a concrete device), isolated as ``settings.isolate`` says."""
    start = on_start or (lambda _cell: None)
    done = on_done or (lambda _row: None)
    if settings.isolate == "process":
        return _run_in_children(settings, cells, start, done, one_per_child=True)
    rows = run_here(settings, cells, start, done)
    if len(rows) < len(cells):
        rows += _run_in_children(settings, cells[len(rows) :], start, done, one_per_child=False)
    return rows


def record_results(rows: list[dict[str, Any]], db_path: Path) -> None:
    """Store every row (``ok``, ``oom``, ``error`` alike) in the ``attention`` table.

    Each row carries the environment (GPU, versions, commit) and a run id, as bench rows do.
    """
    from profkit.run.environment import environment
    from profkit.run.results import insert, opened

    env = environment()
    run_id = uuid.uuid4().hex[:12]
    with opened(db_path) as db:
        for row in rows:
            insert(db, "attention", {**row, **env, "run_id": run_id})


def run_here(
    settings: AttentionSettings, cells: Sequence[Cell], on_start: OnStart, on_done: OnDone
) -> list[dict[str, Any]]:
    """Run cells in this process; stop after the first failure that is not an OOM."""
    device = torch.device(settings.device)
    prime_device(device, settings.dtypes)
    rows = []
    for cell in cells:
        on_start(cell)
        row = measure_cell(settings, cell, device)
        rows.append(row)
        on_done(row)
        if row["status"] == "error":
            break
    return rows


def _run_in_children(
    settings: AttentionSettings,
    cells: Sequence[Cell],
    on_start: OnStart,
    on_done: OnDone,
    one_per_child: bool,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    pending = list(cells)
    while pending:
        batch = pending[:1] if one_per_child else pending
        got = _run_child(settings, batch, on_start, on_done)
        rows += got
        pending = pending[len(got) :]  # every child settles at least one cell
    return rows


def _run_child(
    settings: AttentionSettings, cells: Sequence[Cell], on_start: OnStart, on_done: OnDone
) -> list[dict[str, Any]]:
    """One child for ``cells``: rows it wrote, plus a row for the cell it died in, if any."""
    rows: list[dict[str, Any]] = []
    with private_tempdir("attention") as tmp:
        rows_path, stderr_path = tmp / "rows.jsonl", tmp / "stderr.txt"
        argv = [
            sys.executable,
            "-m",
            "profkit.studies.attention_runner",
            "--settings",
            json.dumps(settings.to_dict()),
            "--cells",
            json.dumps([c.__dict__ for c in cells]),
            "--rows",
            str(rows_path),
        ]
        on_start(cells[0])
        with stderr_path.open("w") as stderr:
            # stderr to a file, not a pipe: Inductor can warn more than a pipe buffer holds.
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=child_env(),
                start_new_session=True,
                preexec_fn=die_with_parent(),  # SIGKILL of this process ends the child too
            )
            try:
                while proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=POLL_S)
                    _take_new_rows(rows_path, rows, cells, on_start, on_done)
            except BaseException:  # Ctrl-C included: leave no orphaned GPU process
                kill_tree(proc)
                proc.wait()
                raise
        _take_new_rows(rows_path, rows, cells, on_start, on_done)
        if len(rows) < len(cells) and (not rows or rows[-1]["status"] != "error"):
            died = _died_row(settings, cells[len(rows)], proc.returncode, stderr_path)
            rows.append(died)
            on_done(died)
    return rows


def _take_new_rows(
    path: Path,
    rows: list[dict[str, Any]],
    cells: Sequence[Cell],
    on_start: OnStart,
    on_done: OnDone,
) -> None:
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    for line in lines[len(rows) :]:
        if not line.endswith("\n"):
            break  # the child is still writing it
        rows.append(json.loads(line))
        on_done(rows[-1])
        if len(rows) < len(cells) and rows[-1]["status"] != "error":
            on_start(cells[len(rows)])


def _died_row(
    settings: AttentionSettings, cell: Cell, returncode: int, stderr_path: Path
) -> dict[str, Any]:
    tail = stderr_path.read_text(errors="replace").strip()[-STDERR_TAIL_CHARS:]
    if returncode < 0:
        try:
            reason = f"child killed by {signal.Signals(-returncode).name}"
        except ValueError:
            reason = f"child killed by signal {-returncode}"
    else:
        reason = f"child exited with status {returncode} without a result"
    row = new_row(settings, cell, torch.device("cpu"))
    oom = "out of memory" in tail or "OutOfMemoryError" in tail
    last = tail.splitlines()[-1] if tail else ""
    row.update(
        device=settings.device,
        device_name=None,
        pid=None,
        status="oom" if oom else "error",
        error=reason + (f": {last}" if last else ""),
    )
    return row


def _child_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m profkit.studies.attention_runner")
    parser.add_argument("--settings", required=True, help="AttentionSettings as JSON")
    parser.add_argument("--cells", required=True, help="the cells to run, as a JSON list")
    parser.add_argument("--rows", required=True, type=Path, help="JSON-lines file to append to")
    args = parser.parse_args(argv)
    watch_parent(cleanup=args.rows.parent)
    settings = AttentionSettings.from_dict(json.loads(args.settings))
    cells = [Cell(**c) for c in json.loads(args.cells)]
    with args.rows.open("a") as out:

        def write(row: dict[str, Any]) -> None:
            out.write(json.dumps(row) + "\n")  # one write per line: the parent reads whole lines
            out.flush()

        run_here(settings, cells, lambda _cell: None, write)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
