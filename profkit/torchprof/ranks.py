"""``profkit torch --nproc N``: torch.profiler on every rank, one Chrome trace each.

The one-GPU path profiles in profkit's own process; ranks are processes of their own,
so here the child (under torchrun) records its timed steps with
:class:`profkit.run.trace_capture.RankTracer` and writes ``OUT_DIR/NAME-rank{R}.json.gz``.
The traces are then read back together as the ranks of one run, and their kernel report
(per rank and for the job) is written as ``NAME.md`` beside the one-GPU run's report.

torch.profiler's own ``key_averages`` table is a one-process view (and ``profkit torch``
profiles in its own process there); the CLI refuses the options that shape it
(``--record-shapes``, ``--with-stack``, ``--sort`` ...) with ``--nproc`` rather than
dropping them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError
from profkit.run.child import run_child
from profkit.run.trace_capture import rank_trace_path
from profkit.torchprof.profile import trace_stem
from profkit.torchprof.report import run_lines
from profkit.workload.config import WorkloadConfig


@dataclass
class RankTraces:
    """What a multi-rank torch.profiler run left: the child's merged result and the traces."""

    result: dict[str, Any]
    traces: list[Path]


def profile_ranks(
    config: WorkloadConfig, name: str, out_dir: Path, timeout_s: float | None = None
) -> RankTraces:
    """Run ``config`` on ``config.nproc`` ranks under torch.profiler; one trace per rank."""
    stem = trace_stem(out_dir, name, config.mode)
    result = run_child(
        config, "torch-trace", timeout_s=timeout_s, capture_options={"stem": str(stem)}
    )
    traces = [rank_trace_path(stem, r) for r in range(config.nproc)]
    if result.get("status") != "ok":
        raise ProfkitError(f"torch.profiler run failed: {result.get('error')}")
    return RankTraces(result, [t for t in traces if t.exists()])


def ranks_report_markdown(config: WorkloadConfig, run: RankTraces, kernels_markdown: str) -> str:
    """``NAME.md`` of a multi-rank run: the config and the traces, then ``kernels_markdown``
    (:func:`profkit.analysis.kernel_report_markdown` of the traces read as ranks), whose
    title it keeps."""
    title, _, body = kernels_markdown.partition("\n\n")
    traces = ", ".join(f"`{p}`" for p in run.traces)
    header = [
        title,
        "",
        *run_lines(config, str(run.result.get("device") or config.device)),
        f"- traces, one per rank: {traces} (open each in https://ui.perfetto.dev; "
        "`profkit kernels` reads them together as the ranks of one run)",
    ]
    return "\n".join(header) + "\n\n" + body
