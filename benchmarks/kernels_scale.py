"""How fast is ``profkit kernels`` on a large Nsight Systems export, and how much memory?

Builds a large export by replicating a real one (a committed fixture from tests/data/) N
times, each copy shifted in time and in correlation ids, so that every table keeps its
real shape: kernels, copies, memsets, runtime API rows and NVTX ranges on the right
threads. Then times ``python -m profkit kernels BIG.sqlite --format json`` (all tables in
one pass) in a fresh process and reads its peak RSS with ``wait4`` (tracemalloc would miss
numpy's and SQLite's own allocations). With ``--breakdown`` it also times the stages in
this process.

Scales: ``--scale N`` is the issue's ×N, N units of 8 copies of the fixture (one unit:
30,864 kernels, 55,472 runtime rows; ×1000: 30.9 M kernels, 55.5 M runtime rows, ~5 GB);
several (``--scale 1 100 1000``) run one after the other, each export deleted when done
(unless ``--keep``); ``--copies`` counts fixture copies directly.

It also measures the floor: one bare SQL scan of the kernel, copy, memset and runtime
tables (``SELECT total(start), total(end), total(correlationId)`` over each, one connection;
total, not sum: sums of ×1000 start times overflow 64 bits), which any reader of those rows
must pay, run alternately with ``profkit kernels --no-cache`` (best of ``--runs`` each, so
both see the same load), and prints the ratio of wall times and of CPU times.
``--cache`` adds the columnar cache: a first read that writes it, then each repeated query
from it (``--phase backward``, ``--range 'computing softmax'``, ``--top 0``, and
``profkit diff BIG BIG``), each as a share of the uncached read. The old engine's
in-memory path (``load_trace`` + ``analyze``, the full tables) is deleted: its figures in
docs/PERFORMANCE.md are the old code's; to time it again, run this script with
``--legacy`` as of commit 1f38560, from a checkout of that commit. ``engine_scale.py
--checkout`` times two checkouts' ``profkit kernels`` against each other.

Where nsys is installed (``--nsys``, ``$PROFKIT_NSYS`` or PATH) it also times
``nsys stats --report cuda_gpu_kern_sum`` and ``--report nvtx_gpu_proj_sum`` on the same
file and prints the ratio. The JSON summary, ``kernels_scale.json``, goes under
``--workdir`` (default ``$OUT`` or a temp dir) and is rewritten after each scale, so a run
cut short keeps what it finished.

    python benchmarks/kernels_scale.py                  # ~3 M activities, ~5 M API rows
    python benchmarks/kernels_scale.py --scale 100 --cache
    python benchmarks/kernels_scale.py --scale 1 100 1000 --cache --runs 3 3 1   # GPU host
    python benchmarks/kernels_scale.py --copies 10      # a quick look
    python benchmarks/kernels_scale.py --ranks 100      # 2-rank export vs 1-rank, per kernel

``--ranks N`` compares the per-kernel cost of reading a multi-rank export with a one-rank
one: the committed 2-rank DDP export (two processes, one per GPU) replicated N times —
every copy keeps its rows' global thread and process ids, so the two ranks stay two
processes — against the 1-rank fixture replicated to about the same number of kernels.
The two runs differ in more than their ranks: the 2-rank DDP step has 2.07 runtime API
rows and 0.09 copies per kernel, the 1-rank fixture 1.80 and 0.03. So a third export is
timed too, *rank 0 alone*: the 2-rank export with rank 1's rows dropped
(:func:`one_process`), replicated 2N times, the same run's rows per kernel read as one
process. Each ``profkit kernels --no-cache --format json`` runs in a fresh process, the
three alternating (back to back), best of ``--runs``; it prints seconds per million
kernels (wall and CPU) and peak RSS of each, and the 2-rank export's ratio to each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import lzma
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "nsys-2025.3-h100-small-fp32.sqlite.xz"
RANKS_FIXTURE = ROOT / "tests" / "data" / "nsys-2025.3-h200x2-small-ddp2.sqlite.xz"
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
REPLICATED = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_DRIVER",
    "NVTX_EVENTS",
)
GIB = 1024**3
UNIT_COPIES = 8  # the issue's ×1: 8 copies of the fixture (30,864 kernels, 55,472 API rows)
SCANNED = REPLICATED[:4]
# One bare scan: every row of the tables a kernel report must read, nothing else done.
SCAN = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
for table in sys.argv[2:]:
    if table in names:
        conn.execute(f'SELECT total(start), total("end"), total(correlationId) FROM "{table}"').fetchone()
"""


