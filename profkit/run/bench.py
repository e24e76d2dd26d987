"""The benchmarking sweep: every config in its own process, every row into the results DB.

``bench`` runs each config through :func:`profkit.run.child.run_child`, so a CUDA OOM, a crash
or a killed child becomes a row with ``status: oom|error`` and the sweep goes on. Each row
is committed as soon as its config finishes; ``resume`` skips configs the DB already holds.
Rows follow the ``profkit bench`` JSON contract in docs/JSON.md, plus min/median/max per
phase, every step's times (the first-step effect stays visible), FLOPs and the environment.
"""

from __future__ import annotations

import json
import statistics
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.errors import BadInput
from profkit.run import results, torchrun
from profkit.run.child import run_child
from profkit.run.environment import environment, utc_now
from profkit.run.proc import check_timeout
from profkit.run.stability import (
    MIN_STABLE_STEPS,
    UNSTABLE_CV,
    coefficient_of_variation,
    unstable,
)
from profkit.run.threads import choose_threads
from profkit.workload import flops
from profkit.workload.config import RUN_FIELDS, WorkloadConfig, resolve_device
from profkit.workload.names import PHASES as STEP_PHASES

TABLE = "bench"
PHASES = (*STEP_PHASES, "step")
"""The timed parts of a row: each phase of a step, then the whole step."""
GIB = 1024**3
_AFTER_COMPILE = RUN_FIELDS.index("compile") + 1
# The contract's order: where the run ran right after what it ran.
CONFIG_FIELDS = (*RUN_FIELDS[:_AFTER_COMPILE], "device", *RUN_FIELDS[_AFTER_COMPILE:])
# The contract (docs/JSON.md, ``profkit bench``), in order; every row has all of these keys.
CONTRACT_FIELDS = (
    *CONFIG_FIELDS, "status", "error",
    "forward_ms", "forward_ms_std", "backward_ms", "backward_ms_std",
    "optimizer_ms", "optimizer_ms_std", "step_ms", "step_ms_std",
    "tokens_per_s", "tflops", "mfu", "peak_memory_gib",
)  # fmt: skip
LIST_FIELDS = (*(f"{p}_times_ms" for p in PHASES), "warmup_step_times_ms")
# What a row must have to be compared or reported: which config it was and how it ended.
REQUIRED = ("size", "ctx", "batch", "mode", "dtype", "status")
BOOL_FIELDS = ("compile", "git_dirty", "tf32", "unstable")

# Column types for the DB, so a first row of nulls (an OOM) doesn't decide them.
COLUMN_TYPES: dict[str, type] = {
    **{f: str for f in ("size", "mode", "dtype", "device", "attention", "status", "error")},
    **{f: int for f in ("ctx", "batch", "compile", "warmup", "steps", "nproc")},
    "parallel": str,
    **{
        f"{p}_ms{suffix}": float
        for p in PHASES
        for suffix in ("", "_std", "_min", "_median", "_max")
    },
    **{f: float for f in ("tokens_per_s", "tflops", "mfu", "peak_memory_gib", "peak_tflops")},
    **{f: float for f in ("model_build_s", "wall_s", "timeout_s")},
    **{f: int for f in ("flops_per_step", "git_dirty", "tf32", "threads", "unstable")},
    "step_cv": float,
    "threads_source": str,
    **{f: str for f in LIST_FIELDS},
}

Row = dict[str, Any]
StartHook = Callable[[int, WorkloadConfig], None]
RowHook = Callable[[int, Row, bool], None]
StepHook = Callable[[int, int, int], None]
"""``on_step(index, started, total)``: config ``index`` started its step ``started`` of
``total`` (warm-up steps included; every rank's, for a run of several processes)."""


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "": statistics.fmean(values),
        "_std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "_min": min(values),
        "_median": statistics.median(values),
        "_max": max(values),
    }


def _step_ms(step: dict[str, float | None]) -> float:
    return sum(step.get(f"{p}_ms") or 0.0 for p in STEP_PHASES)


def _throughput(
    config: WorkloadConfig, step_ms: float | None, gpu_name: str | None, tf32: bool
) -> dict[str, float | None]:
    """tokens/s, TFLOP/s and MFU of a step (``gpu_name`` None: not on CUDA, no MFU).

    Several ranks: the step is the slowest rank's (the child merged them so); tokens and
    FLOPs count every rank, MFU is per GPU.
    """
    step_s = step_ms / 1e3 if step_ms else None
    if step_s is None:
        return {"tokens_per_s": None, "tflops": None, "mfu": None}
    tflops = flops.step_flops(config).step * config.nproc / step_s / 1e12
    mfu = flops.mfu(tflops / config.nproc, gpu_name, config.dtype, tf32) if gpu_name else None
    return {
        "tokens_per_s": config.tokens_per_step * config.nproc / step_s,
        "tflops": tflops,
        "mfu": mfu,
    }


