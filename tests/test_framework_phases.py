"""Phases on the frameworks people train with (issue 25), against the truth the programs
mark themselves (tests/framework_truth.py: plain SQL and plain JSON, nothing of profkit).

On every committed Lightning and Hugging Face capture (tests/data/frameworks/: one H100,
and two H200s for DDP/FSDP), per rank:

- the marks mapped by ``--phase-ranges`` give exactly the truth (kernels and their time);
- with the marks removed from a copy, the inferred phases are within 1% of the truth, in
  kernels and in time, where the kernels the truth leaves unmarked (zero_grad, gradient
  clipping, the loss division, the NaN check) may land in any phase;
- library ranges (NCCL's) are never phases, whatever domain id a process gives them.
"""

from __future__ import annotations

import gzip
import json
import lzma
import sqlite3
from pathlib import Path

import pytest
from framework_truth import Figures, chrome_truth, nsys_truth
from typer.testing import CliRunner

from profkit import analysis
from profkit.analysis.phase_marks import PhaseRanges
from profkit.analysis.report_types import RankedReport
from profkit.cli import app
from profkit.traces.host_calls import host_traces
from profkit.traces.job import load
from profkit.workload.names import PHASES

FRAMEWORKS = Path(__file__).parent / "data" / "frameworks"
MARKED = ("-hf", "-lightning")
NSYS = sorted(p for p in FRAMEWORKS.glob("nsys-*.sqlite.xz") if any(m in p.name for m in MARKED))
TORCH = sorted(
    p
    for p in FRAMEWORKS.glob("torch-*.json.gz")
    if any(m in p.name for m in MARKED) and "-bare" not in p.name
)
MARKS = "forward=truth:forward,backward=truth:backward,optimizer=truth:optimizer"
TOLERANCE = 0.01
runner = CliRunner()


def _id(path: Path) -> str:
    return path.name.split(".")[0]


def _plain(export: Path, folder: Path) -> Path:
    plain = folder / export.name.removesuffix(".xz")
    plain.write_bytes(lzma.decompress(export.read_bytes()))
    return plain


def _without_truth(plain: Path) -> None:
    """The truth marks deleted, each process's ``truth`` domain found by name."""
    with sqlite3.connect(plain) as db:
        db.execute(
            "DELETE FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND (globalTid >> 24, domainId) "
            "IN (SELECT globalTid >> 24, domainId FROM NVTX_EVENTS "
            "WHERE eventType = 75 AND text = 'truth')"
        )


def _per_rank(path: Path, marks: PhaseRanges | None) -> list[tuple[dict, Figures]]:
    """profkit's report of ``path``: per rank, its entry and (kernels, ns) per phase."""
    report = analysis.kernel_report(load([path], cache=False), top=0, phase_ranges=marks)
    data = report.to_json()
    ranks = data.get("ranks") or [{"rank": 0, "pid": None, "phases": data["phases"]}]
    return [
        (
            rank,
            {
                p["phase"]: (p["kernels"], round(p["kernel_time_ms"] * 1e6))
                for p in rank["phases"]
                if p["kernels"]
            },
        )
        for rank in ranks
    ]


def _truth_of(truths: dict[int, Figures], rank: dict) -> Figures:
    return truths[rank["pid"]] if rank["pid"] is not None else next(iter(truths.values()))


def _close(found: Figures, truth: Figures) -> list[str]:
    """Where the inferred phases are further than 1% from the truth, the truth's unmarked
    kernels (which may land in any phase) aside; empty when they agree."""
    spare = truth.get("unattributed", (0, 0))
    off = []
    for phase in PHASES:
        want = truth.get(phase, (0, 0))
        got = found.get(phase, (0, 0))
        for i, what in enumerate(("kernels", "ns")):
            low, high = want[i] * (1 - TOLERANCE), (want[i] + spare[i]) * (1 + TOLERANCE)
            if not low <= got[i] <= high:
                off.append(f"{phase} {what}: {got[i]} vs truth {want[i]} (+{spare[i]} unmarked)")
    total = [sum(f[i] for f in found.values()) for i in (0, 1)]
    if total != [sum(f[i] for f in truth.values()) for i in (0, 1)]:
        off.append(f"totals {total} differ from the truth's")
    return off


