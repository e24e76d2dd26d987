"""torch.profiler runs of the built-in workload: key_averages tables and Chrome traces.

:func:`profile_torch` profiles one config twice — forward only, then the full step of
its mode (``train`` by default) — the two tables course reports paste by hand. Each run
writes its Chrome trace as ``OUT_DIR/NAME-MODE.json.gz`` (Perfetto and chrome://tracing
open it; ``profkit kernels`` reads it) and the report goes to ``reports/NAME.md``.

A ``torch.profiler.schedule`` makes only the timed steps count
(:func:`profkit.run.trace_capture.timed_schedule`, which the per-rank path shares):
``wait`` covers the warm-up steps but the last, which is the profiler's own ``warmup``
(tracing on, results dropped, so CUPTI's start-up cost stays out of the table), then
``active`` records the timed steps, once (``repeat=1``).

The profiling runs in this process, not in a child like ``profkit bench``: it is one
config, not a sweep an OOM must not stop; the ``FunctionEventAvg`` rows (shapes, stacks)
stay native instead of being serialised; and a second interpreter with torch would add
seconds to every run. The forward-only workload is freed (and the CUDA cache emptied)
before the full-step one is built, and a CUDA OOM becomes a one-line error that keeps
the traces already written.
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profkit import __version__
from profkit.errors import BadInput, ProfkitError
from profkit.files import output_dirs
from profkit.formats import write_text
from profkit.run import teardown
from profkit.run.quiet import Quietly
from profkit.run.threads import choose_threads
from profkit.run.trace_capture import timed_schedule
from profkit.torchprof.report import report_markdown
from profkit.torchprof.result import ProfiledRun, TorchOptions, TorchProfile
from profkit.torchprof.tables import (
    STACK_FRAMES,
    AveragesTable,
    averages_table,
    clean_stack,
)
from profkit.workload.config import WorkloadConfig, resolve_device

if TYPE_CHECKING:
    from profkit.workload.step import Workload

StepHook = Callable[[str, int, int], None]
"""Called after each step with (mode, steps done, steps in the run)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def written_paths(config: WorkloadConfig, name: str | None, out_dir: Path | None) -> list[Path]:
    """The files ``profkit torch`` writes for ``config``: one trace per mode, or one per
    rank, and the report (what its --out must not name)."""
    from profkit.files import output_dirs
    from profkit.run.trace_capture import rank_trace_path

    name = name or default_name(config)
    artefacts, reports = output_dirs(out_dir)
    if config.nproc > 1:
        stem = trace_stem(artefacts, name, config.mode)
        return [*(rank_trace_path(stem, r) for r in range(config.nproc)), reports / f"{name}.md"]
    traces = [trace_path(artefacts, name, m) for m in modes(config)]
    return [*traces, reports / f"{name}.md"]


def modes(config: WorkloadConfig) -> list[str]:
    """The runs profiled: forward alone, then the full step when the mode has one."""
    return ["forward"] if config.mode == "forward" else ["forward", config.mode]


def trace_stem(directory: Path, name: str, mode: str) -> Path:
    """``DIR/NAME-MODE``: the stem of a mode's trace, or of its ranks' traces."""
    return directory / f"{name}-{mode}"


def trace_path(directory: Path, name: str, mode: str) -> Path:
    """``DIR/NAME-MODE.json.gz``: one process's trace of a mode (``NAME`` may hold dots)."""
    return Path(f"{trace_stem(directory, name, mode)}.json.gz")


def default_name(config: WorkloadConfig) -> str:
    """``torch-large-ctx256`` (plus batch, dtype, attention, compile when not the default,
    and ``ddp2``, ``fsdp4``... for several ranks)."""
    parts = ["torch", config.size, f"ctx{config.ctx}"]
    if config.batch != 4:
        parts.append(f"b{config.batch}")
    if config.dtype != "fp32":
        parts.append(config.dtype)
    if config.attention != "naive":
        parts.append(config.attention)
    if config.compile:
        parts.append("compiled")
    if config.nproc > 1:  # as bench labels it: DDP and FSDP runs, 2 or 4 ranks, apart
        parts.append(f"{config.parallel}{config.nproc}")
    return "-".join(parts)


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise BadInput(f"--name {name!r}: use letters, digits and . _ + - only (it names files)")
    return name


def profile_torch(
    config: WorkloadConfig,
    options: TorchOptions | None = None,
    name: str | None = None,
    out_dir: Path | None = None,
    reports_dir: Path | None = None,
    on_step: StepHook | None = None,
) -> TorchProfile:
    """Profile ``config`` forward-only and as a full step; write traces and the report.

    Traces go to ``out_dir`` and the report to ``reports_dir`` (see :func:`output_dirs`).
    """
    out_dir, reports_dir = output_dirs(out_dir, reports_dir)
    options = options or TorchOptions()
    if resolve_device(config.device) == "cpu":  # as many threads as cores are free (run.threads)
        config = config.replace(threads=choose_threads(config.threads).threads)
    result = TorchProfile(
        name=check_name(name or default_name(config)),
        config=config,
        device=resolve_device(config.device),
        options=options,
    )
    for directory in (out_dir, reports_dir):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"cannot create {directory}: {exc.strerror or exc}") from None
    if config.warmup == 0:
        result.warnings.append(
            "--warmup 0: the profiled step includes first-step costs (allocator, autotuning, "
            "profiler start-up)"
        )
    for mode in modes(config):
        try:
            run = _profile_run(
                config.replace(mode=mode),
                result.device,
                options,
                trace_path(out_dir, result.name, mode),
                on_step,
            )
        finally:
            _release_memory(result.device)
        result.runs.append(run)
        if run.table.self_cuda_total_ms is None and result.device == "cuda":
            result.warnings.append(f"{mode}: no CUDA kernel time was recorded")
        asked = options.sort
        if asked and run.table.sort != asked and "cpu" not in asked:
            result.warnings.append(
                f"--sort {asked}: no device time on {result.device}; sorted by self_cpu"
            )
    result.report_path = reports_dir / f"{result.name}.md"
    write_report(result.report_path, report_markdown(result))  # after the runs: notes included
    result.warnings = list(dict.fromkeys(result.warnings))
    return result


