"""``profkit report --run``: measure what the report lacks, one plan piece at a time.

Each piece goes through the library function of its command (``bench.bench``,
``nsys.profile``, ``torchprof.profile_torch``, ``memory.capture.capture``,
``studies.attention_runner.run_attention``) and runs only what is missing: bench configs
already in the DB, traces and snapshots already in ``profiles/``, attention cells already
measured are kept. A piece whose tool is missing here (no CUDA, no nsys) is skipped with
a note, and a piece that fails is noted; neither stops the rest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profkit.errors import MissingTool, ProfkitError
from profkit.report.plan import Piece

# A config that takes longer than this has hung (a torch.compile config takes ~1 min).
CONFIG_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Outcome:
    """What became of one piece: ``ran``, ``present`` (nothing missing), ``skipped`` (its
    tool is missing here) or ``failed``."""

    piece: Piece
    status: str
    note: str
    wall_s: float = 0.0


@dataclass
class Hooks:
    """Progress callbacks (the CLI draws a bar with them); each defaults to doing nothing."""

    piece: Callable[[Piece], None] = lambda _piece: None
    item: Callable[[str], None] = lambda _label: None
    advance: Callable[[int], None] = lambda _units: None
    done: Callable[[Outcome], None] = lambda _outcome: None


@dataclass(frozen=True)
class Where:
    """Where the pieces write: traces and snapshots, the results DB, the reports."""

    profiles_dir: Path
    db_path: Path
    reports_dir: Path


def units(piece: Piece) -> int:
    """Progress units of a piece: its configs, or an attention grid's cells."""
    if piece.kind != "attention":
        return max(len(piece.configs), 1)
    from profkit.studies.attention import DEFAULT_D_HEADS, DEFAULT_SEQS

    grid = piece.attention
    sizes = [
        len(grid.get("d_heads", DEFAULT_D_HEADS)),
        len(grid.get("seqs", DEFAULT_SEQS)),
        len(grid.get("impls", ("naive",))),
        len(grid.get("compile", (False,))),
        len(grid.get("dtypes", ("fp32",))),
    ]
    return math.prod(sizes)


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def run_plan(plan: Sequence[Piece], where: Where, hooks: Hooks | None = None) -> list[Outcome]:
    """Run every piece of ``plan`` in order; one :class:`Outcome` each. Ctrl-C stops the plan
    (what finished stays in the DB and ``profiles/``)."""
    hooks = hooks or Hooks()
    outcomes = []
    for piece in plan:
        hooks.piece(piece)
        counter = _Counter(hooks.advance)
        started = time.perf_counter()
        try:
            status, note = RUNNERS[piece.kind](piece, where, hooks.item, counter.advance)
        except MissingTool as exc:
            status, note = "skipped", str(exc)
        except ProfkitError as exc:
            status, note = "failed", str(exc)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # one broken piece must not cost the rest of the run
            status, note = "failed", f"{type(exc).__name__}: {exc}"
        hooks.advance(max(units(piece) - counter.done, 0))  # skipped units count as done
        outcome = Outcome(piece, status, note, time.perf_counter() - started)
        hooks.done(outcome)
        outcomes.append(outcome)
    return outcomes


class _Counter:
    """Passes progress on and counts it, so a piece that stops early can be made up for."""

    def __init__(self, advance: Callable[[int], None]) -> None:
        self._advance = advance
        self.done = 0

    def advance(self, units: int = 1) -> None:
        self.done += units
        self._advance(units)


Item = Callable[[str], None]
Advance = Callable[[int], None]


def _bench(piece: Piece, where: Where, item: Item, advance: Advance) -> tuple[str, str]:
    from profkit.run import bench as bench_lib

    configs = list(piece.configs)
    bench_lib.resolve_devices(configs)  # no CUDA: MissingTool, before any process starts
    ran = []

    def on_row(_index: int, row: dict[str, Any], resumed: bool) -> None:
        if not resumed:
            ran.append(row)
        advance(1)

    rows = bench_lib.bench(
        configs,
        where.db_path,
        resume=True,
        timeout_s=CONFIG_TIMEOUT_S,
        on_start=lambda _index, config: item(config.label()),
        on_row=on_row,
    )
    if not ran:
        return "present", f"all {len(rows)} configs already in {where.db_path}"
    bad = [f"{r['label']} {r['status']}" for r in ran if r["status"] != "ok"]
    note = f"ran {len(ran)} of {len(rows)} configs" + (f" ({', '.join(bad)})" if bad else "")
    return "ran", note