ORDER = "copy by copy"  # how the rows are laid out (a build stamped otherwise is redone)
RANK0 = "rank 0 alone"
# A world of more ranks than the fixture's: each group of copies runs as other processes
# on other GPUs, this far apart in pid (the pid field of globalPid/globalTid is 24 bits).
PID_STEP = 100_000
PID_BITS = 24
CONTEXTS = "TARGET_INFO_CUDA_CONTEXT_INFO"


def build(
    fixture: Path, copies: int, target: Path, rank: int | None = None, world: int | None = None
) -> dict[str, int]:
    """Write ``target``: the fixture's export with its activity tables repeated ``copies``
    times; ``rank``: first drop every process's rows but that rank's (:func:`one_process`).

    ``world``: a multiple of the fixture's ranks. The copies then run side by side as
    ``world / ranks`` groups, as the ranks of a larger job do: copy ``i`` is group ``i %
    groups`` (its processes, threads and GPUs renumbered apart, the contexts table told of
    them) at time slot ``i // groups``. The kernels are as many as for ``world=None``, split
    over more ranks."""
    stamp = target.with_suffix(".built.json")
    wanted = {"copies": copies, "fixture": fixture.name, "order": ORDER, "rank": rank}
    if world is not None:
        wanted["world"] = world
    if target.exists() and stamp.exists():
        built = json.loads(stamp.read_text())
        if {key: built.get(key) for key in wanted} == wanted:
            return built["rows"]
    target.unlink(missing_ok=True)
    with lzma.open(fixture) as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    conn = sqlite3.connect(target)
    if rank is not None:
        one_process(conn, gpu_processes(conn)[rank])
    devices = len(gpu_processes(conn))
    groups = 1 if world is None else world // devices
    if groups * devices != (world or devices):
        raise SystemExit(f"--world {world} is not a multiple of the fixture's {devices} ranks")
    conn.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    lo, hi = _time_span(conn, tables)
    shift = (hi - lo) + 1_000_000  # each copy starts 1 ms after the previous one ended
    corr_shift = _max_correlation(conn, tables) + 1
    rows = {}
    for table in REPLICATED:
        if table not in tables:
            continue
        columns = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
        shifted = [_shifted(c, shift, corr_shift, groups, devices) for c in columns]
        conn.execute(f'CREATE TEMP TABLE original AS SELECT * FROM "{table}"')
        # Copy after copy, each in the original's row order, as an export stores its rows
        # (by time, so by correlation id within a process): CROSS JOIN makes the copies
        # SQLite's outer loop. A plain join left the order to the planner, which on some
        # SQLite versions put each row next to its copies, as no export has them.
        if copies > 1:  # the recursion's first row is copy 1: one copy would be two
            conn.execute(
                f"WITH RECURSIVE copy(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM copy "
                f"WHERE i < {copies - 1}) "
                f'INSERT INTO "{table}" ({", ".join(columns)}) '
                f"SELECT {', '.join(shifted)} FROM copy CROSS JOIN original"
            )
        conn.execute("DROP TABLE original")
        rows[table] = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    if groups > 1:
        _more_contexts(conn, groups, devices)
    conn.commit()
    if copies <= 1000:  # a 5 GB file gains nothing from a rewrite: the copies are appended
        conn.execute("VACUUM")
    conn.close()
    stamp.write_text(json.dumps({**wanted, "rows": rows}))
    return rows


def stamp(load_before: tuple[float, float, float]) -> dict[str, object]:
    """When and where a run was measured, for its JSON: date, CPUs, load before and after."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }


def gpu_processes(conn: sqlite3.Connection) -> list[int]:
    """The processes of an export that own a CUDA context, in rank order (device, pid)."""
    found = conn.execute("SELECT DISTINCT deviceId, processId FROM TARGET_INFO_CUDA_CONTEXT_INFO")
    return [pid for _, pid in sorted(found)]


def one_process(conn: sqlite3.Connection, pid: int) -> None:
    """Drop every row of another process than ``pid``: the activities, API calls, NVTX
    ranges, contexts, streams and threads of the other ranks (their ``globalPid`` or
    ``globalTid`` holds the process id in bits 24-47; the target tables name it
    ``processId``). What is left is one rank's export, as nsys would write it for a
    profile of that process alone, with the same run's rows per kernel."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        columns = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
        for column in ("globalPid", "globalTid"):
            if column in columns:
                conn.execute(f'DELETE FROM "{table}" WHERE ("{column}" >> 24) & 16777215 != ?',
                             (pid,))  # fmt: skip
                break
        else:
            if "processId" in columns:
                conn.execute(f'DELETE FROM "{table}" WHERE processId != ?', (pid,))
    conn.commit()


