"""``profkit demo``: the README's main job, as a list of steps that each add a report section.

On a CPU-only machine it runs a short sweep of the ``tiny`` model (seconds); on a GPU the
``small`` model. Results go to a results DB under ``profiles/demo/`` and a markdown report
(``reports/demo.md``). A pipeline joins the demo by appending a :class:`DemoStep` to
:data:`STEPS`: a function that takes the :class:`DemoContext` and returns its section's
markdown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.files import check_writable
from profkit.formats import markdown_table, write_text
from profkit.run import bench as bench_lib
from profkit.run.environment import environment
from profkit.run.results import check_db
from profkit.workload import specs
from profkit.workload.config import WorkloadConfig, resolve_device
from profkit.workload.names import ATTENTION_RANGES

SweepHooks = tuple[bench_lib.StartHook | None, bench_lib.RowHook | None]
SweepProgress = Callable[[Sequence[WorkloadConfig]], AbstractContextManager[SweepHooks]]


@contextlib.contextmanager
def _no_progress(configs: Sequence[WorkloadConfig]) -> Iterator[SweepHooks]:
    yield None, None


@dataclass
class DemoContext:
    """What every step gets: where to write, which device, and how to show sweep progress."""

    profiles_dir: Path
    report_path: Path
    device: str
    """Concrete device (``cuda``, ``mps`` or ``cpu``)."""
    sweep_progress: SweepProgress = _no_progress
    env: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    """What steps hand to later steps (the bench rows, say)."""
    shown: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    """The tables the current step shows on the terminal (title, table); emptied per step."""
    files: list[Path] = field(default_factory=list)
    """Files the steps wrote besides the report (pictures, traces)."""

    @property
    def db_path(self) -> Path:
        return self.profiles_dir / "results.db"

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"


@dataclass(frozen=True)
class DemoStep:
    name: str
    title: str
    """The section heading in the report."""
    run: Callable[[DemoContext], str]
    """Does the work and returns the section's markdown."""


def demo_configs(device: str) -> list[WorkloadConfig]:
    """The demo sweep: forward and train, fp32 and bf16; small on a GPU, tiny elsewhere."""
    if device == "cuda":
        base = WorkloadConfig(size="small", ctx=256, device=device)
    else:  # a couple of seconds per config on two CPU cores
        base = WorkloadConfig(size="tiny", ctx=128, warmup=2, steps=5, device=device)
    return [
        base.replace(mode=mode, dtype=dtype)
        for mode in ("forward", "train")
        for dtype in ("fp32", "bf16")
    ]


def _sizes_step(ctx: DemoContext) -> str:
    table = pd.DataFrame(specs.sizes())
    ctx.shown.append(("Model sizes (profkit sizes)", table))
    return (
        "The built-in model (CS336 `BasicsTransformerLM`) in every size, parameters counted "
        "without allocating weights (`profkit sizes`):\n\n" + markdown_table(table)
    )


def _bench_step(ctx: DemoContext) -> str:
    configs = demo_configs(ctx.device)
    with ctx.sweep_progress(configs) as (on_start, on_row):
        rows = bench_lib.bench(configs, ctx.db_path, on_start=on_start, on_row=on_row)
    ctx.data["bench_rows"] = rows
    ctx.shown.append((bench_lib.title(rows), bench_lib.table(rows)))
    picture = _step_picture(ctx, rows)
    first = configs[0]
    command = (
        f"profkit bench --size {first.size} --ctx {first.ctx} --mode forward train "
        f"--dtype fp32 bf16 --warmup {first.warmup} --steps {first.steps}"
    )
    return (
        f"{bench_lib.title(rows)}.\n\n"
        "Each config ran in its own process; each phase was timed with the device "
        "synchronized at its boundaries (`synchronize` + `perf_counter`). "
        f"Rows are in `{ctx.db_path}` (table `bench`). The same sweep by hand:\n\n"
        f"```\n{command}\n```\n\n"
        + markdown_table(bench_lib.table(rows))
        + (f"\n\n![Training step time by phase]({picture.name})" if picture else "")
    )


def _step_picture(ctx: DemoContext, rows: list[bench_lib.Row]) -> Path | None:
    """The training step per dtype stacked by phase, a PNG beside the report (None when no
    training row ran or matplotlib is missing: the tables say it all then)."""
    from profkit.report import figures, plots

    bars = figures.step_bars([r for r in rows if r.get("mode") == "train"])
    if not bars:
        return None
    out = ctx.report_path.with_name(ctx.report_path.stem + "-step.png")
    try:
        plots.step_time(bars[0], out)
    except ImportError:
        return None
    ctx.files.append(out)
    return out


# A real Nsight Systems export shipped with profkit: the small model, ctx 128, fp32, two
# training steps, captured by `profkit nsys` on an H100 (so the demo shows GPU kernel
# tables on any machine, nsys or not). Inside the package, xz-compressed (144 KB), so an
# installed wheel has it too; the same bytes as the checkout's profiles/examples/ (a test
# holds them equal).
EXAMPLE_EXPORT = Path(__file__).resolve().parent / "examples" / "small-ctx128-train-fp32.sqlite.xz"


