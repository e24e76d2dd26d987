"""The golden cases: ``profkit kernels`` and ``profkit diff`` command lines whose
``--format json`` output was recorded in ``tests/data/golden/`` from the code of one commit
(each file names it), before the trace-reading engine's two paths (the full tables and the
compact columns) became one. ``tests/test_golden.py`` checks that the code of today
reproduces every one; ``tests/make_golden.py`` records them.

A case is an argv as a user types it, with each input file written ``@NAME``: a committed
fixture of ``tests/data`` (``NAME.sqlite`` is unpacked from ``NAME.sqlite.xz``, sidecar
included, as ``tests/nsys_data.py`` does; ``NAME.sqlite.xz`` itself is read compressed),
or one of the two-node set's files, made as ``tests/test_nodes_streaming.py`` makes them
(``node0.sqlite``: the 2-GPU DDP export; ``node1.sqlite``: the same rows with every process
id moved by 100,000, another host's; ``node1-ahead.sqlite``: that, with its clock 3 ms
ahead). Every case ends in ``--format json``.

What is recorded per case: the exit status, stderr, and stdout's JSON (``null`` on a
refusal). Input paths, which differ between machines and checkouts, are written as the
file's name (:func:`normalise`); nothing else in these outputs depends on the machine, the
time or the columnar cache (checked when they were recorded: cached, uncached and repeated
runs gave the same bytes).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_scripts import benchmark
from nsys_data import DATA, unpack
from typer.testing import CliRunner

GOLDEN = DATA / "golden"

# nsys exports (tests/data/nsys-fixtures.md says how each was captured)
FP32 = "@nsys-2025.3-h100-small-fp32.sqlite"
FP32_XZ = "@nsys-2025.3-h100-small-fp32.sqlite.xz"  # read as given, compressed
BF16 = "@nsys-2025.3-h100-small-bf16.sqlite"
COMPILED = "@nsys-2025.3-h100-small-compiled.sqlite"
TINY = "@nsys-2025.3-h100-tiny-compile.sqlite"
USER = "@nsys-2025.3-h100-user_train.sqlite"
GRAPH_NODE = "@nsys-2025.3-h100-cudagraph-node.sqlite"
GRAPH_WHOLE = "@nsys-2025.3-h100-cudagraph-whole.sqlite"
UNANNOTATED = "@nsys-2025.3-h200-unannotated-train.sqlite"
DDP2 = "@nsys-2025.3-h200x2-small-ddp2.sqlite"
PROBE = "@nsys-2025.3-probe.sqlite"
NO_KERNELS = "@nsys-2022.4-no-kernels.sqlite"
# torch.profiler Chrome traces
T_TRAIN = "@torch-small-ctx128-train.json.gz"
T_FORWARD = "@torch-small-ctx128-forward.json.gz"
T_UNANNOTATED = "@torch-h200-unannotated-train.json.gz"
T_RANK0 = "@torch-h200x2-small-ddp2-rank0.json.gz"
T_RANK1 = "@torch-h200x2-small-ddp2-rank1.json.gz"
# two nodes of one job, made from DDP2
NODE0 = "@node0.sqlite"
NODE1 = "@node1.sqlite"
NODE1_AHEAD = "@node1-ahead.sqlite"
NODES = (NODE0, NODE1_AHEAD)

PID_STEP = 100_000  # kernels_scale.PID_STEP, as in tests/test_nodes_streaming.py
SHIFT_NS = 3_000_000

EVERY_FIXTURE = (
    FP32, BF16, COMPILED, TINY, USER, GRAPH_NODE, GRAPH_WHOLE, UNANNOTATED, DDP2, PROBE,
    T_TRAIN, T_FORWARD, T_UNANNOTATED, T_RANK0, T_RANK1, FP32_XZ,
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One command line; ``args`` without the trailing ``--format json``."""

    args: tuple[str, ...]
    exit_code: int = 0

    @property
    def argv(self) -> list[str]:
        return [*self.args, "--format", "json"]

    @property
    def name(self) -> str:
        """The golden file's stem: the command, the inputs' names joined by ``+`` and the
        options, e.g. ``kernels--nsys-2025.3-h100-small-fp32--phase-backward``."""
        files = [_stem(a[1:]) for a in self.args[1:] if a.startswith("@")]
        options = [a for a in self.args[1:] if not a.startswith("@")]
        parts = [self.args[0], "+".join(files), *_option_words(options)]
        return "--".join(re.sub(r"[^A-Za-z0-9._+]+", "-", p).strip("-") for p in parts if p)

    @property
    def command(self) -> str:
        """The command as a user would type it, files by name."""
        words = [a[1:] if a.startswith("@") else a for a in self.argv]
        return " ".join(
            ["profkit", *(w if re.fullmatch(r"[\w.:#+/-]+", w) else repr(w) for w in words)]
        )


