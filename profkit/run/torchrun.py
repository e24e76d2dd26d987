"""Several ranks of one config: the ``torchrun`` command line, and their results as one.

``--nproc N`` runs the child (:mod:`profkit.run.child`) under
``python -m torch.distributed.run --standalone --nproc-per-node N``: one process per GPU
(or N CPU processes over gloo), rendezvous on this host. torchrun ends every rank as
soon as one fails (``--max-restarts 0``), so a crash or an OOM on one rank never leaves
the others hanging in a collective; a timeout ends the whole tree (``run_child``).

Each rank writes its own result file (``result.rank0.json``, ...); :func:`merge_results`
makes them one: per step, the slowest rank's phase times (a data-parallel step ends when
its last rank does), the worst status, the largest peak memory, and a ``ranks`` list.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from profkit.errors import BadInput
from profkit.workload import cuda
from profkit.workload.config import WorkloadConfig

STATUS_ORDER = ("ok", "oom", "error")  # the merged status is the worst a rank reached


def torchrun_prefix(nproc: int) -> list[str]:
    """The launcher argv before ``-m module args...``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
    ]


def check_nproc(config: WorkloadConfig, device: str) -> None:
    """One clear line when ``--nproc`` asks for more GPUs than this machine has."""
    if config.nproc <= 1 or device != "cuda":
        return
    found = cuda.device_count()
    if config.nproc > found:
        raise BadInput(
            f"--nproc {config.nproc} needs {config.nproc} GPUs; this machine has {found} "
            "(use --nproc <= that, or --device cpu for gloo processes)"
        )


def rank_result_path(result_path: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its result: ``result.rank0.json`` beside ``result.json``."""
    return result_path.with_name(f"{result_path.stem}.rank{rank}{result_path.suffix}")


def rank_snapshot_path(snapshot: Path, rank: int) -> Path:
    """``NAME-rank0.pickle`` for a memory snapshot ``NAME.pickle``."""
    return snapshot.with_name(f"{snapshot.stem}-rank{rank}{snapshot.suffix}")


def merge_results(
    config: WorkloadConfig, results: list[dict[str, Any] | None], died: dict[str, Any]
) -> dict[str, Any]:
    """One result from every rank's (None where a rank wrote none; ``died`` describes why)."""
    ranks = []
    for rank, result in enumerate(results):
        if result is None:
            result = {**died, "status": died.get("status", "error")}
            result["error"] = f"rank {rank} wrote no result: {died.get('error')}"
        ranks.append({"rank": rank, **result})
    # The worst status; among ranks of that status, one that said why (torchrun tears the
    # other ranks down when one fails, so a rank may die before writing its own failure).
    worst = max(
        ranks,
        key=lambda r: (
            STATUS_ORDER.index(r.get("status", "error")),
            results[r["rank"]] is not None,
            -r["rank"],
        ),
    )
    first = ranks[0]
    merged: dict[str, Any] = {
        "config": config.to_dict(),
        "status": worst.get("status", "error"),
        "error": None
        if worst.get("status") == "ok"
        else f"rank {worst['rank']}: {worst.get('error')}",
        # The kind of device the job ran on, as a one-process row says it ("cuda", not rank
        # 0's "cuda:0"): rows that differ only in nproc must match. Each rank's is in ranks.
        "device": str(first.get("device") or "").split(":")[0] or None,
        "world_size": config.nproc,
        "parallel": config.parallel,
        "steps": _slowest_steps([r.get("steps") or [] for r in ranks]),
        "warmup_steps": _slowest_steps([r.get("warmup_steps") or [] for r in ranks]),
        "model_build_s": max((r.get("model_build_s") or 0.0) for r in ranks),
        "wall_s": max((r.get("wall_s") or 0.0) for r in ranks),
        "ranks": [_rank_summary(r) for r in ranks],
    }
    if first.get("memory") is not None:  # the memory capture: rank 0's (each rank's in ranks)
        merged["memory"] = first["memory"]
    peaks = [r["peak_memory_bytes"] for r in ranks if r.get("peak_memory_bytes") is not None]
    merged["peak_memory_bytes"] = max(peaks) if peaks else None
    for key in ("traceback", "stderr_tail"):
        if worst.get(key):
            merged[key] = worst[key]
    return merged


def _step_ms(step: dict[str, Any]) -> float:
    return sum(step.get(f"{p}_ms") or 0.0 for p in ("forward", "backward", "optimizer"))


def _slowest_steps(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Step i of the job = step i of the rank that took longest on it."""
    count = min((len(steps) for steps in per_rank), default=0)
    return [max((steps[i] for steps in per_rank), key=_step_ms) for i in range(count)]


def _rank_summary(result: dict[str, Any]) -> dict[str, Any]:
    steps = result.get("steps") or []
    return {
        "rank": result["rank"],
        "status": result.get("status"),
        "error": result.get("error"),
        "device": result.get("device"),
        "pid": result.get("pid"),
        "host": result.get("host"),
        "peak_memory_bytes": result.get("peak_memory_bytes"),
        "step_ms": [_step_ms(s) for s in steps],
        "trace": result.get("trace"),
        "memory": result.get("memory"),
    }
