"""Several nodes' exports read as one job: the compact columns against the full tables.

Builds two nodes' exports of one job from the committed 2-rank DDP export: node 0 is it
replicated ``--copies`` times (``kernels_scale.build``), node 1 a copy of node 0 as another
host's (``kernels_scale.another_node``: its process ids moved, its clock 3 ms ahead). Then,
alternating, each in a fresh process, best and median of ``--runs``:

- *columns*: ``profkit kernels node0 node1 --no-cache --format json``, which reads each
  node's compact columns and analyses them streaming (``analysis.stream_nodes``);
- *full tables*: what ``profkit kernels`` did before, and does where the columns cannot
  serve: ``load_traces`` + ``merge_node_traces`` + ``analyze_any``, and the JSON.

It prints wall and CPU seconds and peak RSS of each, and checks that both give the same
totals, ranks and nodes (``--no-full``: the columns alone, for scales whose full tables
would take minutes). Writes ``nodes_scale.json`` under ``--workdir`` (default ``$OUT``
or a temporary folder).

    python benchmarks/nodes_scale.py --copies 100 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from kernels_scale import KERNEL_TABLE, RANKS_FIXTURE, ROOT, another_node, build, stamp, timed

FULL = """
import sys
from pathlib import Path
from profkit.analysis import analyze_any
from profkit.analysis.nodes import merge_node_traces
from profkit.formats import dumps
from profkit.traces.load import load_traces
report = analyze_any(merge_node_traces(load_traces([Path(p) for p in sys.argv[2:]])))
Path(sys.argv[1]).write_text(dumps(report.to_json()))
"""
SHIFT_NS = 3_000_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=100, help="copies of the 2-rank export")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--no-full", action="store_true", help="time the columns' read only")
    args = parser.parse_args()
    workdir = args.workdir or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="nodes-"))
    workdir.mkdir(parents=True, exist_ok=True)
    node0 = workdir / f"node0-x{args.copies}.sqlite"
    rows = build(RANKS_FIXTURE, args.copies, node0)
    node1 = another_node(node0, workdir / f"node1-x{args.copies}.sqlite", shift_ns=SHIFT_NS)
    kernels = 2 * rows[KERNEL_TABLE]
    print(f"2 nodes x {rows[KERNEL_TABLE]:,} kernels (2 ranks each)")
    outputs = {"columns": workdir / "columns.json", "full tables": workdir / "full.json"}
    argv = {
        "columns": [sys.executable, "-m", "profkit", "kernels", str(node0), str(node1),
                    "--no-cache", "--format", "json", "--out", str(outputs["columns"])],
        "full tables": [sys.executable, "-c", FULL, str(outputs["full tables"]), str(node0),
                        str(node1)],
    }  # fmt: skip
    if args.no_full:
        del argv["full tables"], outputs["full tables"]
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in argv}
    load_before = os.getloadavg()
    for _ in range(args.runs):
        for label, command in argv.items():
            runs[label].append(timed(command, ROOT))
    got = {label: json.loads(path.read_text()) for label, path in outputs.items()}
    same = None if args.no_full else _same(got["columns"], got["full tables"])
    summary = {}
    for label, timings in runs.items():
        summary[label] = {
            "wall_s_median": statistics.median(r["wall_s"] for r in timings),
            "wall_s_best": min(r["wall_s"] for r in timings),
            "cpu_s_median": statistics.median(r["cpu_s"] for r in timings),
            "peak_rss_gib": max(r["peak_rss_gib"] for r in timings),
        }
        row = summary[label]
        print(f"{label:12s} wall {row['wall_s_median']:6.2f} s (best {row['wall_s_best']:.2f}), "
              f"CPU {row['cpu_s_median']:6.2f} s, peak RSS {row['peak_rss_gib']:.2f} GiB")  # fmt: skip
    if same is not None:
        print(f"same totals, ranks and nodes: {same}")
    result = {
        **stamp(load_before),
        "kernels": kernels,
        "runs": runs,
        "summary": summary,
        "same": same,
    }
    (workdir / "nodes_scale.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {workdir / 'nodes_scale.json'}")
    return 1 if same is False else 0


def _same(columns: dict[str, Any], full: dict[str, Any]) -> bool:
    """Whether the two reads agree on the totals, the nodes and each rank's kernels."""
    if any(columns[key] != full[key] for key in ("totals", "nodes")):
        return False
    return [r["kernels"] for r in columns["ranks"]] == [r["kernels"] for r in full["ranks"]]


if __name__ == "__main__":
    sys.exit(main())