def another_node(src: Path, dst: Path, step: int = PID_STEP, shift_ns: int = 0) -> Path:
    """A copy of export ``src`` as another node's of the same job: every process id moved
    by ``step`` (``globalPid`` / ``globalTid`` hold it in bits 24-47; the target tables name
    it ``processId``, ``PROCESSES`` ``pid``), every activity, API call and NVTX time moved
    by ``shift_ns`` (a clock that far ahead; the recorded session start kept)."""
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            columns = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
            moved = [f'"{c}" = "{c}" + {step << PID_BITS}' for c in ("globalPid", "globalTid")
                     if c in columns]  # fmt: skip
            moved += [f'"{c}" = "{c}" + {step}' for c in ("processId",) if c in columns]
            if table == "PROCESSES":
                moved.append(f"pid = pid + {step}")
            if shift_ns and table.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS")):
                moved += [f'"{c}" = "{c}" + {shift_ns}' for c in ("start", "end") if c in columns]
            if moved:
                conn.execute(f'UPDATE "{table}" SET {", ".join(moved)}')
    return dst


def _shifted(column: str, shift: int, corr_shift: int, groups: int = 1, devices: int = 1) -> str:
    """Copy ``i``'s value of ``column``: later in time and correlation ids by its slot, and
    (``groups`` > 1) in another group's processes and GPUs."""
    slot = "i" if groups == 1 else f"(i / {groups})"  # integer division in SQLite
    if column in ("start", "end"):
        return f"{column} + {slot} * {shift}"
    if column == "correlationId":
        return f"correlationId + {slot} * {corr_shift}"
    if groups > 1 and column in ("globalPid", "globalTid"):
        return f"{column} + (i % {groups}) * {PID_STEP << PID_BITS}"
    if groups > 1 and column == "deviceId":
        return f"deviceId + (i % {groups}) * {devices}"
    return column


def _more_contexts(conn: sqlite3.Connection, groups: int, devices: int) -> None:
    """The contexts of every group's processes, on their GPUs (where ranks are found)."""
    columns = [r[1] for r in conn.execute(f"PRAGMA table_info({CONTEXTS})")]
    moved = {"processId": f"processId + g * {PID_STEP}", "deviceId": f"deviceId + g * {devices}"}
    conn.execute(
        f"WITH RECURSIVE grp(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM grp WHERE g < "
        f"{groups - 1}) INSERT INTO {CONTEXTS} ({', '.join(columns)}) "
        f"SELECT {', '.join(moved.get(c, c) for c in columns)} FROM grp CROSS JOIN "
        f"(SELECT * FROM {CONTEXTS})"
    )


def _time_span(conn: sqlite3.Connection, tables: set[str]) -> tuple[int, int]:
    bounds = [
        conn.execute(f'SELECT min(start), max(coalesce("end", start)) FROM "{t}"').fetchone()
        for t in REPLICATED
        if t in tables
    ]
    return min(b[0] for b in bounds if b[0] is not None), max(b[1] for b in bounds if b[1])


def _max_correlation(conn: sqlite3.Connection, tables: set[str]) -> int:
    found = [
        conn.execute(f'SELECT max(correlationId) FROM "{t}"').fetchone()[0]
        for t in REPLICATED
        if t in tables and t != "NVTX_EVENTS"
    ]
    return max(f for f in found if f is not None)


def timed(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None, stdout: Path | None = None
) -> dict[str, float]:
    """Run ``argv`` to completion; wall seconds, CPU seconds and peak RSS of that process.
    Its output goes to the file ``stdout`` if given, else nowhere."""
    with open(stdout, "wb") if stdout else contextlib.nullcontext(subprocess.DEVNULL) as out:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.PIPE, env=env)
        assert proc.stderr is not None
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    stderr = proc.stderr.read().decode(errors="replace")
    if status != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({status}):\n{stderr[-2000:]}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_gib": usage.ru_maxrss * 1024 / GIB,  # ru_maxrss is KiB on Linux
        "load_1min": os.getloadavg()[0],
    }


def show(what: str, run: dict[str, float]) -> None:
    print(
        f"{what}: {run['wall_s']:.2f} s wall, {run['cpu_s']:.2f} s CPU, peak RSS "
        f"{run['peak_rss_gib']:.2f} GiB (load average {run['load_1min']:.1f})"
    )