@pytest.mark.parametrize("export", NSYS, ids=_id)
def test_nsys_marks_mapped_are_the_truth(export: Path, tmp_path: Path) -> None:
    plain = _plain(export, tmp_path)
    truths = nsys_truth(plain)
    ranks = _per_rank(plain, PhaseRanges.parse(MARKS))
    assert len(ranks) == len(truths)
    for rank, found in ranks:
        assert found == _truth_of(truths, rank), f"rank {rank['rank']}"


@pytest.mark.parametrize("export", NSYS, ids=_id)
def test_nsys_phases_inferred_without_marks(export: Path, tmp_path: Path) -> None:
    plain = _plain(export, tmp_path)
    truths = nsys_truth(plain)
    _without_truth(plain)
    for rank, found in _per_rank(plain, None):
        assert not _close(found, _truth_of(truths, rank)), f"rank {rank['rank']}"


@pytest.mark.parametrize("trace", TORCH, ids=_id)
def test_torch_marks_mapped_are_the_truth(trace: Path) -> None:
    ((_, found),) = _per_rank(trace, PhaseRanges.parse(MARKS))
    assert found == chrome_truth(trace)


def _stripped(trace: Path, folder: Path) -> Path:
    """A copy of a torch.profiler trace without its ``truth:*`` events."""
    data = json.loads(gzip.decompress(trace.read_bytes()))
    data["traceEvents"] = [
        e for e in data["traceEvents"] if not str(e.get("name", "")).startswith("truth:")
    ]
    bare = folder / trace.name.removesuffix(".gz")
    bare.write_text(json.dumps(data))
    return bare


@pytest.mark.parametrize("trace", TORCH, ids=_id)
def test_torch_marks_spelled_domain_phase_are_the_phases(trace: Path) -> None:
    """``record_function("truth:forward")`` reads as nsys shows the same mark: ``forward``
    of domain ``truth``, a phase without ``--phase-ranges``."""
    report = analysis.kernel_report(load([trace], cache=False))
    assert "NVTX domain 'truth'" in report.source["phases_from"]
    ((_, found),) = _per_rank(trace, None)
    assert found == chrome_truth(trace)


@pytest.mark.parametrize("trace", TORCH, ids=_id)
def test_torch_phases_inferred_without_marks(trace: Path, tmp_path: Path) -> None:
    ((_, found),) = _per_rank(_stripped(trace, tmp_path), None)
    assert not _close(found, chrome_truth(trace))


def test_the_truth_domain_is_the_phases_and_ncclallreduce_never(tmp_path: Path) -> None:
    """hf-ddp2's NCCL domain holds more ranges than the program's own ``truth``: the truth's
    ranges are the phases on both ranks (exactly the truth), NCCL's stay ranges."""
    plain = _plain(FRAMEWORKS / "nsys-2025.3-h200x2-hf-ddp2.sqlite.xz", tmp_path)
    truths = nsys_truth(plain)
    report = analysis.kernel_report(load([plain], cache=False), top=0).to_json()
    assert report["source"]["phase_source"] == "annotated"
    assert "NVTX domain 'truth'" in report["source"]["phases_from"]
    for rank, found in _per_rank(plain, None):
        assert found == _truth_of(truths, rank)
    ranges = {r["range"] for r in report["ranges"]}
    assert "NCCL:ncclAllReduce" in ranges


def test_domain_ids_are_resolved_per_process(tmp_path: Path) -> None:
    """The second rank numbers its domains the other way round (NCCL 2, truth 1): its
    phases are still the truth's, and NCCL's ranges still no phase."""
    plain = _plain(FRAMEWORKS / "nsys-2025.3-h200x2-lightning-ddp2.sqlite.xz", tmp_path)
    truths = nsys_truth(plain)
    with sqlite3.connect(plain) as db:
        (pid,) = db.execute("SELECT max(globalTid >> 24) FROM NVTX_EVENTS").fetchone()
        db.execute(
            "UPDATE NVTX_EVENTS SET domainId = 3 - domainId WHERE globalTid >> 24 = ? "
            "AND domainId IN (1, 2)",
            (pid,),
        )
    assert nsys_truth(plain) == truths  # the truth, by name, is the same
    for rank, found in _per_rank(plain, None):
        assert set(found) <= {*PHASES, "unattributed"}
        assert found == _truth_of(truths, rank)


