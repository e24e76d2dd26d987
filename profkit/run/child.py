"""One config in its own process: the isolation behind sweeps and profiler runs.

The parent (:func:`run_child`) starts ``python -m profkit.run.child`` with a config as JSON;
the child runs warm-up and timed steps and writes one JSON result file. A CUDA OOM or any
exception in the child becomes ``status: oom|error`` in that file; a child that dies
without writing one (killed, segfault) becomes an ``error`` result in the parent. Either
way the sweep goes on.

Captures decide what the child does around the timed steps (``on_timed_start`` /
``on_timed_end``): ``none``; ``cuda-profiler-api`` (cudaProfilerStart/Stop, so that
``nsys --capture-range=cudaProfilerApi`` records only the timed steps); ``memory``
(CUDA allocator history and a snapshot, see ``profkit.run.recorder``; its options
come as JSON in ``--capture-options``); ``torch-trace`` (a torch.profiler Chrome trace
of the timed steps per rank, see ``profkit.run.trace_capture``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from profkit.run import teardown, torchrun
from profkit.run.proc import child_env, die_with_parent, kill_tree, private_tempdir, watch_parent
from profkit.run.threads import thread_env
from profkit.run.torchrun import rank_snapshot_path
from profkit.workload.config import WorkloadConfig, resolve_device

Hooks = tuple[Callable[[], None] | None, Callable[[], None] | None]
CAPTURES = ("none", "cuda-profiler-api", "memory", "torch-trace")
STDERR_TAIL_CHARS = 2_000


def _cuda_profiler_hooks() -> Hooks:
    import torch

    if not torch.cuda.is_available():
        return None, None
    cudart = torch.cuda.cudart()

    def start() -> None:
        torch.cuda.synchronize()
        cudart.cudaProfilerStart()

    def stop() -> None:
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()

    return start, stop


def run_config(
    config: WorkloadConfig, capture: str = "none", capture_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run one config in this process and return its result; never raises for the run itself."""
    import torch

    from profkit.workload import parallel
    from profkit.workload.step import Workload

    result: dict[str, Any] = {"config": config.to_dict(), "status": "ok", "error": None}
    ranks = parallel.from_env()
    if ranks.distributed:
        result.update(rank=ranks.rank, world_size=ranks.world_size, pid=os.getpid())
        result["host"] = socket.gethostname()
    started = time.perf_counter()
    recorder = None
    try:
        if capture == "memory":
            from profkit.run.recorder import MemoryRecorder

            options = dict(capture_options or {})
            if ranks.distributed:  # one snapshot per rank: NAME-rank0.pickle, ...
                snapshot = Path(options["snapshot"])
                options["snapshot"] = str(rank_snapshot_path(snapshot, ranks.rank))
            recorder = MemoryRecorder(**options)
            recorder.begin()
        workload = Workload(config)
        result["device"] = str(workload.device)
        start, stop = _cuda_profiler_hooks() if capture == "cuda-profiler-api" else (None, None)
        if recorder is not None:
            start, stop = recorder.attach(workload)
        step_start = None
        if capture == "torch-trace":  # one Chrome trace per rank: {"stem": ...}
            from profkit.run.trace_capture import RankTracer

            tracer = RankTracer(str((capture_options or {})["stem"]))
            step_start, stop = tracer.hooks(config, ranks.rank)  # steps with the warm-up too
            result["trace"] = str(tracer.path)
        step_start = _reporting_steps(step_start)
        run = workload.run(on_timed_start=start, on_timed_end=stop, on_step_start=step_start)
        result.update(run.to_dict())
        result["threads"] = torch.get_num_threads()
    except torch.OutOfMemoryError as exc:
        result.update(status="oom", error=_first_line(exc))
    except Exception as exc:  # the child reports every failure as data, never a traceback
        result.update(status="error", error=f"{type(exc).__name__}: {_first_line(exc)}")
        result["traceback"] = traceback.format_exc(limit=8)
    if recorder is not None:
        result["memory"] = recorder.finish()  # dumps the snapshot after an OOM too
    result["wall_s"] = time.perf_counter() - started
    if torch.cuda.is_available() and result["status"] != "ok":
        result.setdefault("peak_memory_bytes", torch.cuda.max_memory_allocated())
    return result


PROGRESS_ENV = "PROFKIT_STEP_PROGRESS"
"""A file the child appends one line to as each step starts (warm-up ones included): what
the parent shows as per-step progress (:func:`run_child`'s ``on_step``)."""


def _reporting_steps(hook: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """``hook``, also writing each step's start to ``$PROFKIT_STEP_PROGRESS`` when set."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return hook

    def started(index: int) -> None:
        if hook:
            hook(index)
        with contextlib.suppress(OSError), open(path, "a") as handle:
            handle.write(f"{index}\n")

    return started


def _watch_steps(path: Path, on_step: Callable[[int], None], done: threading.Event) -> None:
    """Call ``on_step(steps started)`` whenever the child's progress file grows."""
    seen = 0
    while True:
        stop = done.wait(PROGRESS_POLL_S)  # one more look once the child has ended
        try:
            count = path.read_text().count("\n")
        except OSError:
            count = seen
        if count != seen:
            seen = count
            on_step(count)
        if stop:
            return


PROGRESS_POLL_S = 0.5


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)  # the parent never sees half a file