HITS = {
    "--phase backward": ["--phase", "backward"],
    "--range 'computing softmax'": ["--range", "computing softmax"],
    "--top 0": ["--top", "0"],
}
"""Repeated queries timed against the cache (``profkit diff BIG BIG`` too: two hits)."""


def measure(big: Path, runs: int) -> dict[str, object]:
    """The scan floor and ``profkit kernels`` uncached, back to back."""
    result: dict[str, object] = {}
    kernels = [sys.executable, "-m", "profkit", "kernels", str(big), "--format", "json"]
    floors, reads = [], []
    for _ in range(runs):  # alternated: both see the same load
        floors.append(timed([sys.executable, "-c", SCAN, str(big), *SCANNED], ROOT))
        reads.append(timed([*kernels, "--no-cache"], ROOT))
    result["scan_floor"] = best = min(floors, key=lambda r: r["wall_s"])
    result["profkit_kernels"] = top = min(reads, key=lambda r: r["wall_s"])
    result["scan_floor_runs"], result["profkit_kernels_runs"] = floors, reads
    result["ratio_to_floor"] = top["wall_s"] / best["wall_s"]
    result["cpu_ratio_to_floor"] = top["cpu_s"] / best["cpu_s"]
    show(f"bare SQL scan (the floor, best of {runs})", best)
    show(f"profkit kernels --no-cache (best of {runs})", top)
    print(f"  = {result['ratio_to_floor']:.2f}x the scan floor (CPU: "
          f"{result['cpu_ratio_to_floor']:.2f}x)")  # fmt: skip
    return result


def fixture_kernels(fixture: Path) -> int:
    """Kernels in one copy of ``fixture`` (a compressed export)."""
    with tempfile.TemporaryDirectory(prefix="kscale-count-") as tmp:
        plain = Path(tmp) / "one.sqlite"
        with lzma.open(fixture) as src, plain.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        with sqlite3.connect(plain) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {KERNEL_TABLE}").fetchone()[0])


def compare_ranks(copies: int, runs: int, scratch: Path) -> dict[str, object]:
    """The 2-rank export x``copies`` against the 1-rank one at about as many kernels, and
    against its own rank 0 alone at twice the copies (the same run's rows per kernel)."""
    one_copies = round(copies * fixture_kernels(RANKS_FIXTURE) / fixture_kernels(FIXTURE))
    exports = {
        "2 ranks": (RANKS_FIXTURE, copies, scratch / f"ranks2-x{copies}.sqlite", None),
        "1 rank": (FIXTURE, one_copies, scratch / f"ranks1-x{one_copies}.sqlite", None),
        RANK0: (RANKS_FIXTURE, 2 * copies, scratch / f"rank0-x{2 * copies}.sqlite", 0),
    }
    kernels: dict[str, int] = {}
    for label, (fixture, n, target, rank) in exports.items():
        rows = build(fixture, n, target, rank)
        kernels[label] = rows[KERNEL_TABLE]
        runtime = rows.get("CUPTI_ACTIVITY_KIND_RUNTIME", 0)
        print(f"{label}: {fixture.name} x{n}: {rows[KERNEL_TABLE]:,} kernels, "
              f"{runtime / rows[KERNEL_TABLE]:.2f} runtime API rows per kernel")  # fmt: skip
    timings: dict[str, list[dict[str, float]]] = {label: [] for label in exports}
    for _ in range(runs):  # alternate, so all see the same load
        for label, (_, _, target, _) in exports.items():
            argv = [sys.executable, "-m", "profkit", "kernels", str(target), "--format",
                    "json", "--no-cache"]  # fmt: skip
            timings[label].append(timed(argv, ROOT))
    result: dict[str, object] = {"kernels": kernels, "runs": timings}
    per_million = {}
    for label, runs_of in timings.items():
        best = min(runs_of, key=lambda r: r["wall_s"])
        scale = 1e6 / kernels[label]
        per_million[label] = {
            "wall_s_per_m_kernels": best["wall_s"] * scale,
            "cpu_s_per_m_kernels": min(r["cpu_s"] for r in runs_of) * scale,
            "peak_rss_gib": min(r["peak_rss_gib"] for r in runs_of),
        }
        show(f"{label} (best of {runs})", best)
        print(
            f"  = {per_million[label]['wall_s_per_m_kernels']:.2f} s wall, "
            f"{per_million[label]['cpu_s_per_m_kernels']:.2f} s CPU per million kernels"
        )
    two = per_million["2 ranks"]
    result["per_million_kernels"] = per_million
    for label, key in (("1 rank", ""), (RANK0, "_rank0")):
        one = per_million[label]
        result[f"ratio_wall{key}"] = two["wall_s_per_m_kernels"] / one["wall_s_per_m_kernels"]
        result[f"ratio_cpu{key}"] = two["cpu_s_per_m_kernels"] / one["cpu_s_per_m_kernels"]
        print(
            f"2 ranks / {label} per kernel: {result[f'ratio_wall{key}']:.2f}x wall, "
            f"{result[f'ratio_cpu{key}']:.2f}x CPU; peak RSS {two['peak_rss_gib']:.2f} vs "
            f"{one['peak_rss_gib']:.2f} GiB"
        )
    return result