@pytest.mark.parametrize("trace", sorted(FRAMEWORKS.glob("torch-*.json.gz")), ids=_id)
def test_no_torch_trace_has_a_library_phase(trace: Path) -> None:
    """Whatever a framework or planted trace holds (Optimizer.step, ProfilerStep, data
    loader ranges), its phases are the known three or unattributed."""
    for _, found in _per_rank(trace, None):
        assert set(found) <= {*PHASES, "unattributed"}


@pytest.mark.parametrize("export", sorted(FRAMEWORKS.glob("nsys-*.sqlite.xz")), ids=_id)
def test_no_nsys_capture_has_a_library_phase(export: Path, tmp_path: Path) -> None:
    for _, found in _per_rank(_plain(export, tmp_path), None):
        assert set(found) <= {*PHASES, "unattributed"}


def test_a_range_left_open_is_reported_and_no_phase(tmp_path: Path) -> None:
    """The last optimizer mark never ended (and a start/end range ended on another thread):
    the warning names it, and its kernels are no optimizer's."""
    plain = _plain(FRAMEWORKS / "nsys-2025.3-h100-lightning.sqlite.xz", tmp_path)
    with sqlite3.connect(plain) as db:
        named = "(SELECT id FROM StringIds WHERE value = ?)"
        db.execute(
            "UPDATE NVTX_EVENTS SET end = NULL WHERE rowid = (SELECT max(rowid) FROM NVTX_EVENTS "
            f"WHERE eventType = 60 AND textId = {named})",
            ("optimizer",),
        )
        db.execute(
            "UPDATE NVTX_EVENTS SET endGlobalTid = globalTid + 1 WHERE eventType = 60 "
            f"AND textId = {named}",
            ("forward",),
        )
    report = analysis.kernel_report(load([plain], cache=False), top=0)
    assert any("still open when the capture ended (optimizer)" in n for n in report.notes)
    phases = {p["phase"]: p["kernels"] for p in report.to_json()["phases"]}
    assert phases["optimizer"] == 16  # two of the three steps' 8 each
    assert phases["forward"] == 165 and phases["backward"] == 312


PATTERNS = {
    "torch-h100-lightning-rank0": {"optimizer.step(closure)"},
    "torch-h100-lightning-ckpt-rank0": {"optimizer.step(closure)", "activation checkpointing"},
    "torch-h100-lightning-acc2-rank0": {"optimizer.step(closure)", "gradient accumulation"},
    "torch-h100-hf-rank0": {"gradient clipping / GradScaler"},
    "torch-h200x2-lightning-fsdp2-rank1": {"optimizer.step(closure)", "DDP/FSDP collectives"},
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_the_report_names_the_framework_pattern(name: str, tmp_path: Path) -> None:
    """On the traces without their truth marks: what the inference recognizes."""
    bare = _stripped(FRAMEWORKS / f"{name}.json.gz", tmp_path)
    report = analysis.kernel_report(load([bare], cache=False))
    source = report.to_json()["source"]
    assert set(source["patterns"]) == PATTERNS[name]
    assert source["phases_from"]
    assert any(n.startswith("Recognized: ") for n in report.notes)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("fwd=x", "'fwd' is not a phase"),
        ("forward", "PHASE=NAME pairs"),
        ("forward=a,forward=b", "names forward twice"),
        ("forward=a,backward=a", "one range to two phases"),
        ("forward=nothing:here", "no range of this trace matches"),
    ],
)
def test_bad_phase_ranges_end_with_one_line(value: str, says: str) -> None:
    trace = FRAMEWORKS / "torch-h100-hf-rank0.json.gz"
    for args in (["kernels", str(trace), "--no-cache"], ["diff", str(trace), str(trace)]):
        result = runner.invoke(app, [*args, "--phase-ranges", value])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0]