def bench_row(
    config: WorkloadConfig, result: dict[str, Any], env: dict[str, Any], tf32: bool = False
) -> Row:
    """One results row from a child's result: the contract fields first, then the extras."""
    device = str(result.get("device") or config.device)
    on_cuda = device.startswith("cuda")
    gpu_name = env.get("gpu_name") if on_cuda else None
    row: Row = {field: getattr(config, field) for field in CONFIG_FIELDS}
    row["device"] = device
    if config.nproc == 1:  # one process is not data parallel: the field does not apply
        row["parallel"] = None
    row["status"] = result.get("status", "error")
    row["error"] = result.get("error")

    ok = row["status"] == "ok"
    steps: list[dict[str, Any]] = (result.get("steps") or []) if ok else []
    per_phase: dict[str, list[float]] = {
        p: [s[f"{p}_ms"] for s in steps if s.get(f"{p}_ms") is not None] for p in STEP_PHASES
    }
    per_phase["step"] = [_step_ms(s) for s in steps]
    stats = {phase: _stats(values) if values else {} for phase, values in per_phase.items()}
    for phase in PHASES:  # the contract's mean and std first; the rest follow it
        for suffix in ("", "_std"):
            row[f"{phase}_ms{suffix}"] = stats[phase].get(suffix)

    row.update(_throughput(config, row["step_ms"], gpu_name if on_cuda else None, tf32))
    peak_bytes = result.get("peak_memory_bytes")
    row["peak_memory_gib"] = peak_bytes / GIB if peak_bytes is not None else None

    # Extras beyond the contract.
    for phase in PHASES:
        for suffix in ("_min", "_median", "_max"):
            row[f"{phase}_ms{suffix}"] = stats[phase].get(suffix)
    row["label"] = config.label()
    row["gpu_name"] = gpu_name
    row["flops_per_step"] = flops.step_flops(config).step * config.nproc
    row["peak_tflops"] = flops.peak_tflops(gpu_name, config.dtype, tf32) if on_cuda else None
    row["tf32"] = tf32 if on_cuda else None
    for phase in PHASES:
        row[f"{phase}_times_ms"] = per_phase[phase]
    row["warmup_step_times_ms"] = [_step_ms(s) for s in result.get("warmup_steps") or []]
    row["threads"] = result.get("threads") or config.threads
    row["step_cv"] = coefficient_of_variation(per_phase["step"]) if ok else None
    row["unstable"] = unstable(per_phase["step"]) if ok else None
    row["model_build_s"] = result.get("model_build_s")
    if result.get("ranks"):
        row["ranks"] = [
            {k: r.get(k) for k in ("rank", "status", "error", "pid", "step_ms")}
            for r in result["ranks"]
        ]
    row["wall_s"] = result.get("wall_s")
    detail = result.get("traceback") or result.get("stderr_tail")
    row["error_detail"] = detail or None
    row.update({k: v for k, v in env.items() if k not in ("gpu_name", "timestamp_utc")})
    row["finished_at"] = utc_now()
    return row


def decode_row(row: dict[str, Any], bad: list[str] | None = None) -> Row:
    """A row read back from SQLite with its lists and booleans restored.

    A cell of the wrong type for its column (text where a number belongs, a list that is
    not JSON, a non-finite time) reads as null; its column is appended to ``bad``.
    """
    out = dict(row)
    for name, kind in COLUMN_TYPES.items():
        value = out.get(name)
        if value is None or name in LIST_FIELDS:
            continue
        if not results.fits(value, kind):
            out[name] = None
            (bad if bad is not None else []).append(name)
    for name in LIST_FIELDS:
        if isinstance(out.get(name), str):
            out[name] = _number_list(out[name])
            if out[name] is None:
                (bad if bad is not None else []).append(name)
    for name in BOOL_FIELDS:
        if out.get(name) is not None:
            out[name] = bool(out[name])
    # Rows from before --nproc (no such column, or null where a later row added it) each
    # ran one process.
    if out.get("nproc") is None:
        out["nproc"] = 1
    if out["nproc"] == 1:  # rows written before it was null said "ddp" for one process
        out["parallel"] = None
    # Rows of several ranks list them; one-process rows never had the column's value.
    if out.get("ranks") is None:
        out.pop("ranks", None)
    elif isinstance(out["ranks"], str):
        ranks = _json_cell(out["ranks"])
        ok = isinstance(ranks, list) and all(isinstance(r, dict) for r in ranks)
        out["ranks"] = ranks if ok else None
        if not ok:
            (bad if bad is not None else []).append("ranks")
    return out