def cached(kernels: list[str], big: Path, runs: int, read: dict[str, float]) -> dict[str, object]:
    """A first read that writes the cache, then each repeated query from it (best of runs),
    as a share of the uncached read ``read``."""
    folder = tempfile.mkdtemp(prefix="kscale-cache-")
    env = {**os.environ, "PROFKIT_CACHE_DIR": folder}
    result: dict[str, object] = {"first_read": timed(kernels, ROOT, env)}
    show("profkit kernels, first read (writes the cache)", result["first_read"])  # type: ignore[arg-type]
    diff = [sys.executable, "-m", "profkit", "diff", str(big), str(big), "--format", "json"]
    queries = {name: [*kernels, *extra] for name, extra in HITS.items()}
    queries["profkit diff BIG BIG"] = diff
    hits = {}
    for name, argv in queries.items():
        hit = min((timed(argv, ROOT, env) for _ in range(runs)), key=lambda r: r["wall_s"])
        hit["share_of_read"] = hit["wall_s"] / read["wall_s"]
        hit["cpu_share_of_read"] = hit["cpu_s"] / read["cpu_s"]
        hits[name] = hit
        show(f"{name}, from the cache", hit)
        print(f"  = {hit['share_of_read']:.0%} of an uncached read "
              f"(CPU: {hit['cpu_share_of_read']:.0%})")  # fmt: skip
    result["hits"] = hits
    result["cache_mb"] = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()) / 1e6
    shutil.rmtree(folder, ignore_errors=True)
    return result


def breakdown(path: Path) -> dict[str, dict[str, float]]:
    """Stages of ``profkit kernels`` in this process: wall and CPU seconds (all threads)."""
    sys.path.insert(0, str(ROOT))
    stages: dict[str, dict[str, float]] = {}
    clock = (time.perf_counter(), time.process_time())

    def lap(stage: str) -> None:
        nonlocal clock
        now = (time.perf_counter(), time.process_time())
        stages[stage] = {"wall_s": now[0] - clock[0], "cpu_s": now[1] - clock[1]}
        clock = now

    from profkit.analysis.engine import analyze_columns
    from profkit.formats import dumps
    from profkit.traces.load import load_columns

    lap("import")
    columns = load_columns(path, cache=False)
    lap("read")
    report = analyze_columns(columns)
    lap("analyze")
    dumps(report.to_json())
    lap("json")
    return stages


def find_nsys(explicit: str | None) -> str | None:
    return explicit or os.environ.get("PROFKIT_NSYS") or shutil.which("nsys")


def nsys_stats(nsys: str, big: Path, scratch: Path, profkit_wall_s: float) -> dict[str, object]:
    """``nsys stats`` with the two reports profkit kernels replaces, on the same file."""
    timings = {}
    for report in ("cuda_gpu_kern_sum", "nvtx_gpu_proj_sum"):
        out_prefix = scratch / f"stats-{report}"
        for old in scratch.glob(f"{out_prefix.name}*"):
            old.unlink()  # nsys stats will not overwrite its own output
        argv = [nsys, "stats", "--report", report, "--format", "csv", "--output",
                str(out_prefix), str(big)]  # fmt: skip
        timings[report] = timed(argv, scratch)
        print(f"nsys stats {report}: {timings[report]['wall_s']:.2f} s wall")
    total = sum(t["wall_s"] for t in timings.values())
    print(f"nsys stats, both reports: {total:.2f} s; profkit kernels is "
          f"{total / profkit_wall_s:.1f}x faster")  # fmt: skip
    return {"reports": timings, "both_wall_s": total, "speedup": total / profkit_wall_s}


