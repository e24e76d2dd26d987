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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from profkit.run.proc import child_env, die_with_parent, kill_tree, private_tempdir, watch_parent
from profkit.run.threads import choose_threads
from profkit.studies import attention_rows
from profkit.studies.attention import (
    AttentionSettings,
    Cell,
    measure_cell,
    new_row,
    prime_device,
    warm_up_grid,
)
from profkit.workload.config import resolve_device

OnStart = Callable[[Cell], None]
OnDone = Callable[[dict[str, Any]], None]
POLL_S = 0.2
STDERR_TAIL_CHARS = 2_000

# Stored cells a resumed grid reuses: measured (ok), out of memory or skipped by the host
# memory guard (both would recur). ``error`` cells run again.
REUSABLE = ("ok", "oom", "skipped")


def run_attention(
    settings: AttentionSettings,
    on_start: OnStart | None = None,
    on_done: OnDone | None = None,
    db_path: Path | None = None,
    resume: bool = False,
) -> list[dict[str, Any]]:
    """Every cell of the grid, one row each (``ok``, ``oom``, ``skipped`` or ``error``), in grid order.

    Each finished cell is committed to the ``attention`` table of ``db_path`` as soon as it
    finishes (as ``bench`` does), so a grid killed halfway keeps every finished cell; with
    ``resume`` the cells the DB already holds (:data:`REUSABLE`) are not run again.
    ``on_start(cell)`` and ``on_done(row)`` report progress (resumed rows included).
    Raises ``MissingTool`` when the device is not available, before running anything. On
    Ctrl-C or SIGTERM the cells not yet finished come back as ``interrupted`` rows (not
    stored; any running child is killed first).
    """
    # The thread count is chosen once, so every cell (and every child) runs with the same.
    threads = choose_threads(settings.threads).threads
    settings = settings.replace(device=resolve_device(settings.device), threads=threads)
    cells = settings.cells()
    stored = stored_rows(settings, db_path) if resume and db_path is not None else {}
    finished: dict[Cell, dict[str, Any]] = {}
    with _committer(settings, db_path) as commit:

        def done(row: dict[str, Any]) -> None:
            finished[_cell_of(row)] = row
            commit(row)
            if on_done:
                on_done(row)

        for cell in cells:
            if cell in stored:
                finished[cell] = stored[cell]
                if on_done:
                    on_done(stored[cell])
        # On Ctrl-C keep what finished: the rest become ``interrupted`` rows below.
        with contextlib.suppress(KeyboardInterrupt):
            run_cells(settings, [c for c in cells if c not in stored], on_start, done)
    return [finished.get(cell) or _interrupted_row(settings, cell) for cell in cells]


def _cell_of(row: dict[str, Any]) -> Cell:
    return Cell(row["impl"], bool(row["compile"]), row["dtype"], row["d_head"], row["seq"])


def _interrupted_row(settings: AttentionSettings, cell: Cell) -> dict[str, Any]:
    row = new_row(settings, cell, torch.device("cpu"))
    row.update(status="interrupted", pid=None, device=settings.device, device_name=None)
    return row


@contextlib.contextmanager
def _committer(settings: AttentionSettings, db_path: Path | None) -> Iterator[OnDone]:
    """A function that commits one finished row to the DB at once (a no-op without a DB).

    Each row carries the environment (GPU, versions, commit) and a run id, as bench rows do.
    A DB that could not take the rows is refused here, before the first cell runs.
    """
    if db_path is None:
        yield lambda _row: None
        return
    from profkit.run.environment import environment
    from profkit.run.results import insert, opened, probe_insert

    env = environment()
    run_id = uuid.uuid4().hex[:12]
    with opened(db_path) as db:
        probe = new_row(settings, settings.cells()[0], torch.device(settings.device))
        probe_insert(db, attention_rows.TABLE, {**probe, **env, "run_id": run_id})
        yield lambda row: insert(db, attention_rows.TABLE, {**row, **env, "run_id": run_id})


def _same_settings(row: dict[str, Any], settings: AttentionSettings) -> bool:
    return (row["batch"], bool(row["causal"]), row["iters"], row["warmup"], row["device"]) == (
        settings.batch,
        settings.causal,
        settings.iters,
        settings.warmup,
        settings.device,
    )


def stored_rows(settings: AttentionSettings, db_path: Path) -> dict[Cell, dict[str, Any]]:
    """The cells of ``settings`` (a concrete device) the DB already holds, latest row each."""
    if not db_path.exists():
        return {}
    found: dict[Cell, dict[str, Any]] = {}
    wanted = set(settings.cells())
    for row in attention_rows.load(db_path):
        reusable = row["status"] in REUSABLE and _same_settings(row, settings)
        if reusable and _cell_of(row) in wanted:
            found[_cell_of(row)] = row
    return found


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


def run_here(
    settings: AttentionSettings, cells: Sequence[Cell], on_start: OnStart, on_done: OnDone
) -> list[dict[str, Any]]:
    """Run cells in this process; stop after the first failure that is not an OOM."""
    device = torch.device(settings.device)
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    prime_device(device, settings.dtypes)
    warm_up_grid(settings, device)
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
