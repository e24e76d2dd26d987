"""``kernels`` counts kernel launches: every count checked against the source, read plainly.

For Nsight Systems exports the answer is plain SQL over the export's own tables
(``CUPTI_ACTIVITY_KIND_KERNEL``, ``_MEMCPY``, ``_MEMSET``); for torch.profiler traces,
plain JSON over the ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events. Per phase and per
range the launch (the runtime call with the same correlation id) must fall inside a range
of that name: for these one-process captures, profkit's attribution rule.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from nsys_data import (
    GRAPH_NODES,
    GRAPH_WHOLE,
    KIND_TABLES,
    PROBE,
    SMALL_BF16,
    SMALL_FP32,
    STATS,
    TINY_COMPILE,
    sql_counts,
    sql_counts_in_ranges,
    unpack,
)
from synthetic import report
from typer.testing import CliRunner

from profkit.analysis import display_tables, kernel_report_markdown
from profkit.analysis.report_types import CONTRACT, EXTRA
from profkit.cli import app
from profkit.workload.names import ATTENTION_RANGES, PHASES

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(__file__).parents[1] / "profiles" / "examples" / "small-ctx128-train-fp32.sqlite"
EXPORTS = [
    SMALL_FP32,
    SMALL_BF16,
    TINY_COMPILE,
    GRAPH_NODES,
    "nsys-2025.3-h100-user_train",
    "nsys-2025.3-h100-small-compiled",
]
CHROME = {"kernel": "kernels", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("counts")


def _by(rows: list[dict], key: str, column: str) -> dict[str, int]:
    return {r[key]: r[column] for r in rows if r[column]}


@pytest.mark.parametrize("name", [*EXPORTS, "example", "probe"])
def test_nsys_counts_equal_the_export_tables(name: str, exports: Path) -> None:
    path = {"example": EXAMPLE, "probe": PROBE}.get(name) or unpack(name, exports)
    data = report(path).to_json()
    sql = sql_counts(path)
    totals = data["totals"]
    for count, (rows, _ns) in sql.items():
        assert totals[count] == rows, count
    assert totals["kernel_time_ms"] == pytest.approx(sql["kernels"][1] / 1e6, abs=1e-9)
    assert totals["gpu_time_ms"] == pytest.approx(sum(ns for _, ns in sql.values()) / 1e6)
    phases = [*PHASES, "eager"]  # the CUDA-graph captures name their non-graph part "eager"
    named = [*phases, *ATTENTION_RANGES]
    for count in KIND_TABLES:
        expected = sql_counts_in_ranges(path, named, count)
        assert _by(data["phases"], "phase", count) == {
            p: n for p, n in expected.items() if p in phases
        } | ({"unattributed": u} if (u := _unattributed(data, count)) else {})
        ranges = {r["range"]: r[count] for r in data["ranges"] if r["range"] in named}
        assert {r: n for r, n in ranges.items() if n} == expected, count


def _unattributed(data: dict, count: str) -> int:
    return next((p[count] for p in data["phases"] if p["phase"] == "unattributed"), 0)


def test_small_fp32_golden_counts(exports: Path) -> None:
    """The numbers the issue quotes, in small: 4,028 activities are 3,858 kernels."""
    data = report(unpack(SMALL_FP32, exports)).to_json()
    assert data["totals"] == {
        "kernels": 3858,
        "memcpy": 98,
        "memset": 72,
        "kernel_time_ms": pytest.approx(37.341626),
        "gpu_time_ms": pytest.approx(37.580731),
    }
    backward = next(p for p in data["phases"] if p["phase"] == "backward")
    assert (backward["kernels"], backward["memcpy"], backward["memset"]) == (2310, 74, 72)


def test_whole_cuda_graphs_are_counted_apart(exports: Path) -> None:
    data = report(unpack(GRAPH_WHOLE, exports)).to_json()
    sql = sql_counts(unpack(GRAPH_WHOLE, exports))
    assert data["totals"]["kernels"] == sql["kernels"][0] == 9
    assert data["totals"]["graphs"] == 3
    assert list(data["phases"][0])[:6] == ["phase", "kernels", "memcpy", "memset", "graphs", "kernel_time_ms"]  # fmt: skip


def _chrome_counts(path: Path) -> tuple[Counter, dict[str, Counter]]:
    """Per kind: all events, and per phase those whose launch lies inside that range."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in spans
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    phases = [
        (e["name"], e["ts"], e["ts"] + e["dur"])
        for e in spans
        if e.get("cat") == "user_annotation" and e["name"] in PHASES
    ]
    totals: Counter = Counter()
    per_phase: dict[str, Counter] = {}
    for e in spans:
        count = CHROME.get(e.get("cat"))
        if count is None:
            continue
        totals[count] += 1
        at = launches.get(e["args"].get("correlation"))
        for name, start, end in phases:
            if at is not None and start <= at < end:
                per_phase.setdefault(count, Counter())[name] += 1
    return totals, per_phase


