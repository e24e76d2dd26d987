"""What SQLite alone charges per kernel row for what a multi-rank report must read.

A report of one process reads, per kernel row, its correlation id, its duration and its
name (``profkit kernels``' one-process read). Several processes' ranks need more: each
kernel's GPU start (steps, NCCL overlap) and its process (to find its launch among the
processes' calls). This times, on one export, the chunk queries that the reader sends
(built by the reader's own code, so they stay what it asks), on one thread, every chunk
of the kernel table, best of ``--runs`` per chunk:

- *one process*: the one-process read's kernel query;
- *several processes*: the multi-process read's kernel query (what ``profkit kernels``
  sends for this export when it has several CUDA processes);
- *with start, no process*: the cheapest way to read a start as well: the one-process
  query plus ``start`` as stored (its cells checked by the parse, as the multi-process
  read does) and ``end`` checked by ``max()`` (which ``"end" - start`` needs). A bound
  from below: it leaves out the process, which two processes' correlation ids need.

It prints milliseconds per million kernel rows and each query's ratio to the one-process
one: how far below "no slower per kernel than one process" the read of the starts alone
puts a multi-rank read, before any analysis.

    python benchmarks/read_floor.py EXPORT.sqlite --runs 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profkit.errors import BadInput  # noqa: E402
from profkit.traces import sqlite_scan  # noqa: E402
from profkit.traces.nsys_columns import CHUNK_ROWS, _activity_exprs, _Plan  # noqa: E402
from profkit.traces.nsys_export import (  # noqa: E402
    API_TABLES,
    KERNEL_TABLE,
    check_nsys,
    opened_export,
)


def queries(
    conn: sqlite3.Connection, tables: dict[str, list[str]]
) -> dict[str, sqlite_scan._ChunkQuery]:
    """The kernel table's chunk query of each variant (see the module doc)."""
    api = [t for t in API_TABLES if t in tables and "globalTid" in tables[t]]
    several = _Plan.of(conn, tables, api)
    if several.one_process is not None:
        raise BadInput("one CUDA process: give a multi-rank export")
    codec = dataclasses.replace(several.codec, use_pid=False)
    one = dataclasses.replace(several, codec=codec, one_process=codec.pid0, devices=None)
    info = sqlite_scan._column_info(conn, KERNEL_TABLE)
    variants = {}
    for label, plan, extra, checked in (
        ("one process", one, {}, None),
        ("several processes", several, {}, None),
        ("with start, no process", one, {"start": "start"}, ("end",)),
    ):
        exprs, check = _activity_exprs(conn, plan, tables, KERNEL_TABLE, False)
        exprs = {**exprs, **extra}
        check = check if checked is None else checked
        variants[label] = sqlite_scan._chunk_query(KERNEL_TABLE, exprs, "", -1, info, check)
    return variants


def measure(
    conn: sqlite3.Connection, tables: dict[str, list[str]], runs: int
) -> tuple[int, int, dict[str, sqlite_scan._ChunkQuery], dict[str, float]]:
    """Rows, chunks, the queries and the seconds each spent over all chunks (best of
    ``runs`` per chunk, the queries alternating so that all see the same load)."""
    variants = queries(conn, tables)
    conn.execute(f"PRAGMA cache_size = -{sqlite_scan.STREAM_CACHE_KIB}")
    chunks = sqlite_scan.chunk_bounds(conn, KERNEL_TABLE, CHUNK_ROWS)
    rows = int(conn.execute(f"SELECT count(*) FROM {KERNEL_TABLE}").fetchone()[0])
    spent = dict.fromkeys(variants, 0.0)
    for bounds in chunks:
        best = dict.fromkeys(variants, float("inf"))
        for _ in range(runs):
            for label, query in variants.items():
                started = time.perf_counter()
                sqlite_scan._read_chunk(conn, query, bounds)
                best[label] = min(best[label], time.perf_counter() - started)
        for label in variants:
            spent[label] += best[label]
    return rows, len(chunks), variants, spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    try:
        with opened_export(args.export) as (conn, _):
            tables = sqlite_scan.table_columns(conn)
            check_nsys(args.export, tables)
            if KERNEL_TABLE not in tables:
                raise BadInput(f"{args.export} has no kernel table")
            rows, chunks, variants, spent = measure(conn, tables, args.runs)
    except BadInput as exc:  # a user's error: one line, as the CLI gives it
        text = str(exc)
        print(f"error: {text if str(args.export) in text else f'{args.export}: {text}'}",
              file=sys.stderr)  # fmt: skip
        return 2
    base = spent["one process"]
    result = {"export": str(args.export), "kernel_rows": rows, "runs": args.runs, "queries": {}}
    print(f"{args.export.name}: {rows:,} kernel rows, {chunks} chunks, best of {args.runs}")
    for label, query in variants.items():
        per_m = spent[label] * 1e3 * 1e6 / rows
        print(f"  {label:24s} {per_m:7.0f} ms per M rows  {spent[label] / base:5.2f}x")
        result["queries"][label] = {
            "sql": query.sql,
            "ms_per_m_rows": per_m,
            "ratio": spent[label] / base,
        }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
