"""How much time and memory do ``memory summarize`` and ``memory plot`` take on a snapshot
with millions of trace entries, before and after the streaming reader?

Builds large snapshots from a real one (a committed fixture from tests/data/) the way a
long recording looks: the trace is the fixture's trace preceded by ``copies - 1`` copies
of its *balanced* part (the allocations both made and freed inside the trace, with their
``free_completed``, and segments both reserved and released in it), each copy at its own
addresses (+ copy x 2^48, above any real device address) and earlier in time. Every entry
is its own dict with its own frames list of the shared frame dicts, as torch writes them,
and the file is a protocol 4 pickle. The last copy is the fixture's own trace, so the
state at the dump is exact: walking back from it meets no inconsistent event, and the
last states of the timeline are the fixture's.

Then, for each size, runs ``python -m profkit memory summarize FILE --format json`` and
``python -m profkit memory plot FILE -o PNG --format json`` in fresh processes, with this
tree and with a baseline tree (``--baseline``, a git revision unpacked into a temporary
directory: by default the last commit before the streaming reader), and reads each one's
wall time, CPU time (user + system) and peak RSS with ``os.wait4``. Best of ``--runs``.
It checks that both trees print the same summary and draw the same PNG, byte for byte.

    python benchmarks/memory_scale.py                        # 1 M and 4 M entries
    python benchmarks/memory_scale.py --entries 250000 --runs 1
    python benchmarks/memory_scale.py --entries 4000000 --no-baseline
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "memory-2.7B-ctx512-train-fp32.pickle.xz"
BASELINE = "3160c87"  # the last commit that loaded every snapshot whole
ADDRESS_STEP = 1 << 48
MIB = 1024**2


def balanced_events(trace: list[dict[str, Any]]) -> list[int]:
    """Indices of the events of allocations made and freed inside the trace (alloc,
    free_requested, free_completed) and of segments reserved and released in it."""
    keep: list[int] = []
    allocated: dict[int, int] = {}
    freed: dict[int, int] = {}  # addr -> index of the free_requested still to complete
    reserved: dict[int, int] = {}
    for index, event in enumerate(trace):
        action, addr = event["action"], event.get("addr")
        if action == "alloc":
            allocated[addr] = index
        elif action == "free_requested" and addr in allocated:
            keep += [allocated.pop(addr), index]
            freed[addr] = len(keep)
        elif action == "free_completed" and addr in freed:
            freed.pop(addr)
            keep.append(index)
        elif action == "segment_alloc":
            reserved[addr] = index
        elif action == "segment_free" and addr in reserved:
            keep += [reserved.pop(addr), index]
    return sorted(keep)


def replicate(snapshot: dict[str, Any], copies: int) -> dict[str, Any]:
    """``snapshot`` with its busiest trace grown to ``copies`` copies (module docstring)."""
    traces = snapshot["device_traces"]
    device = max(range(len(traces)), key=lambda d: len(traces[d]))
    trace = traces[device]
    balanced = [trace[i] for i in balanced_events(trace)]
    span = trace[-1]["time_us"] - trace[0]["time_us"] + 1
    grown: list[dict[str, Any]] = []
    for copy in range(1, copies):
        shift_addr, shift_time = copy * ADDRESS_STEP, (copies - copy) * span
        for event in balanced:
            entry = dict(event, addr=event["addr"] + shift_addr, frames=list(event["frames"]))
            entry["time_us"] = event["time_us"] - shift_time
            grown.append(entry)
    grown.extend(trace)
    out = dict(snapshot)
    out["device_traces"] = [grown if d == device else t for d, t in enumerate(traces)]
    return out


def build(fixture: Path, entries: int, target: Path) -> int:
    """Write a snapshot of about ``entries`` trace entries; return its entry count."""
    sys.path.insert(0, str(ROOT))
    from profkit.memory.snapshot import loads_plain

    snapshot = loads_plain(lzma.decompress(fixture.read_bytes()))
    trace = max(snapshot["device_traces"], key=len)
    per_copy = len(balanced_events(trace))
    copies = max(1, 1 + round((entries - len(trace)) / max(per_copy, 1)))
    count = len(trace) + (copies - 1) * per_copy
    stamp = target.with_suffix(".built.json")
    if (
        target.exists()
        and stamp.exists()
        and json.loads(stamp.read_text()) == [fixture.name, count]
    ):
        return count
    grown = replicate(snapshot, copies)
    with target.open("wb") as out:
        pickle.dump(grown, out, protocol=4)  # what torch's _dump_snapshot and profkit write
    stamp.write_text(json.dumps([fixture.name, count]))
    return count


# Linux keeps a process's peak RSS across fork and exec: a child of a big process reports
# at least its parent's peak. So each command runs under this small launcher, which reads
# the command's own figures with wait4.
LAUNCHER = """
import json, os, subprocess, sys, time
with open(sys.argv[1], "wb") as out:
    started = time.perf_counter()
    child = subprocess.Popen(sys.argv[2:], stdout=out)
    _, status, usage = os.wait4(child.pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(status),
                  "wall_s": time.perf_counter() - started,
                  "cpu_s": usage.ru_utime + usage.ru_stime,
                  "peak_rss_mib": usage.ru_maxrss / 1024}))  # KiB on Linux