def _profile_run(
    config: WorkloadConfig,
    device: str,
    options: TorchOptions,
    trace_path: Path,
    on_step: StepHook | None,
) -> ProfiledRun:
    import torch

    from profkit.workload.step import Workload

    captured: dict[str, AveragesTable] = {}
    try:
        workload = Workload(config, device)
        prof = _profiler(config, device, options, _on_trace_ready(options, trace_path, captured))
        step_ms = _run_steps(prof, workload, config, options, on_step)
    except torch.OutOfMemoryError as exc:
        raise ProfkitError(
            f"{config.label()}: CUDA out of memory under torch.profiler "
            f"({str(exc).splitlines()[0][:160]}); traces already written are kept"
        ) from None
    if "table" not in captured:  # pragma: no cover - the schedule always ends its cycle
        raise ProfkitError(f"{config.label()}: torch.profiler recorded no steps")
    return ProfiledRun(config.mode, captured["table"], trace_path, step_ms)


def _on_trace_ready(
    options: TorchOptions, trace_path: Path, captured: dict[str, AveragesTable]
) -> Callable[[Any], None]:
    """The callback that turns the recorded steps into the table and writes the trace."""

    def on_trace_ready(prof: Any) -> None:
        if options.with_stack:
            for event in prof.events():  # before grouping: group by call sites, not noise
                event.stack = clean_stack(event.stack)
        averages = prof.key_averages(
            group_by_input_shape=options.group_by_shape,
            group_by_stack_n=STACK_FRAMES if options.with_stack else 0,
        )
        captured["table"] = averages_table(
            averages,
            sort=options.sort,
            group_by_shape=options.group_by_shape,
            with_stack=options.with_stack,
            profile_memory=options.profile_memory,
        )
        _export_gzip(prof, trace_path)

    return on_trace_ready


def _profiler(
    config: WorkloadConfig,
    device: str,
    options: TorchOptions,
    on_trace_ready: Callable[[Any], None],
) -> Any:
    """A torch.profiler that records the timed steps only, after the warm-up."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
        teardown.cuda_profiled()  # CUPTI's buffers: end without the teardown (run.teardown)
    return profile(
        activities=activities,
        schedule=timed_schedule(config.warmup, config.steps),  # as each rank's, --nproc N
        on_trace_ready=on_trace_ready,
        record_shapes=options.record_shapes or options.group_by_shape,
        profile_memory=options.profile_memory,
        with_stack=options.with_stack,
        experimental_config=_stack_config(options.with_stack),
    )


def _run_steps(
    prof: Any,
    workload: Workload,
    config: WorkloadConfig,
    options: TorchOptions,
    on_step: StepHook | None,
) -> list[float]:
    """Step the workload under ``prof``; the step times (ms) of the timed steps."""
    from torch.profiler import ProfilerAction

    total = config.warmup + config.steps
    step_ms: list[float] = []
    tagged = False
    stepped = Quietly(prof)
    with stepped:  # entering starts the profiler with --warmup 0; exiting stops it
        for index in range(total):
            if not tagged and prof.current_action != ProfilerAction.NONE:
                # Only a started profiler keeps metadata; it lands in the trace JSON.
                prof.add_metadata_json("profkit", json.dumps(_trace_metadata(config)))
                tagged = True
            times = workload.step()
            if index >= config.warmup:
                step_ms.append(times.step_ms)
            stepped.step()  # where the schedule starts or stops the profiler
            # With --with-stack torch's Python tracer records the callback's frames
            # too, and frames from rich's progress bar make key_averages() fail to
            # decode event names (torch 2.13): report progress only outside recording.
            quiet = options.with_stack and prof.current_action != ProfilerAction.NONE
            if on_step and not quiet:
                on_step(config.mode, index + 1, total)
    return step_ms


def _stack_config(with_stack: bool) -> Any:
    """torch >= 2.1 fills ``FunctionEvent.stack`` (hence Source Location) only in verbose mode."""
    if not with_stack:
        return None
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(verbose=True)
    except (ImportError, TypeError):  # pragma: no cover - older or newer private API
        return None


def _trace_metadata(config: WorkloadConfig) -> dict[str, Any]:
    return {"command": "torch", "version": __version__, "config": config.to_dict()}


def _export_gzip(prof: Any, path: Path) -> None:
    """Export the Chrome trace, gzip it and move it into place (a half-written trace never
    carries the final name). Level 6, not the 9 of torch's own ``.gz`` export: on torch
    traces here it compressed 3-4x faster for ~12% more bytes."""
    fd, raw_name = tempfile.mkstemp(suffix=".json", prefix=f".{path.stem}-", dir=path.parent)
    os.close(fd)
    raw = Path(raw_name)
    partial = path.with_name(f".{path.name}.partial")
    try:
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(partial, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        os.replace(partial, path)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        raw.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)


def _release_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def write_report(path: Path, text: str) -> None:
    """Write a run's markdown report whole or not at all; a path that cannot be written is
    one line."""
    write_text(path, text)