def _typed(path: Path) -> str:
    """``path`` as a user would type it here: relative to the current folder when inside it."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _kernels_step(ctx: DemoContext) -> str:
    from profkit.analysis import kernel_report
    from profkit.analysis.presentation import attention_sentence
    from profkit.traces.job import load

    if not EXAMPLE_EXPORT.exists():  # a package built without its data files
        return "The example export is not in this installation; skipped."
    report = kernel_report(load([EXAMPLE_EXPORT]), top=10)
    ctx.shown += [
        (
            f"Phases of {EXAMPLE_EXPORT.name} (H100, small, ctx 128, fp32, 2 steps)",
            phases_view(report),
        ),
        (
            "Top 10 kernels by GPU time, all phases",
            report.top_kernels(n=10)[["short_name", "category", "total_ms", "instances"]].rename(
                columns={"short_name": "kernel"}
            ),
        ),
    ]
    counted = ["kernels", "memcpy", "memset", "kernel_time_ms", "gpu_time_ms"]
    phases = phases_view(report)
    kernels = report.top_kernels(n=10)[["short_name", "category", "total_ms", "instances"]]
    attention = report.ranges[report.ranges["range"].isin(ATTENTION_RANGES)]
    sentence = attention_sentence(report.ranges)
    return (
        f"Where the GPU time of a real training step goes: `profkit kernels "
        f"{_typed(EXAMPLE_EXPORT)}` (small model, ctx 128, fp32, "
        "two steps captured by `profkit nsys` on an NVIDIA H100). Backward kernels, which "
        "PyTorch launches from its autograd thread, count in `backward`. `kernels` counts "
        "kernel launches, `memcpy` and `memset` the copies and memsets; `gpu_time_ms` sums "
        "all of them, `kernel_time_ms` the kernels alone.\n\n"
        + markdown_table(phases)
        + "\n\nTop 10 by GPU time (kernels, memcpy, memset):\n\n"
        + markdown_table(kernels)
        + "\n\nInside attention:\n\n"
        + markdown_table(attention[["range", "instances", *counted]])
        + (f"\n\n{sentence}" if sentence else "")
    )


def phases_view(report: Any) -> pd.DataFrame:
    """A kernel report's phases: counts, times and each phase's share of the GPU time."""
    counted = ["kernels", "memcpy", "memset", "kernel_time_ms", "gpu_time_ms"]
    phases = report.phases[["phase", *counted, "python_ms"]].copy()
    phases.insert(len(counted) + 1, "share %", 100 * report.phases["share"])
    return phases


def _torch_step(ctx: DemoContext) -> str:
    from profkit.torchprof.profile import profile_torch
    from profkit.torchprof.result import TorchOptions

    size = "small" if ctx.on_gpu else "tiny"
    config = WorkloadConfig(size=size, ctx=128, warmup=1, steps=1, device=ctx.device)
    profiled = profile_torch(
        config,
        TorchOptions(row_limit=10),
        name=f"demo-torch-{size}",
        out_dir=ctx.profiles_dir,
        reports_dir=ctx.report_path.parent,
    )
    title, table = profiled.tables()[-1]  # the full step
    ctx.shown.append((f"torch.profiler: {title}", table))
    ctx.files += [Path(run.trace_path) for run in profiled.runs]
    traces = ", ".join(f"`{run.trace_path}`" for run in profiled.runs)
    return (
        f"`profkit torch --size {size} --ctx 128 --steps 1` on {ctx.device}: torch.profiler "
        f"key_averages of one training step ({title}); Chrome traces {traces} open in "
        "https://ui.perfetto.dev and in `profkit kernels`.\n\n" + markdown_table(table)
    )


STEPS: list[DemoStep] = [
    DemoStep("sizes", "Model sizes", _sizes_step),
    DemoStep("bench", "Benchmark", _bench_step),
    DemoStep("kernels", "Where the GPU time goes (a shipped H100 profile)", _kernels_step),
    DemoStep("torch", "torch.profiler", _torch_step),
]


@dataclass
class DemoResult:
    report_path: Path
    db_path: Path
    sections: list[tuple[str, str]]
    data: dict[str, Any]
    files: list[Path] = field(default_factory=list)


def _header(ctx: DemoContext) -> str:
    env = ctx.env
    where = env.get("gpu_name") if ctx.on_gpu else f"{ctx.device.upper()} ({env.get('hostname')})"
    commit = env.get("git_commit")
    version = env.get("profkit_version", "?") + (f" ({commit[:10]})" if commit else "")
    return (
        "# profkit demo\n\n"
        f"Generated by `profkit demo` at {env.get('timestamp_utc')} on {where}, "
        f"torch {env.get('torch_version')}, profkit {version}.\n"
    )


def demo(
    profiles_dir: Path = Path("profiles/demo"),
    report_path: Path = Path("reports/demo.md"),
    device: str = "auto",
    steps: Sequence[DemoStep] | None = None,
    sweep_progress: SweepProgress = _no_progress,
    on_step: Callable[[int, int, DemoStep], None] | None = None,
    on_tables: Callable[[list[tuple[str, pd.DataFrame]]], None] | None = None,
) -> DemoResult:
    """Run every demo step and write the markdown report; returns where everything went.
    ``on_step`` is called as a step starts, ``on_tables`` with the tables it shows as it
    ends (so a terminal sees each step's result under its heading)."""
    check_writable(report_path)
    check_db(profiles_dir / "results.db")
    ctx = DemoContext(
        profiles_dir=profiles_dir,
        report_path=report_path,
        device=resolve_device(device),  # an unknown or absent device stops us here
        sweep_progress=sweep_progress,
        env=environment(),
    )
    chosen = list(STEPS if steps is None else steps)
    sections: list[tuple[str, str]] = []
    for index, step in enumerate(chosen):
        if on_step:
            on_step(index, len(chosen), step)
        ctx.shown = []
        sections.append((step.title, step.run(ctx)))
        if on_tables and ctx.shown:
            on_tables(ctx.shown)
    body = "\n".join(f"\n## {title}\n\n{text.rstrip()}\n" for title, text in sections)
    write_text(report_path, _header(ctx) + body)
    return DemoResult(report_path, ctx.db_path, sections, ctx.data, ctx.files)