def _nsys(piece: Piece, where: Where, item: Item, advance: Advance) -> tuple[str, str]:
    from profkit.nsys import profile as nsys_lib

    config = piece.configs[0]
    name = config.label()
    export = where.profiles_dir / f"{name}.sqlite"
    if export.exists():
        return "present", f"{export} exists"
    nsys_lib.require_cuda(config)  # before looking for nsys: no CUDA is the likelier miss
    run = nsys_lib.profile(
        config,
        name,
        where.profiles_dir,
        where.reports_dir,
        progress=item,
        timeout_s=CONFIG_TIMEOUT_S,
    )
    return "ran", f"wrote {run.files.sqlite}"


def _torch(piece: Piece, where: Where, item: Item, advance: Advance) -> tuple[str, str]:
    from profkit.torchprof import profile as torchprof

    config = piece.configs[0]
    name = torchprof.default_name(config)
    modes = ["forward"] if config.mode == "forward" else ["forward", config.mode]
    traces = [where.profiles_dir / f"{name}-{mode}.json.gz" for mode in modes]
    if all(t.exists() for t in traces):
        return "present", f"{', '.join(map(str, traces))} exist"
    item(name)
    result = torchprof.profile_torch(
        config, out_dir=where.profiles_dir, reports_dir=where.reports_dir
    )
    return "ran", f"wrote {', '.join(str(r.trace_path) for r in result.runs)}"


def _memory(piece: Piece, where: Where, item: Item, advance: Advance) -> tuple[str, str]:
    from profkit.memory.capture import capture, snapshot_stem

    def snapshot(config: Any) -> Path:
        return where.profiles_dir / f"{snapshot_stem(config, None, True)}.pickle"

    missing = [c for c in piece.configs if not snapshot(c).exists()]
    if not missing:
        return "present", "every snapshot exists"

    def on_config(index: int, config: Any) -> None:
        advance(1 if index else 0)
        item(config.label())

    rows = capture(
        missing,
        where.profiles_dir,
        timeout_s=CONFIG_TIMEOUT_S,
        on_config=on_config,
        db_path=where.db_path,
    )
    bad = [
        f"{c.label()} {r['status']}"
        for c, r in zip(missing, rows, strict=True)
        if r["status"] != "ok"
    ]
    return "ran", f"captured {len(rows)} snapshots" + (f" ({', '.join(bad)})" if bad else "")


def _attention(piece: Piece, where: Where, item: Item, advance: Advance) -> tuple[str, str]:
    from profkit.studies.attention import AttentionSettings
    from profkit.studies.attention_runner import run_attention
    from profkit.workload.config import resolve_device

    settings = AttentionSettings(**piece.attention)  # no CUDA for device cuda: MissingTool
    settings = settings.replace(device=resolve_device(settings.device))
    if _attention_done(settings, where.db_path):
        return "present", f"every cell is already in {where.db_path}"
    rows = run_attention(
        settings,
        on_start=lambda cell: item(cell.label()),
        on_done=lambda _row: advance(1),
        db_path=where.db_path,
    )
    if any(r["status"] == "interrupted" for r in rows):
        raise KeyboardInterrupt  # the runner kept the finished cells; stop the plan too
    counts = {
        s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)
    }
    return "ran", ", ".join(f"{n} {s}" for s, n in counts.items()) + " cells"


def _attention_done(settings: Any, db_path: Path) -> bool:
    """Whether the DB holds a finished row (ok, oom, skipped) for every cell of ``settings``."""
    from profkit.studies.attention_runner import stored_rows

    return len(stored_rows(settings, db_path)) == len(settings.cells())


RUNNERS: dict[str, Callable[[Piece, Where, Item, Advance], tuple[str, str]]] = {
    "bench": _bench,
    "nsys": _nsys,
    "torch": _torch,
    "memory": _memory,
    "attention": _attention,
}