def _stem(name: str) -> str:
    for suffix in (".sqlite", ".json.gz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name  # .sqlite.xz keeps its suffix: the compressed read is another path


def _option_words(options: list[str]) -> Iterator[str]:
    """``--phase backward`` -> ``phase-backward``; a flag alone -> its name."""
    i = 0
    while i < len(options):
        word = options[i].lstrip("-")
        if i + 1 < len(options) and not options[i + 1].startswith("--"):
            yield f"{word}-{options[i + 1]}"
            i += 2
        else:
            yield word
            i += 1


def kernels(*args: str, exit_code: int = 0) -> Case:
    return Case(("kernels", *args), exit_code)


def diff(*args: str, exit_code: int = 0) -> Case:
    return Case(("diff", *args), exit_code)


CASES: list[Case] = [
    # Every committed trace, default options (top 20 a phase).
    *(kernels(f) for f in EVERY_FIXTURE),
    # --phase: annotated, inferred (unannotated), CUDA graphs' own phases, multi-rank.
    kernels(FP32, "--phase", "forward"),
    kernels(FP32, "--phase", "backward"),
    kernels(FP32, "--phase", "optimizer"),
    kernels(BF16, "--phase", "backward"),
    kernels(COMPILED, "--phase", "forward"),
    kernels(TINY, "--phase", "backward"),
    kernels(USER, "--phase", "optimizer"),
    kernels(PROBE, "--phase", "backward"),
    kernels(GRAPH_NODE, "--phase", "eager"),
    kernels(GRAPH_WHOLE, "--phase", "forward"),
    kernels(UNANNOTATED, "--phase", "forward"),
    kernels(UNANNOTATED, "--phase", "backward"),
    kernels(DDP2, "--phase", "forward"),
    kernels(DDP2, "--phase", "backward"),
    kernels(T_TRAIN, "--phase", "forward"),
    kernels(T_TRAIN, "--phase", "backward"),
    kernels(T_FORWARD, "--phase", "forward"),
    kernels(T_UNANNOTATED, "--phase", "backward"),
    kernels(T_UNANNOTATED, "--phase", "optimizer"),
    # --range: sub-ranges, another NVTX domain, NCCL's own ranges, torch's op ranges.
    kernels(FP32, "--range", "computing softmax"),
    kernels(FP32, "--range", "CCCL:cub::DeviceRadixSort"),
    kernels(BF16, "--range", "scaled dot product attention"),
    kernels(BF16, "--phase", "forward", "--range", "scaled dot product attention"),
    kernels(PROBE, "--range", "forward"),
    kernels(GRAPH_NODE, "--range", "mylib:lib op"),
    kernels(GRAPH_WHOLE, "--range", "replays"),
    kernels(DDP2, "--range", "NCCL:ncclAllReduce"),
    kernels(DDP2, "--range", "computing softmax"),
    kernels(T_TRAIN, "--range", "computing softmax"),
    kernels(T_TRAIN, "--range", "Optimizer.step#AdamW.step"),
    kernels(T_UNANNOTATED, "--range", "Optimizer.step#AdamW.step"),
    # --top: every kernel, and a short table.
    kernels(FP32, "--top", "0"),
    kernels(FP32, "--top", "5"),
    kernels(FP32, "--phase", "backward", "--top", "5"),
    kernels(GRAPH_WHOLE, "--top", "0"),
    kernels(PROBE, "--top", "0"),
    kernels(UNANNOTATED, "--top", "0"),
    kernels(DDP2, "--top", "0"),
    kernels(T_TRAIN, "--top", "0"),
    kernels(T_TRAIN, "--top", "5"),
    kernels(T_UNANNOTATED, "--top", "0"),
    # --phases: forced annotated or inferred, on annotated and unannotated captures.
    kernels(FP32, "--phases", "annotated"),
    kernels(FP32, "--phases", "inferred"),
    kernels(USER, "--phases", "inferred"),
    kernels(PROBE, "--phases", "inferred"),
    kernels(UNANNOTATED, "--phases", "annotated"),
    kernels(UNANNOTATED, "--phases", "inferred"),
    kernels(DDP2, "--phases", "inferred"),
    kernels(T_TRAIN, "--phases", "inferred"),
    kernels(T_UNANNOTATED, "--phases", "annotated"),
    kernels(T_UNANNOTATED, "--phases", "inferred"),
    # --rank of one nsys export of two processes.
    kernels(DDP2, "--rank", "0"),
    kernels(DDP2, "--rank", "1"),
    kernels(DDP2, "--rank", "1", "--phase", "backward"),
    kernels(DDP2, "--rank", "0", "--range", "NCCL:ncclAllReduce"),
    kernels(DDP2, "--rank", "1", "--phases", "inferred"),
    # The per-rank torch traces of one run, read as one job.
    kernels(T_RANK0, T_RANK1),
    kernels(T_RANK0, T_RANK1, "--rank", "0"),
    kernels(T_RANK0, T_RANK1, "--rank", "1"),
    kernels(T_RANK0, T_RANK1, "--phase", "backward"),
    kernels(T_RANK0, T_RANK1, "--range", "nccl:all_reduce"),
    # Two nodes' exports of one job (streamed from the columns; inferred: the full tables).
    kernels(*NODES),
    kernels(NODE0, NODE1),
    kernels(*NODES, "--phase", "backward"),
    kernels(*NODES, "--range", "computing softmax"),
    kernels(*NODES, "--rank", "3"),
    kernels(*NODES, "--rank", "2", "--phase", "optimizer"),
    kernels(*NODES, "--phases", "inferred"),
    # Side by side (several traces that are not one job, or --compare).
    kernels(FP32, T_TRAIN),
    kernels(FP32, BF16, "--compare"),
    kernels(FP32, T_TRAIN, "--compare", "--tolerance", "1"),
    kernels(PROBE, TINY, T_TRAIN),
    kernels(DDP2, DDP2),
    kernels(T_RANK0, T_RANK1, "--compare"),
    # profkit diff A B.
    diff(FP32, BF16),
    diff(FP32, BF16, "--top", "0"),
    diff(FP32, BF16, "--total"),
    diff(FP32, COMPILED),
    diff(TINY, COMPILED),
    diff(FP32, T_TRAIN),
    diff(DDP2, FP32),
    diff(UNANNOTATED, T_UNANNOTATED),
    diff(T_FORWARD, T_TRAIN),
    diff(T_RANK0, T_RANK1),
    # What today's code refuses: exit 2 and one line.
    kernels(FP32, "--rank", "0", exit_code=2),
    kernels(DDP2, "--rank", "2", exit_code=2),
    kernels(T_RANK0, "--rank", "0", exit_code=2),
    kernels(*NODES, "--rank", "4", exit_code=2),
    kernels(FP32, "--phase", "warmup", exit_code=2),
    kernels(FP32, "--range", "attention", exit_code=2),
    kernels(NO_KERNELS, exit_code=2),
    diff(FP32, exit_code=2),
]


class Inputs:
    """The cases' input files, made on first use in ``folder``: fixtures unpacked there,
    the two-node set built there; other fixtures read where they are."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.made: dict[str, Path] = {}

    def path(self, token: str) -> Path:
        name = token.removeprefix("@")
        if name not in self.made:
            self.made[name] = self._make(name)
        return self.made[name]

    def _make(self, name: str) -> Path:
        if name.startswith("node"):
            node0 = self.folder / "node0.sqlite"
            if not node0.exists():
                shutil.copy(self.path(DDP2), node0)  # its sidecar stays behind
            if name == "node0.sqlite":
                return node0
            shift = SHIFT_NS if name == "node1-ahead.sqlite" else 0
            scale = benchmark("kernels_scale")
            return scale.another_node(node0, self.folder / name, PID_STEP, shift)
        if name.endswith(".sqlite") and (DATA / f"{name}.xz").exists():
            return unpack(name.removesuffix(".sqlite"), self.folder)
        assert (DATA / name).exists(), f"no fixture {name} in {DATA}"
        return DATA / name

    def argv(self, case: Case) -> list[str]:
        return [str(self.path(a)) if a.startswith("@") else a for a in case.argv]

    def normalise(self, value: Any) -> Any:
        return normalise(value, [self.folder, DATA])


def normalise(value: Any, folders: list[Path]) -> Any:
    """``value`` with every path under ``folders`` written as the part below the folder
    (the file's name): what differs between machines and checkouts."""
    if isinstance(value, str):
        for folder in folders:
            value = value.replace(f"{folder}/", "")
        return value
    if isinstance(value, list):
        return [normalise(v, folders) for v in value]
    if isinstance(value, dict):
        return {normalise(k, folders): normalise(v, folders) for k, v in value.items()}
    return value


def run(case: Case, inputs: Inputs, runner: CliRunner | None = None) -> dict[str, Any]:
    """Run ``case`` in this process; what a golden file holds: the command, the exit
    status, stderr and stdout's JSON (null on a refusal), paths normalised."""
    from profkit.cli import app

    result = (runner or CliRunner()).invoke(app, inputs.argv(case))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    output = json.loads(result.stdout) if result.exit_code == 0 else None
    return {
        "command": case.command,
        "exit_code": result.exit_code,
        "stderr": inputs.normalise(result.stderr),
        "stdout": result.stdout if result.exit_code else "",
        "output": inputs.normalise(output),
    }


def golden_path(case: Case) -> Path:
    return GOLDEN / f"{case.name}.json"


def dumps(value: Any, indent: str = "") -> str:
    """JSON as a reader diffs it: an object or list of plain values (a kernel's row, a
    list of numbers) on one line, anything holding more nested below it."""
    flat = not isinstance(value, dict | list) or all(
        not isinstance(v, dict | list)
        for v in (value.values() if isinstance(value, dict) else value)
    )
    if flat:
        return json.dumps(value, ensure_ascii=False)
    inner = indent + " "
    if isinstance(value, dict):
        items = [
            f"{inner}{json.dumps(k, ensure_ascii=False)}: {dumps(v, inner)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    items = [f"{inner}{dumps(v, inner)}" for v in value]
    return "[\n" + ",\n".join(items) + f"\n{indent}]"