"""


def measure(argv: list[str], pythonpath: Path) -> dict[str, Any]:
    """Run ``argv`` in a fresh process: wall and CPU seconds, peak RSS, its stdout."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath), OMP_NUM_THREADS="1")
    with tempfile.NamedTemporaryFile() as out:
        launched = subprocess.run(
            [sys.executable, "-c", LAUNCHER, out.name, *argv],
            capture_output=True, text=True, env=env, cwd=pythonpath,
        )  # fmt: skip
        result = json.loads(launched.stdout.splitlines()[-1]) if launched.stdout else {}
        if result.get("status") != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{launched.stderr}")
        result["stdout"] = Path(out.name).read_text()
    return result


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "wall_s": min(r["wall_s"] for r in runs),
        "cpu_s": min(r["cpu_s"] for r in runs),
        "peak_rss_mib": min(r["peak_rss_mib"] for r in runs),
        "stdout": runs[0]["stdout"],
    }


def run_tree(tree: Path, snapshot: Path, png: Path, runs: int) -> dict[str, dict[str, Any]]:
    commands = {
        "summarize": ["memory", "summarize", str(snapshot), "--format", "json"],
        "plot": ["memory", "plot", str(snapshot), "-o", str(png), "--format", "json"],
    }
    return {
        name: best([measure([sys.executable, "-m", "profkit", *args], tree) for _ in range(runs)])
        for name, args in commands.items()
    }


def unpack_baseline(revision: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--runs", type=int, default=3, help="best of N fresh processes")
    parser.add_argument("--baseline", default=BASELINE, help="git revision to compare with")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--build", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    workdir = args.workdir or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="memscale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.build:
        print(build(args.fixture, args.build, workdir / f"memory-x{args.build}.pickle"))
        return
    trees = {"after": ROOT}
    if not args.no_baseline:
        trees = {"before": unpack_baseline(args.baseline, Path(tempfile.mkdtemp())), **trees}
    load = os.getloadavg()[0]
    print(f"# memory_scale on {platform.node()} ({os.cpu_count()} cores), "
          f"{time.strftime('%Y-%m-%d %H:%M')}, 1-min load {load:.2f}, best of {args.runs}")  # fmt: skip
    print("| entries | file MiB | command | tree | wall s | CPU s | peak RSS MiB |")
    print("|--:|--:|:--|:--|--:|--:|--:|")
    for entries in args.entries:
        snapshot = workdir / f"memory-x{entries}.pickle"
        built = subprocess.run(
            [
                sys.executable,
                __file__,
                "--build",
                str(entries),
                "--fixture",
                str(args.fixture),
                "--workdir",
                str(workdir),
            ],
            check=True,
            capture_output=True,
            text=True,
        )  # fmt: skip: in its own process, so that this one stays small
        count = int(built.stdout)
        size = snapshot.stat().st_size / MIB
        results = {
            tree: run_tree(path, snapshot, workdir / f"x{entries}-{tree}.png", args.runs)
            for tree, path in trees.items()
        }
        for command in ("summarize", "plot"):
            for tree, result in results.items():
                r = result[command]
                print(f"| {count:,} | {size:,.0f} | {command} | {tree} | {r['wall_s']:.1f} | "
                      f"{r['cpu_s']:.1f} | {r['peak_rss_mib']:,.0f} |", flush=True)  # fmt: skip
        if "before" in results:
            same = json.loads(results["before"]["summarize"]["stdout"]) == json.loads(
                results["after"]["summarize"]["stdout"]
            )
            pngs = [(workdir / f"x{entries}-{t}.png").read_bytes() for t in ("before", "after")]
            print(f"<!-- {count:,} entries: same summary {same}, same PNG {pngs[0] == pngs[1]} -->")
        if not args.workdir and not os.environ.get("OUT"):
            snapshot.unlink()


if __name__ == "__main__":
    main()