def one_scale(
    args: argparse.Namespace,
    copies: int,
    runs: int,
    scratch: Path,
    result: dict[str, object],
    save: Callable[[], None],
) -> None:
    """Build the export of ``copies`` fixture copies and measure everything on it, into
    ``result``, calling ``save`` after each stage (what is done survives a timeout)."""
    big = scratch / f"replicated-x{copies}.sqlite"
    started = time.perf_counter()
    rows = build(args.fixture, copies, big)
    size_mb = big.stat().st_size / 1e6
    print(
        f"built {big.name}: {size_mb:,.0f} MB in {time.perf_counter() - started:.1f} s; rows: "
        + ", ".join(f"{t.removeprefix('CUPTI_ACTIVITY_KIND_')} {n:,}" for t, n in rows.items())
    )
    result.update(copies=copies, scale=copies / UNIT_COPIES, export_mb=round(size_mb), rows=rows,
                  load_before=os.getloadavg())  # fmt: skip
    result.update(measure(big, runs))
    save()
    best = result["profkit_kernels"]
    assert isinstance(best, dict)
    if args.breakdown:
        stages = breakdown(big)
        result["breakdown"] = stages
        print("in-process stages (wall/CPU s): "
              + ", ".join(f"{k} {v['wall_s']:.2f}/{v['cpu_s']:.2f}" for k, v in stages.items()))  # fmt: skip
    nsys = None if args.no_nsys_stats else find_nsys(args.nsys)
    if nsys:
        result["nsys_stats"] = nsys_stats(nsys, big, scratch, best["wall_s"])
        save()
    else:
        print("nsys not found: skipped the nsys stats comparison")
    if args.cache:  # last: on the GPU host, nsys stats is the comparison that matters most
        kernels = [sys.executable, "-m", "profkit", "kernels", str(big), "--format", "json"]
        result["cache"] = cached(kernels, big, runs, best)
    result["load_after"] = os.getloadavg()
    save()
    if not args.keep:
        big.unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--copies", type=int, default=745, help="copies of the fixture (745 ≈ 3 M activities)"
    )
    parser.add_argument("--scale", type=int, nargs="+", default=None,
                        help="the issue's xN (N*8 copies); several: one after the other")  # fmt: skip
    parser.add_argument("--runs", type=int, nargs="+", default=[3],
                        help="runs of each timing (best kept); one per --scale, or one for all")  # fmt: skip
    parser.add_argument("--cache", action="store_true", help="also time the columnar cache")
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--nsys", default=None, help="nsys executable for the comparison")
    parser.add_argument("--no-nsys-stats", action="store_true",
                        help="skip the nsys stats comparison (over 7 minutes at x1000)")  # fmt: skip
    parser.add_argument("--breakdown", action="store_true", help="also time the stages in-process")
    parser.add_argument("--keep", action="store_true", help="keep the big exports")
    parser.add_argument(
        "--ranks",
        type=int,
        default=None,
        metavar="N",
        help="compare the 2-rank export xN with the 1-rank one at as many kernels, per kernel",
    )
    args = parser.parse_args()
    copies = [n * UNIT_COPIES for n in args.scale] if args.scale else [args.copies]
    runs = args.runs * len(copies) if len(args.runs) == 1 else args.runs
    if len(runs) != len(copies):
        parser.error("give one --runs, or one per --scale")

    workdir = args.workdir or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="kscale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    scratch = workdir if args.keep else Path(tempfile.mkdtemp(prefix="kscale-db-"))
    if args.ranks:
        ranks = {
            "load_before": os.getloadavg(),
            **compare_ranks(args.ranks, args.runs[0], scratch),
        }
        ranks["load_after"] = os.getloadavg()
        (workdir / "kernels_ranks.json").write_text(json.dumps(ranks, indent=2))
        print(f"wrote {workdir / 'kernels_ranks.json'}")
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        return 0
    baseline = timed([sys.executable, "-c", "import profkit.cli"], ROOT)
    result: dict[str, object] = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()})",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "import_profkit": baseline,
        "scales": [],
    }
    show("import profkit.cli alone", baseline)
    summary = workdir / "kernels_scale.json"
    scales: list[dict[str, object]] = []
    result["scales"] = scales

    def save() -> None:
        summary.write_text(json.dumps(result, indent=2))

    try:
        for count, n in zip(copies, runs, strict=True):
            print(f"--- x{count / UNIT_COPIES:g} ({count} copies of the fixture)")
            scales.append({})
            one_scale(args, count, n, scratch, scales[-1], save)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