def child_argv(
    config: WorkloadConfig,
    result_path: Path,
    capture: str = "none",
    capture_options: dict[str, Any] | None = None,
) -> list[str]:
    """The argv that runs ``config`` in a fresh interpreter (for nsys to wrap, say).

    With ``config.nproc`` > 1, ``torchrun`` starts that many ranks of it.
    """
    options = ["--capture-options", json.dumps(capture_options)] if capture_options else []
    launcher = [sys.executable]
    if config.nproc > 1:
        torchrun.check_nproc(config, resolve_device(config.device))
        launcher = torchrun.torchrun_prefix(config.nproc)
    return [
        *launcher,
        "-m",
        "profkit.run.child",
        "--config",
        config.to_json(),
        "--result",
        str(result_path),
        "--capture",
        capture,
        *options,
    ]


def run_child(
    config: WorkloadConfig,
    capture: str = "none",
    prefix: Sequence[str] = (),
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    capture_options: dict[str, Any] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run ``config`` in a child process (optionally under ``prefix``, e.g. an nsys argv).

    Returns the child's result, or an ``error`` result when it died without writing one.
    ``on_step(n)`` is called (from another thread) as the child starts its n-th step,
    warm-up steps included: per-step progress of a run that can take minutes.
    """
    with private_tempdir("child") as tmp:
        result_path = tmp / "result.json"
        watcher = None
        finished = threading.Event()
        if on_step is not None:
            progress = tmp / "steps"
            env = {**(env or {}), PROGRESS_ENV: str(progress)}
            watcher = threading.Thread(
                target=_watch_steps, args=(progress, on_step, finished), daemon=True
            )
        argv = [*prefix, *child_argv(config, result_path, capture, capture_options)]
        if config.threads is not None:  # OpenMP reads it when torch loads, before any code
            env = {**thread_env(config.threads), **(env or {})}
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",  # a library may print bytes of any encoding
            env=child_env(env),
            start_new_session=True,  # Ctrl-C reaches us; we end the child's whole group
            preexec_fn=die_with_parent(),  # and SIGKILL of us ends the child too
        )
        if watcher is not None:
            watcher.start()
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            _, stderr = proc.communicate()
            return _died(config, f"timed out after {timeout_s:g} s", stderr)
        except BaseException:  # KeyboardInterrupt included: leave no orphaned GPU process
            _kill_group(proc)
            proc.wait()
            raise
        finally:
            finished.set()
            if watcher is not None:
                watcher.join()
        return collect_result(config, result_path, proc.returncode, stderr)


def collect_result(
    config: WorkloadConfig, result_path: Path, returncode: int, output: str | None
) -> dict[str, Any]:
    """The result a finished child left at ``result_path``, or an ``error``/``oom`` row.

    ``output`` is the tail of the child's stderr (or of its whole output when a wrapper such
    as nsys ran it), used to describe a child that died without writing a result. Several
    ranks (``config.nproc`` > 1) each left a file; their results are merged into one.
    """
    if config.nproc > 1:
        paths = [torchrun.rank_result_path(result_path, r) for r in range(config.nproc)]
        found = [json.loads(p.read_text()) if p.exists() else None for p in paths]
        died = _died(config, _describe_exit(returncode), output)
        merged = torchrun.merge_results(config, found, died)
        if returncode != 0 and merged["status"] == "ok":
            merged.update(status="error", error=f"torchrun exited with {returncode}")
        return merged
    if result_path.exists():
        result: dict[str, Any] = json.loads(result_path.read_text())
        if returncode != 0 and result["status"] == "ok":
            result.update(status="error", error=f"child exited with {returncode}")
        return result
    return _died(config, _describe_exit(returncode), output)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    # The whole tree, not just the group: a wrapper (nsys) may regroup the real child.
    kill_tree(proc)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"child killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"child killed by signal {-code}"
    return f"child exited with status {code} without a result"


def _died(config: WorkloadConfig, reason: str, stderr: str | None) -> dict[str, Any]:
    tail = (stderr or "").strip()[-STDERR_TAIL_CHARS:]
    status = "oom" if "OutOfMemoryError" in tail or "out of memory" in tail else "error"
    return {
        "config": config.to_dict(),
        "status": status,
        "error": reason + (f": {tail.splitlines()[-1]}" if tail else ""),
        "stderr_tail": tail,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m profkit.run.child")
    parser.add_argument("--config", required=True, help="WorkloadConfig as JSON")
    parser.add_argument("--result", required=True, type=Path, help="where to write the result")
    parser.add_argument("--capture", default="none", choices=CAPTURES)
    parser.add_argument("--capture-options", type=json.loads, default=None, help="JSON object")
    args = parser.parse_args(argv)
    watch_parent(cleanup=args.result.parent)  # a killed sweep leaves no child running
    config = WorkloadConfig.from_json(args.config)
    from profkit.workload import parallel  # torch: only in the child

    ranks = parallel.from_env()
    result_path = args.result
    if ranks.distributed:
        result_path = torchrun.rank_result_path(args.result, ranks.rank)
    result = run_config(config, args.capture, args.capture_options)
    _write_json(result_path, result)
    if not ranks.distributed:
        return 0
    if result["status"] != "ok":
        return 1  # torchrun then ends the other ranks, which may wait in a collective
    parallel.finish()
    return 0


if __name__ == "__main__":
    status = main()
    teardown.leave(status)  # a rank that traced CUDA: its result is written, end here
    sys.exit(status)