def _number_list(text: str) -> list[float] | None:
    values = _json_cell(text)
    ok = isinstance(values, list) and all(results.fits(v, float) for v in values)
    return values if ok else None


def _json_cell(text: str) -> Any:
    """A cell's JSON, or None where it is not JSON or nests deeper than a parser goes."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def load(db_path: Path | str = results.DEFAULT_DB) -> list[Row]:
    """Every bench row in a results DB, oldest first, decoded.

    Raises :class:`BadInput` when the ``bench`` table is not one profkit wrote (a view, or
    without the config columns); cells of the wrong type read as null, said in one warning.
    """
    return results.checked_rows(db_path, TABLE, REQUIRED, decode_row)


def _done_rows(db: Any) -> dict[str, Row]:
    """Rows a resumed sweep may reuse: finished ones (``ok``, and ``oom``, which would recur).

    ``error`` rows (a crash, a timeout) are run again.
    """
    if not db[TABLE].exists() or "config_key" not in db[TABLE].columns_dict:
        return {}
    done: dict[str, Row] = {}
    for row in db[TABLE].rows_where("status in ('ok', 'oom')", order_by="rowid"):
        done[row["config_key"]] = decode_row(row)  # the latest row of a config wins
    return done


def resolve_devices(configs: Sequence[WorkloadConfig]) -> dict[str, str]:
    """Every requested device made concrete; raises before any child starts if one is missing."""
    return {name: resolve_device(name) for name in dict.fromkeys(c.device for c in configs)}


def bench(
    configs: Sequence[WorkloadConfig],
    db_path: Path | str = results.DEFAULT_DB,
    resume: bool = False,
    timeout_s: float | None = None,
    on_start: StartHook | None = None,
    on_row: RowHook | None = None,
    on_step: StepHook | None = None,
) -> list[Row]:
    """Run every config in its own process; return one row per config, in order.

    Each finished row is committed to the ``bench`` table of ``db_path`` before the next
    config starts. With ``resume``, a config whose row is already in the DB (``ok`` or
    ``oom``) is not run again; its stored row is returned. ``on_start(index, config)`` is
    called before a config runs, ``on_row(index, row, resumed)`` after it has a row,
    ``on_step(index, started, total)`` as its process starts each step.
    """
    if not configs:
        raise BadInput("no configs to run")
    check_timeout(timeout_s)
    devices = resolve_devices(configs)
    for config in configs:  # before any child starts: too few GPUs is one line
        torchrun.check_nproc(config, devices[config.device])
    # Closed on the way out; a DB file that got no row (Ctrl-C first) is removed again.
    with results.opened(db_path) as db:
        env = environment()
        tf32 = flops.tf32_enabled()
        run_id = f"{env['timestamp_utc']}-{uuid.uuid4().hex[:8]}"
        done = _done_rows(db) if resume else {}
        # A DB that cannot take the rows says so now, not after the first config ran.
        probe = bench_row(configs[0], {"status": "error", "error": "probe"}, env, tf32)
        probe.update(config_key="", run_id=run_id, timeout_s=timeout_s)
        results.probe_insert(db, TABLE, probe, COLUMN_TYPES)
        rows: list[Row] = []
        # Chosen once, so every config of the sweep runs with the same count.
        chosen = choose_threads() if any(c.threads is None for c in configs) else None
        for index, config in enumerate(configs):
            device = devices[config.device]
            threads = config.threads or (chosen.threads if chosen else None)
            concrete = config.replace(device=device, threads=threads)
            gpu = env["gpu_name"] if device == "cuda" else None
            key = results.config_key(concrete, device, gpu)
            if key in done:
                rows.append(done[key])
                if on_row:
                    on_row(index, done[key], True)
                continue
            if on_start:
                on_start(index, config)
            result = run_child(
                concrete, timeout_s=timeout_s, on_step=_step_hook(on_step, index, concrete)
            )
            row = bench_row(concrete, result, env, tf32)
            row.update(config_key=key, run_id=run_id, timeout_s=timeout_s)
            row["threads_source"] = "--threads" if config.threads else (chosen and chosen.reason)
            results.insert(db, TABLE, row, COLUMN_TYPES)
            rows.append(row)
            if on_row:
                on_row(index, row, False)
        return rows


# The table a user reads: label column -> (row field, scale). Config columns are added only
# when they vary, and all-empty columns are dropped (no backward in a forward-only sweep).
_DISPLAY = (
    # Short headers: the phase split and the step fit 80 columns (`fwd ms` reads as well).
    ("fwd ms", "forward_ms", 1.0),
    ("fwd std", "forward_ms_std", 1.0),
    ("bwd ms", "backward_ms", 1.0),
    ("bwd std", "backward_ms_std", 1.0),
    ("opt ms", "optimizer_ms", 1.0),
    ("opt std", "optimizer_ms_std", 1.0),
    ("step ms", "step_ms", 1.0),
    ("step std", "step_ms_std", 1.0),
    ("tokens/s", "tokens_per_s", 1.0),
    ("TFLOP/s", "tflops", 1.0),
    ("MFU %", "mfu", 100.0),
    ("peak GiB", "peak_memory_gib", 1.0),
)
_ALWAYS_SHOWN = ("size", "ctx", "mode", "dtype")
ERROR_CHARS = 80


def table(rows: Sequence[Row]) -> pd.DataFrame:
    """The results as a readable table: varying config columns, times and rates.

    ``status`` and ``error`` are shown only when some config did not end ``ok``. ``cv %``,
    the step times' spread (sample std over mean), is there when some row is unstable
    (:func:`stability_note`, the title says the rule): a short number that fits 80 columns
    where a sentence per row did not."""
    frame = pd.DataFrame(rows)
    columns = [
        c
        for c in CONFIG_FIELDS
        if c in frame and (c in _ALWAYS_SHOWN or frame[c].astype(str).nunique() > 1)
    ]
    out = frame[columns].copy()
    failed = (frame["status"] != "ok").any()
    if failed:
        out["status"] = frame["status"]
    for label, field, scale in _DISPLAY:
        values = pd.to_numeric(frame[field], errors="coerce") * scale
        if values.notna().any():
            out[label] = values
    if "tokens/s" in out:
        out["tokens/s"] = out["tokens/s"].round().astype("Int64")
    if "TFLOP/s" in out and out["TFLOP/s"].max() < 1:  # tiny models on a CPU
        out = out.rename(columns={"TFLOP/s": "GFLOP/s"})
        out["GFLOP/s"] *= 1e3
    if "threads" in frame and frame["threads"].astype(str).nunique() > 1:
        out.insert(len(columns), "threads", frame["threads"].astype("Int64"))
    if any(stability_note(row) for row in rows):
        # From the stored step times, as stability_note judges: older rows have no step_cv.
        cv = [
            coefficient_of_variation(list(r.get("step_times_ms") or []))
            if r.get("status") == "ok"
            else None
            for r in rows
        ]
        out["cv %"] = [None if c is None else round(100 * c, 1) for c in cv]
    if failed:
        out["error"] = frame["error"].map(
            lambda e: (
                e if not isinstance(e, str) or len(e) <= ERROR_CHARS else e[:ERROR_CHARS] + "…"
            )
        )
    return out


def _step_hook(
    on_step: StepHook | None, index: int, config: WorkloadConfig
) -> Callable[[int], None] | None:
    if on_step is None:
        return None
    total = (config.warmup + config.steps) * config.nproc
    return lambda started: on_step(index, min(started, total), total)


def stability_note(row: Row) -> str | None:
    """``unstable: cv 23%`` / ``unstable: 2 steps`` for an ``ok`` row not to be read as a
    finding (:func:`unstable`), else None. Worked out from the stored step times, so rows
    recorded before the rule existed are judged the same way."""
    if row.get("status") != "ok":
        return None
    times = list(row.get("step_times_ms") or [])
    if not unstable(times):
        return None
    if len(times) < MIN_STABLE_STEPS:
        return f"unstable: {len(times)} step{'s' if len(times) != 1 else ''}"
    return f"unstable: cv {coefficient_of_variation(times):.0%}"


def title(rows: Sequence[Row]) -> str:
    """A one-line caption: where it ran, with what, and how it was timed."""
    first = rows[0]
    where = first.get("gpu_name") or first.get("device") or "?"
    warmups = sorted({r["warmup"] for r in rows})
    steps = sorted({r["steps"] for r in rows})
    timing = f"{'/'.join(map(str, warmups))} warm-up + {'/'.join(map(str, steps))} timed steps"
    threads = sorted({r["threads"] for r in rows if r.get("threads")})
    on = f" · {'/'.join(map(str, threads))} CPU thread{'s' if threads != [1] else ''}"
    sources = {str(r["threads_source"]) for r in rows if r.get("threads_source")}
    if threads and len(sources) == 1:  # chosen for the user: say from what
        on += f" ({sources.pop()})"
    caption = (
        f"bench · {where} · torch {first.get('torch_version', '?')} · {timing}"
        f"{on if threads else ''} · times are means (ms) ± std over the timed steps"
    )
    if any(stability_note(r) for r in rows):
        caption += (
            f" · unstable: step times spread > {UNSTABLE_CV:.0%} (cv %) or fewer than "
            f"{MIN_STABLE_STEPS} steps; not a finding"
        )
    return caption
