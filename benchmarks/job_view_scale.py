"""A job of many ranks in the terminal: lines and time of ``profkit kernels NODE...``.

Builds ``--nodes`` exports of one job from the committed 2-rank DDP export (:func:`node_set`,
also tests/test_job_view.py's job). No many-host capture exists here, so node *k* is the
real export with its process ids
moved (``kernels_scale.another_node``: another host's processes), its clock
``k × 100 µs`` ahead (an NTP-sized offset profkit finds and takes out), its host named
``nodeK``, and a pause of its
own inserted in the last captured step (every time from :data:`PAUSE_AT_NS` on moved
later), so that its ranks' step times differ from the other nodes' by a known amount.

Then, with the columnar cache warm (one run first), it times ``profkit kernels NODE...``
printing to a 200-column pipe, the median wall and CPU seconds of ``--runs``, and counts
its lines; with ``--before DIR`` (a checkout of older code, e.g. ``git archive 20eca74 |
tar -x -C DIR``) the same with that code, the two alternating. In this process it also
times the rendering alone of the one report (CPU seconds), as the terminal shows it (the
job's tables) and as it showed it before (every rank's tables, as ``--format md`` still
writes them). Writes ``job_view_scale.json`` under
``--workdir`` (default ``$OUT`` or a temporary folder).

    python benchmarks/job_view_scale.py --nodes 32 --runs 3 --before /tmp/profkit-20eca74
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernels_scale import PID_STEP, RANKS_FIXTURE, ROOT, another_node, timed

OFFSET_NS = 100_000
"""Node k's clock runs k × this ahead of node 0's."""
PAUSE_AT_NS = 240_000_000
"""Inside the last step's backward on both ranks (the export's third step runs from 188 ms
to 274 ms of its clock): a pause here lengthens that step's GPU span by the pause."""
PAUSE_UNIT_NS = 250_000


def pause_ns(node: int, nodes: int) -> int:
    """Node ``node``'s pause: a multiple of 0.25 ms, every node's different (a stride
    coprime to the count), so the slowest node is neither the first nor the last file."""
    stride = next(s for s in (5, 7, 11, 13) if nodes % s)
    return (node * stride) % nodes * PAUSE_UNIT_NS


def node_set(folder: Path, nodes: int) -> list[Path]:
    """``nodes`` exports of one job in ``folder`` (``node0.sqlite`` ...), in node order."""
    folder.mkdir(parents=True, exist_ok=True)
    first = folder / "ddp2.sqlite"
    if not first.exists():
        with lzma.open(RANKS_FIXTURE) as src, first.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    paths = []
    for node in range(nodes):
        path = folder / f"node{node}.sqlite"
        if not path.exists():
            shift = node * OFFSET_NS
            another_node(first, path, node * PID_STEP, shift)
            _pause(path, PAUSE_AT_NS + shift, pause_ns(node, nodes))
            with sqlite3.connect(path) as conn:  # its own host, as a node's export names
                conn.execute(
                    "UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'",
                    (f"node{node}",),
                )
        paths.append(path)
    return paths


def _pause(path: Path, at_ns: int, by_ns: int) -> None:
    """Every activity, API call and NVTX time from ``at_ns`` on moved ``by_ns`` later."""
    if not by_ns:
        return
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            if not table.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS")):
                continue
            columns = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
            moved = [
                f'"{c}" = CASE WHEN "{c}" >= {at_ns} THEN "{c}" + {by_ns} ELSE "{c}" END'
                for c in ("start", "end")
                if c in columns
            ]
            if moved:
                conn.execute(f'UPDATE "{table}" SET {", ".join(moved)}')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32, help="nodes of 2 ranks each")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None, help="a checkout of older code")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="job-"))
    paths = node_set(workdir / f"nodes{args.nodes}", args.nodes)
    env = {**os.environ, "COLUMNS": "200", "PROFKIT_CACHE_DIR": str(workdir / "cache")}
    result: dict[str, Any] = {"nodes": args.nodes, "ranks": 2 * args.nodes}
    codes = {"after": ROOT, **({"before": args.before} if args.before else {})}
    argv = [sys.executable, "-m", "profkit", "kernels", *map(str, paths)]
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in codes}
    for run in range(args.runs + 1):  # the first fills the cache; then the codes alternate
        for label, code in codes.items():
            out = workdir / f"{label}.txt"
            timing = timed(argv, workdir, {**env, "PYTHONPATH": str(code)}, out)
            if run:
                runs[label].append(timing)
    for label in codes:
        lines = len((workdir / f"{label}.txt").read_text().splitlines())
        wall = statistics.median(r["wall_s"] for r in runs[label])
        cpu = statistics.median(r["cpu_s"] for r in runs[label])
        result[label] = {"lines": lines, "wall_s_median": wall, "cpu_s_median": cpu}
        print(f"{label}: {lines:,} lines, median of {args.runs}: {wall:.2f} s wall, "
              f"{cpu:.2f} s CPU")  # fmt: skip
    result["load_1min"] = os.getloadavg()[0]
    os.environ["PROFKIT_CACHE_DIR"] = env["PROFKIT_CACHE_DIR"]
    result["render"] = _render_times(paths, args.runs)
    for label, found in result["render"].items():
        print(f"rendering alone, {label}: {found['lines']:,} lines, {found['s_best']:.3f} s CPU")
    (workdir / "job_view_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _render_times(paths: list[Path], runs: int) -> dict[str, dict[str, float]]:
    """The one report's terminal rendering: the job's tables, and every rank's."""
    sys.path.insert(0, str(ROOT))
    from rich.console import Console

    from profkit import analysis
    from profkit.analysis.job_view import job_tables
    from profkit.analysis.presentation import rank_tables
    from profkit.cli.render import rich_table
    from profkit.traces.job import load

    report = analysis.kernel_report(load(paths))
    found = {}
    for label, tables_of in (("job tables", job_tables), ("every rank's tables", rank_tables)):
        times, text = [], ""
        for _ in range(runs):  # CPU time: the shared machine's load leaves it alone
            started = time.process_time()
            tables = tables_of(report) + analysis.display_tables(report)
            sink = io.StringIO()
            console = Console(file=sink, width=200)
            for title, table in tables:
                console.print(rich_table(table, title, width=200))
            times.append(time.process_time() - started)
            text = sink.getvalue()
        found[label] = {"lines": len(text.splitlines()), "s_best": min(times)}
    return found


if __name__ == "__main__":
    sys.exit(main())