def test_phase_ranges_on_the_command_line() -> None:
    trace = FRAMEWORKS / "torch-h100-lightning-rank0.json.gz"
    result = runner.invoke(
        app, ["kernels", str(trace), "--phase-ranges", MARKS, "--format", "json", "--no-cache"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["source"]["phases_from"].startswith("Phases from the ranges mapped by")
    found = {p["phase"]: p["kernels"] for p in data["phases"]}
    assert found == {k: v[0] for k, v in chrome_truth(trace).items()}
    diffed = runner.invoke(
        app, ["diff", str(trace), str(trace), "--phase-ranges", MARKS, "--format", "json"]
    )
    assert diffed.exit_code == 0, diffed.stderr
    per_step = {row["phase"]: row["a_kernels"] for row in json.loads(diffed.stdout)["phases"]}
    assert per_step["forward"] == 55 and per_step["optimizer"] == 8  # 3 marks each


def test_phase_ranges_on_the_report(tmp_path: Path) -> None:
    """``report`` maps the marks where a trace has them; a bad value is one line, exit 2."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "torch-h100-lightning-rank0.json.gz").write_bytes(
        (FRAMEWORKS / "torch-h100-lightning-rank0.json.gz").read_bytes()
    )
    out, db = tmp_path / "reports" / "REPORT.md", profiles / "results.db"
    sqlite3.connect(db).close()  # an empty results DB: the traces alone are reported
    args = ["report", "--profiles", str(profiles), "--db", str(db), "--out", str(out)]
    args.append("--phase-ranges")
    result = runner.invoke(app, [*args, "forward=truth:forward,backward=truth:backward"])
    assert result.exit_code == 0, result.stderr
    text = out.read_text()
    assert "| forward | 3 | 165 |" in text and "| unattributed | 0 | 27 |" in text
    refused = runner.invoke(app, [*args, "fwd=x"])
    assert refused.exit_code == 2
    assert refused.stderr.strip().splitlines() == [
        "error: --phase-ranges: 'fwd' is not a phase; use forward, backward, optimizer"
    ]


def _renamed(trace: Path, folder: Path, names: dict[str, str]) -> Path:
    """A copy of a torch.profiler trace with its events named ``names``' keys renamed."""
    data = json.loads(gzip.decompress(trace.read_bytes()))
    for e in data["traceEvents"]:
        e["name"] = names.get(e.get("name", ""), e.get("name", ""))
    copy = folder / trace.name.removesuffix(".gz")
    copy.write_text(json.dumps(data))
    return copy


HF_DDP2 = [FRAMEWORKS / f"torch-h200x2-hf-ddp2-rank{r}.json.gz" for r in (0, 1)]
OWN_NAMES = {f"truth:{p}": f"mine:{p[:3]}" for p in PHASES}
OWN_MARKS = PhaseRanges.parse(",".join(f"{p}=mine:{p[:3]}" for p in PHASES))


def test_a_job_of_marked_rank_traces_has_their_steps(tmp_path: Path) -> None:
    """The steps of per-rank torch traces whose phases are marks: one a ``truth:forward``
    instance (plain JSON), by rank, whether the marks are spelled ``domain:phase`` or are
    the user's own names mapped by ``--phase-ranges``. (Steps were looked for under the
    marks' own names, so neither had any: no step table, no straggler, no lanes.)"""
    traces = HF_DDP2
    want = {}
    for r, trace in enumerate(traces):
        events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
        want[r] = sum(
            e.get("name") == "truth:forward" and e.get("cat") == "user_annotation" for e in events
        )
    assert min(want.values()) >= 2
    renamed = [_renamed(t, tmp_path, OWN_NAMES) for t in traces]
    for files, marks in (
        (traces, None),
        (traces, PhaseRanges.parse(MARKS)),
        (renamed, OWN_MARKS),
    ):
        report = analysis.kernel_report(load(files, cache=False), phase_ranges=marks)
        assert isinstance(report, RankedReport)
        assert report.steps.groupby("rank")["step"].nunique().to_dict() == want
        assert report.job()["steps"], "the job's steps"


def test_host_findings_say_where_by_the_marked_phases(tmp_path: Path) -> None:
    """The host findings of marked per-rank torch traces place the host's calls in the
    report's phases (a ``truth:forward`` mark is ``forward``, not the torch op range
    around it), the same whether the marks are spelled ``domain:phase`` or are the
    user's own names mapped by ``--phase-ranges``."""
    renamed = [_renamed(t, tmp_path, OWN_NAMES) for t in HF_DDP2]
    found = []
    for files, marks in ((HF_DDP2, None), (renamed, OWN_MARKS)):
        job = load(files, cache=False)
        hosts = host_traces(files, job.files)
        report = analysis.kernel_report(job, phase_ranges=marks, hosts=hosts)
        assert report.findings is not None
        host = [
            f for f in report.findings if f["kind"] in ("host_sync", "host_idle", "launch_bound")
        ]
        found.append(host)
    assert found[0] == found[1]
    syncs = [f for f in found[0] if f["kind"] == "host_sync"]
    assert len(syncs) == 2, "one a rank"
    for f in syncs:
        assert set(f["evidence"]["by_phase"]) == {"forward", "between phases"}
