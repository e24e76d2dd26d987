"""``reports/NAME.md`` of a ``profkit torch`` run: the config, then per run its table."""

from __future__ import annotations

import contextlib

from profkit import __version__
from profkit.formats import markdown_table
from profkit.torchprof.result import MODE_TITLES, TorchProfile
from profkit.workload.config import WorkloadConfig

TABLE_DIGITS = 3


def report_markdown(result: TorchProfile) -> str:
    """``reports/NAME.md``: the config, then per run its totals, trace and table."""
    c = result.config
    lines = [
        f"# {title(c, result.name)}",
        "",
        *run_lines(c, f"{result.device}{_gpu_suffix(result.device)}"),
        f"- recorded: shapes {_yes(result.options.record_shapes or result.options.group_by_shape)}, "
        f"stacks {_yes(result.options.with_stack)}, memory {_yes(result.options.profile_memory)}",
    ]
    for warning in result.warnings:
        lines.append(f"- note: {warning}")
    for run in result.runs:
        table = run.table
        totals = f"Self CPU time total: {table.self_cpu_total_ms:,.3f} ms"
        if table.self_cuda_total_ms is not None:
            totals += f" · Self CUDA time total: {table.self_cuda_total_ms:,.3f} ms"
        mean_ms = sum(run.step_ms) / len(run.step_ms) if run.step_ms else float("nan")
        shown = table.top(result.options.row_limit)
        lines += [
            "",
            f"## {MODE_TITLES.get(run.mode, run.mode)}",
            "",
            f"{totals} · profiled step: {mean_ms:,.2f} ms wall (with profiler overhead; "
            "`profkit bench` times without it)",
            "",
            f"Trace: `{run.trace_path}` — open in https://ui.perfetto.dev or chrome://tracing; "
            f"`profkit kernels {run.trace_path}` gives the per-phase kernel tables.",
            "",
            f"Top {len(shown)} of {len(table.rows)} rows, sorted by {table.sort}:",
            "",
            markdown_table(table.display(result.options.row_limit), digits=TABLE_DIGITS),
        ]
    return "\n".join(lines) + "\n"


def title(config: WorkloadConfig, name: str) -> str:
    """The report's title: ``torch.profiler: small, ctx 128, fp32 (NAME)``."""
    return f"torch.profiler: {config.size}, ctx {config.ctx}, {config.dtype} ({name})"


def run_lines(config: WorkloadConfig, device: str) -> list[str]:
    """The config and steps of a run as the report's first bullets (one process, or every
    rank of ``config.nproc``)."""
    c = config
    ranks = c.nproc > 1
    return [
        f"- config: size {c.size}, ctx {c.ctx}, batch {c.batch}{' per rank' if ranks else ''}, "
        f"dtype {c.dtype}, attention {c.attention}, compile {_yes(c.compile)}, "
        + (f"{c.parallel} over {c.nproc} ranks, " if ranks else "")
        + f"device {device}",
        f"- steps: {c.warmup} warm-up (the last one the profiler's warm-up), "
        f"{c.steps} profiled{' on every rank' if ranks else ''}; torch {_torch_version()}, "
        f"profkit {__version__}",
    ]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _gpu_suffix(device: str) -> str:
    if device != "cuda":
        return ""
    with contextlib.suppress(Exception):
        import torch

        return f" ({torch.cuda.get_device_name()})"
    return ""
