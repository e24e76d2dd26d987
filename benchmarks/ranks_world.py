"""Does reading a multi-rank export cost more per kernel as the ranks grow?

Builds exports of the same run with as many kernels and 1, 2, 4, 8... ranks, and times
``profkit kernels EXPORT --format json --no-cache`` on each in a fresh process, the
exports alternating (so all see the same load), best and median of ``--runs``:

- *1 rank*: the committed 2-rank DDP export's rank 0 alone (``kernels_scale.one_process``),
  replicated ``2 * copies`` times: the same run's rows per kernel, read as one process;
- *W ranks*: the 2-rank export replicated ``copies`` times, the copies side by side as
  ``W / 2`` groups of two processes on their own GPUs (``kernels_scale.build``'s
  ``world``), so the kernels are as many as with 2 ranks, split over W.

A reader whose work grows with ranks × kernels (a pass over every activity per rank, say)
shows as a cost per kernel that grows with W; a reader linear in the rows stays flat past
two ranks, which pay once for what several processes need (every kernel's start, the NCCL
overlap, the per-rank tables). Writes ``ranks_world.json`` under ``--workdir`` (default
``$OUT`` or a temporary folder).

    python benchmarks/ranks_world.py --copies 100 --world 2 4 8 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from kernels_scale import KERNEL_TABLE, RANKS_FIXTURE, ROOT, build, stamp, timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=100, help="copies of the 2-rank export")
    parser.add_argument("--world", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="rworld-"))
    workdir.mkdir(parents=True, exist_ok=True)
    exports = {"1 rank": build(RANKS_FIXTURE, 2 * args.copies, workdir / "world1.sqlite", 0)}
    for world in args.world:
        target = workdir / f"world{world}-x{args.copies}.sqlite"
        exports[f"{world} ranks"] = build(RANKS_FIXTURE, args.copies, target, world=world)
    paths = {"1 rank": workdir / "world1.sqlite"}
    paths.update({f"{w} ranks": workdir / f"world{w}-x{args.copies}.sqlite" for w in args.world})
    kernels = {label: rows[KERNEL_TABLE] for label, rows in exports.items()}
    for label, count in kernels.items():
        print(f"{label}: {count:,} kernels")
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in paths}
    load_before = os.getloadavg()
    for _ in range(args.runs):
        for label, path in paths.items():
            argv = [sys.executable, "-m", "profkit", "kernels", str(path), "--format", "json",
                    "--no-cache"]  # fmt: skip
            runs[label].append(timed(argv, ROOT))
    result: dict[str, object] = {
        **stamp(load_before),
        "kernels": kernels,
        "runs": runs,
    }
    per_m: dict[str, dict[str, float]] = {}
    print(
        f"{'export':10s} {'wall s/M (median, best)':>26s} {'CPU s/M (median)':>18s} {'peak GiB':>9s}"
    )
    for label, timings in runs.items():
        scale = 1e6 / kernels[label]
        per_m[label] = {
            "wall_median": statistics.median(r["wall_s"] for r in timings) * scale,
            "wall_best": min(r["wall_s"] for r in timings) * scale,
            "cpu_median": statistics.median(r["cpu_s"] for r in timings) * scale,
            "peak_rss_gib": max(r["peak_rss_gib"] for r in timings),
        }
        row = per_m[label]
        print(f"{label:10s} {row['wall_median']:14.2f} {row['wall_best']:10.2f} "
              f"{row['cpu_median']:18.2f} {row['peak_rss_gib']:9.2f}")  # fmt: skip
    result["per_million_kernels"] = per_m
    out = workdir / "ranks_world.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