@pytest.mark.parametrize("name", ["torch-small-ctx128-train", "torch-small-ctx128-forward"])
def test_chrome_counts_equal_the_events(name: str) -> None:
    path = DATA / f"{name}.json.gz"
    data = report(path).to_json()
    totals, per_phase = _chrome_counts(path)
    assert {c: data["totals"][c] for c in CHROME.values()} == {
        c: totals[c] for c in CHROME.values()
    }
    for count in CHROME.values():
        assert _by(data["phases"], "phase", count) == dict(per_phase.get(count, {}))
    if name.endswith("train"):
        assert (data["totals"]["kernels"], data["totals"]["memcpy"]) == (1929, 49)


def test_json_keys_are_the_contract(exports: Path) -> None:
    result = CliRunner().invoke(
        app, ["kernels", str(unpack(SMALL_FP32, exports)), "-f", "json", "-n", "0"]
    )
    assert result.exit_code == 0, result.output
    value = json.loads(result.stdout)
    assert list(value["totals"]) == ["kernels", "memcpy", "memset", "kernel_time_ms", "gpu_time_ms"]
    for part in ("phases", "ranges", "kernels", "categories"):
        core = len(CONTRACT[part])  # the contract's keys first, in order, then the extras
        assert all(list(row)[:core] == CONTRACT[part] for row in value[part]), part
        assert all(list(row)[core:] == EXTRA[part] for row in value[part]), part
    assert {r["kind"] for r in value["kernels"]} == {"kernel", "memcpy", "memset"}


def test_titles_and_markdown_say_what_they_count(exports: Path) -> None:
    small = report(unpack(SMALL_FP32, exports), top=3)
    titles = [title for title, _ in display_tables(small)]
    assert titles[0] == (
        "Phases — 3,858 kernels, 98 memcpy, 72 memset: 37.58 ms of GPU time, 37.34 ms in kernels"
    )
    assert "Top 3 by GPU time (kernels, memcpy, memset), all phases" in titles
    text = kernel_report_markdown(small, "t")
    assert "GPU activities: 3,858 kernels, 98 memcpy, 72 memset" in text


@pytest.mark.parametrize("name", [SMALL_FP32, SMALL_BF16, TINY_COMPILE, GRAPH_NODES, GRAPH_WHOLE])
def test_kernels_agree_with_nsys_cuda_gpu_kern_sum(name: str, exports: Path) -> None:
    """Nsight Systems' own kernel summary, run on the same export: same count, same time."""
    totals = report(unpack(name, exports)).totals
    nsys = pd.read_csv(STATS / f"{name}_cuda_gpu_kern_sum.csv")
    assert totals["kernels"] == nsys["Instances"].sum()
    assert round(totals["kernel_time_ms"] * 1e6) == nsys["Total Time (ns)"].sum()


def _keys(value: object, prefix: str = "") -> set[str]:
    """Every object key in a JSON value (list items and nested objects included)."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_docs_json_names_every_key_the_commands_print(exports: Path) -> None:
    """docs/JSON.md stays true: each key these commands print is named there."""
    doc = (Path(__file__).parents[1] / "docs" / "JSON.md").read_text()
    # The words inside `code` spans: `{phase, kernels, ...}` names phase and kernels.
    text = re.sub(r"```.*?```", "", doc, flags=re.DOTALL)  # spans only, not code blocks
    named = {w for span in re.findall(r"`([^`]+)`", text) for w in re.findall(r"\w+", span)}
    fp32, bf16 = unpack(SMALL_FP32, exports), unpack(SMALL_BF16, exports)
    runs = [
        ["kernels", str(fp32), "-f", "json", "-n", "0"],
        ["kernels", str(unpack(GRAPH_WHOLE, exports)), "-f", "json"],
        ["diff", str(fp32), str(bf16), "-f", "json"],
        ["sizes", "-f", "json"],
        ["doctor", "-f", "json"],
        ["precision", "accumulate", "-f", "json"],
        ["memory", "summarize", str(DATA / "memory-tiny-ctx64-train-fp32.pickle.xz"), "-f", "json"],
    ]
    for args in runs:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        printed = json.loads(result.stdout)
        for finding in printed.get("findings", []) if isinstance(printed, dict) else []:
            # each rule's evidence, keyed by call names and phases too: docs/FINDINGS.md
            finding.pop("evidence", None)
        missing = _keys(printed) - named
        assert not missing, (args[0], missing)
