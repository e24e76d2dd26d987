"""Several nodes' exports read as one job: ``profkit kernels NODE0 NODE1``, timed.

Builds two nodes' exports of one job from the committed 2-rank DDP export: node 0 is it
replicated ``--copies`` times (``kernels_scale.build``), node 1 a copy of node 0 as another
host's (``kernels_scale.another_node``: its process ids moved, its clock 3 ms ahead). Then
times ``profkit kernels node0 node1 --no-cache --format json`` in a fresh process, best and
median of ``--runs``: each node's compact columns read on its own, joined and analysed in
bounded memory (``analysis.joins``). It prints wall and CPU seconds and peak RSS, and checks
the report against what was built: twice node 0's kernels in all, node 1's ranks each with
its node 0 counterpart's kernels, and node 1's clock found 3 ms ahead. Writes
``nodes_scale.json`` under ``--workdir`` (default ``$OUT`` or a temporary folder); exit
status 1 if a check failed.

Until the full tables' engine was deleted this script also timed it on the same files
(``load_traces`` + ``merge_node_traces`` + ``analyze_any``, alternating with the command,
``--no-full`` to skip it) and compared the two reports; docs/PERFORMANCE.md keeps those
figures as the old code's. To time that engine again, run this script as of commit
1f38560 from a checkout of that commit.

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

SHIFT_NS = 3_000_000
LABEL = "profkit kernels"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=100, help="copies of the 2-rank export")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="nodes-"))
    workdir.mkdir(parents=True, exist_ok=True)
    node0 = workdir / f"node0-x{args.copies}.sqlite"
    rows = build(RANKS_FIXTURE, args.copies, node0)
    node1 = another_node(node0, workdir / f"node1-x{args.copies}.sqlite", shift_ns=SHIFT_NS)
    kernels = 2 * rows[KERNEL_TABLE]
    print(f"2 nodes x {rows[KERNEL_TABLE]:,} kernels (2 ranks each)")
    output = workdir / "nodes.json"
    argv = [sys.executable, "-m", "profkit", "kernels", str(node0), str(node1),
            "--no-cache", "--format", "json", "--out", str(output)]  # fmt: skip
    load_before = os.getloadavg()
    runs = [timed(argv, ROOT) for _ in range(args.runs)]
    checks = _checks(json.loads(output.read_text()), kernels)
    row = {
        "wall_s_median": statistics.median(r["wall_s"] for r in runs),
        "wall_s_best": min(r["wall_s"] for r in runs),
        "cpu_s_median": statistics.median(r["cpu_s"] for r in runs),
        "peak_rss_gib": max(r["peak_rss_gib"] for r in runs),
    }
    print(f"{LABEL} wall {row['wall_s_median']:6.2f} s (best {row['wall_s_best']:.2f}), "
          f"CPU {row['cpu_s_median']:6.2f} s, peak RSS {row['peak_rss_gib']:.2f} GiB")  # fmt: skip
    for check, ok in checks.items():
        print(f"{check}: {ok}")
    result = {
        **stamp(load_before),
        "kernels": kernels,
        "runs": {LABEL: runs},
        "summary": {LABEL: row},
        "checks": checks,
    }
    (workdir / "nodes_scale.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {workdir / 'nodes_scale.json'}")
    return 0 if all(checks.values()) else 1


def _checks(report: dict[str, Any], kernels: int) -> dict[str, bool]:
    """The report against what was built: node 1 a copy of node 0, its clock ``SHIFT_NS``
    ahead."""
    nodes, ranks = report["nodes"], report["ranks"]
    each = [r["kernels"] for r in ranks]
    half = len(each) // 2
    offset = nodes[1]["offset_ms"] if len(nodes) == 2 else None
    return {
        "kernels twice node 0's": report["totals"]["kernels"] == kernels,
        "node 1's ranks as node 0's": len(nodes) == 2 and half > 0 and each[:half] == each[half:],
        "node 1's clock found 3 ms ahead": offset is not None
        and abs(offset - SHIFT_NS / 1e6) < 1e-3,
    }


if __name__ == "__main__":
    sys.exit(main())
