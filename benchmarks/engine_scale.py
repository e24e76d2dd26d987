"""The "one engine" targets: ``profkit kernels`` on big unannotated and annotated exports.

Builds ×N of two committed exports with ``kernels_scale.build`` (each copy shifted in time
and correlation ids), into ``--work`` (kept there and reused by later runs; a temporary
folder, deleted at the end, if not given), the builds side by side on threads:

- *unannotated*: ``tests/data/nsys-2025.3-h200-unannotated-train`` (no phase ranges: phases
  inferred), ×1 = 61 copies (30,744 kernels, 63,257 runtime rows, 5 MB: about the
  annotated ×1), ×1000 = 61,000 copies (30.7 M kernels, ~5 GB); ``--unannotated-unit``;
- *annotated*: ``kernels_scale``'s fixture, ×1 = 8 copies (30,864 kernels), as there.

Then, per round (``--rounds``), per export, each in a fresh process, wall and CPU seconds
and peak RSS (``wait4``): (a) the bare SQL scan, one ``SELECT`` of ``total()``s over the
rows the reader needs (every kernel's correlation id, start, end and name; the runtime
table's launch-like calls' correlation id, start and thread: ``traces/nsys_columns.py``),
and for each checkout in turn (A B A B ...): (b) ``python -m profkit kernels EXPORT
--format json`` with an empty ``PROFKIT_CACHE_DIR``, (c) the same again (cache warm).
Each output's phases are checked against ×copies the fixture's own (its ×1 report,
computed once in this process), exactly, kernel counts and phase source.

A checkout (``--checkout DIR``, alias ``--pythonpath``; repeat for A/B) is a source tree
whose ``profkit/`` is imported (the command's working folder and ``PYTHONPATH``), run by
``--python`` (one for all, or one per checkout). Prints a table of medians (seconds,
GiB) and the ratios (b)/(a), (c)/(b) and B/A, and writes it all to ``--json`` (default
``WORK/engine_scale.json``, rewritten after every round). Exit status 1 if a phase check
failed. ``--rounds 0`` only builds (×1000: ~5 GB each, minutes), for a later run to reuse.
The A/B of docs/PERFORMANCE.md ran A = a checkout of commit 1f38560 (the code before the
one-engine work: unannotated exports then took the full tables' engine, since deleted)
against B = that work; any checkout whose ``profkit kernels`` takes ``--format json`` can
be A.

    python benchmarks/engine_scale.py --times 10 --rounds 1
    python benchmarks/engine_scale.py --times 100 1000 --rounds 3 --work /data/engine \\
        --checkout /src/before --checkout /src/after --json /data/engine/engine.json
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kernels_scale import FIXTURE, KERNEL_TABLE, ROOT, UNIT_COPIES, build, stamp, timed

UNANNOTATED = ROOT / "tests" / "data" / "nsys-2025.3-h200-unannotated-train.sqlite.xz"
# 61 copies of the unannotated fixture (504 kernels each) are about kernels_scale's ×1
# (8 copies of 3,858): 30,744 kernels against 30,864, 5.0 MB against 5.0 MB.
UNANNOTATED_UNIT = 61
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
LAUNCH_NAME_PATTERNS = ("%Launch%", "%Memcpy%", "%Memset%", "%Prefetch%")  # nsys_export's
SCAN = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute(sys.argv[2]).fetchall()
"""
WHICH = {"first": "(b) first, empty cache", "repeat": "(c) repeat, warm cache"}


def scan_sql(export: Path) -> str:
    """The bare scan of ``export``: one ``SELECT`` reading every kernel row's correlation
    id, start, end and name id, and the launch-like runtime calls' correlation id, start
    and thread (the rows and columns ``read_nsys_columns`` asks for), added up (``total``:
    sums of ×1000 start times overflow 64 bits) and thrown away."""
    with sqlite3.connect(export) as conn:
        kernel = {r[1] for r in conn.execute(f"PRAGMA table_info({KERNEL_TABLE})")}
        name = next(c for c in ("demangledName", "name", "mangledName") if c in kernel)
        where = " OR ".join("value LIKE ?" for _ in LAUNCH_NAME_PATTERNS)
        ids = [r[0] for r in conn.execute(f"SELECT id FROM StringIds WHERE {where}",
                                          LAUNCH_NAME_PATTERNS)]  # fmt: skip
    calls = f"WHERE nameId IN ({', '.join(map(str, ids))})" if ids else ""
    return (
        f'SELECT * FROM (SELECT total(correlationId), total(start), total("end"), '
        f"total({name}) FROM {KERNEL_TABLE}) CROSS JOIN (SELECT total(correlationId), "
        f"total(start), total(globalTid) FROM {RUNTIME_TABLE} {calls})"
    )


def fixture_phases(fixture: Path, work: Path) -> dict[str, Any]:
    """The ×1 fixture's phase source and kernels per phase, by this checkout's profkit in
    this process."""
    sys.path.insert(0, str(ROOT))
    from profkit.analysis import kernel_report
    from profkit.traces.job import load

    plain = work / fixture.name.removesuffix(".xz")
    if not plain.exists():
        with lzma.open(fixture) as src, plain.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return phases_of(kernel_report(load([plain], cache=False)).to_json())


def phases_of(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": report["source"].get("phase_source"),
        "kernels": {p["phase"]: p["kernels"] for p in report["phases"]},
    }


def checkout_info(label: str, folder: Path, python: str) -> dict[str, Any]:
    """Where ``python`` finds profkit when run in ``folder`` (refused if not there) and the
    folder's git commit."""
    code = "import profkit, sqlite3; print(profkit.__file__); print(sqlite3.sqlite_version)"
    found = subprocess.run([python, "-c", code], cwd=folder, env=child_env(folder),
                           capture_output=True, text=True)  # fmt: skip
    if found.returncode != 0:
        raise SystemExit(f"{label}: {python} cannot import profkit in {folder}:\n{found.stderr}")
    where, sqlite_version = found.stdout.split()
    if not Path(where).resolve().is_relative_to(folder.resolve()):
        raise SystemExit(f"{label}: {python} imports profkit from {where}, not from {folder}")
    git = ["git", "-C", str(folder)]
    rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "profkit"],
                           capture_output=True, text=True)  # fmt: skip
    return {
        "label": label,
        "folder": str(folder),
        "python": python,
        "profkit": where,
        "sqlite": sqlite_version,
        "commit": rev.stdout.strip() or None,
        "uncommitted_changes": bool(dirty.stdout.strip()) if rev.returncode == 0 else None,
    }


def child_env(folder: Path, cache: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PROFKIT_CACHE"}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), *filter(None, [env.get("PYTHONPATH")])])
    if cache is not None:
        env["PROFKIT_CACHE_DIR"] = str(cache)
    return env


def build_all(jobs: dict[str, tuple[Path, int, Path]]) -> dict[str, dict[str, Any]]:
    """Build (or reuse) every export at once, each on a thread (SQLite lets go of the GIL)."""

    def one(job: tuple[Path, int, Path]) -> dict[str, Any]:
        fixture, copies, target = job
        started = time.perf_counter()
        reused = target.exists() and target.with_suffix(".built.json").exists()
        rows = build(fixture, copies, target)
        return {
            "fixture": fixture.name,
            "copies": copies,
            "rows": rows,
            "export_gb": target.stat().st_size / 1e9,
            "build_s": None if reused else time.perf_counter() - started,
        }

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        done = dict(zip(jobs, pool.map(one, jobs.values()), strict=True))
    for name, info in done.items():
        how = "reused" if info["build_s"] is None else f"built in {info['build_s']:.1f} s"
        print(f"{name}: {info['fixture']} x{info['copies']:,} copies, "
              f"{info['rows'][KERNEL_TABLE]:,} kernels, {info['rows'].get(RUNTIME_TABLE, 0):,} "
              f"runtime rows, {info['export_gb'] * 1e3:,.0f} MB, {how}")  # fmt: skip
    return done


def one_round(
    export: Path,
    entry: dict[str, Any],
    checkouts: list[dict[str, Any]],
    work: Path,
    expected: dict[str, Any],
) -> None:
    """(a) once per interpreter, then (b) and (c) for each checkout in turn; appended to
    ``entry["runs"]``, each output's phases checked against ``expected``."""
    runs = entry["runs"]
    for python in dict.fromkeys(c["python"] for c in checkouts):
        scan = timed([python, "-c", SCAN, str(export), entry["scan_sql"]], work)
        runs["scan"].setdefault(python, []).append(scan)
    for checkout in checkouts:
        label, folder = checkout["label"], Path(checkout["folder"])
        cache = work / f"cache-{label}"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        argv = [checkout["python"], "-m", "profkit", "kernels", str(export), "--format", "json"]
        outputs = {}
        for which in WHICH:
            out = work / f"{export.stem}-{label}-{which}.json"
            run = timed(argv, folder, child_env(folder, cache), stdout=out)
            outputs[which] = json.loads(out.read_text())
            run["phases_exact"] = phases_of(outputs[which]) == expected
            runs[label][which].append(run)
        runs[label]["repeat_same_output"].append(outputs["repeat"] == outputs["first"])
        runs[label]["cache_mb"] = (
            sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 1e6
        )
        shutil.rmtree(cache, ignore_errors=True)


def summarize(entry: dict[str, Any], checkouts: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds, the ratios, and whether every output's phases were exact."""
    runs = entry["runs"]

    def median(items: list[dict[str, float]]) -> dict[str, float]:
        return {key: statistics.median(r[key] for r in items)
                for key in ("wall_s", "cpu_s", "peak_rss_gib")}  # fmt: skip

    summary: dict[str, Any] = {}
    for checkout in checkouts:
        label = checkout["label"]
        scan = median(runs["scan"][checkout["python"]])
        first, repeat = median(runs[label]["first"]), median(runs[label]["repeat"])
        summary[label] = {
            "scan": scan,
            "first": first,
            "repeat": repeat,
            "first_over_scan": first["wall_s"] / scan["wall_s"],
            "first_cpu_over_scan": first["cpu_s"] / scan["cpu_s"],
            "repeat_over_first": repeat["wall_s"] / first["wall_s"],
            "phases_exact": all(r["phases_exact"] for w in WHICH for r in runs[label][w]),
            "repeat_same_output": all(runs[label]["repeat_same_output"]),
        }
    base = summary[checkouts[0]["label"]]
    for checkout in checkouts[1:]:
        row = summary[checkout["label"]]
        row["vs_first_checkout"] = {
            f"{which}_{key}": row[which][key] / base[which][key]
            for which in WHICH
            for key in ("wall_s", "peak_rss_gib")
        }
    return summary


def show(scale: dict[str, Any], checkouts: list[dict[str, Any]]) -> None:
    print(f"\n×{scale['times']}: medians of {scale['rounds_done']} round(s); "
          "(a) bare scan, (b) first query, empty cache, (c) repeat, warm cache")  # fmt: skip
    head = (f"{'export':12s} {'code':4s} {'(a) s':>7s} {'(b) s':>8s} {'(b) GiB':>8s} "
            f"{'(c) s':>7s} {'(c) GiB':>8s} {'(b)/(a)':>8s} {'(c)/(b)':>8s}  phases")  # fmt: skip
    print(head)
    for name, entry in scale["exports"].items():
        for checkout in checkouts:
            label = checkout["label"]
            row = entry["summary"][label]
            phases = "exact" if row["phases_exact"] else "WRONG"
            print(
                f"{name:12s} {label:4s} {row['scan']['wall_s']:7.2f} {row['first']['wall_s']:8.2f} "
                f"{row['first']['peak_rss_gib']:8.2f} {row['repeat']['wall_s']:7.2f} "
                f"{row['repeat']['peak_rss_gib']:8.2f} {row['first_over_scan']:7.2f}x "
                f"{row['repeat_over_first']:7.0%}  {phases}"
            )
    for name, entry in scale["exports"].items():
        for checkout in checkouts[1:]:
            vs = entry["summary"][checkout["label"]]["vs_first_checkout"]
            print(f"{name}: {checkout['label']}/{checkouts[0]['label']}: (b) wall "
                  f"{vs['first_wall_s']:.2f}x, peak {vs['first_peak_rss_gib']:.2f}x; (c) wall "
                  f"{vs['repeat_wall_s']:.2f}x, peak {vs['repeat_peak_rss_gib']:.2f}x")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Builds ×N of the unannotated and annotated fixtures into --work (reused if "
        "there), then per round times (a) a bare SQL scan of the kernel and runtime rows, "
        "(b) profkit kernels --format json with an empty cache, (c) the same again, for "
        "each --checkout in turn (A B A B); checks the inferred phases are exactly ×copies "
        "the fixture's; prints medians and (b)/(a), (c)/(b), B/A; writes --json.",
    )
    parser.add_argument("--times", type=int, nargs="+", default=[10], metavar="N",
                        help="the scales ×N, one after the other (default 10)")  # fmt: skip
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of every timing (default 3; medians kept; 0: build only)",
    )
    parser.add_argument("--work", type=Path, default=None,
                        help="folder of the exports (kept, reused); default a temp dir")  # fmt: skip
    parser.add_argument("--checkout", "--pythonpath", dest="checkouts", type=Path,
                        action="append", metavar="DIR",
                        help="a source tree whose profkit is timed (repeat: A, B, ...); "
                        "default this one")  # fmt: skip
    parser.add_argument("--python", dest="pythons", action="append", metavar="PATH",
                        help="its interpreter (one for all, or one per --checkout); "
                        "default this one")  # fmt: skip
    parser.add_argument("--export", dest="exports", action="append",
                        choices=["unannotated", "annotated"],
                        help="only these exports (default both)")  # fmt: skip
    parser.add_argument("--unannotated-unit", type=int, default=UNANNOTATED_UNIT,
                        metavar="COPIES", help=f"copies of the unannotated fixture per ×1 "
                        f"(default {UNANNOTATED_UNIT})")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None,
                        help="where the figures go (default WORK/engine_scale.json)")  # fmt: skip
    args = parser.parse_args()
    folders = [f.resolve() for f in args.checkouts or [ROOT]]
    pythons = args.pythons or [sys.executable]
    if len(pythons) == 1:
        pythons *= len(folders)
    if len(pythons) != len(folders):
        parser.error("give one --python, or one per --checkout")
    labels = [chr(ord("A") + i) for i in range(len(folders))]
    checkouts = [checkout_info(*c) for c in zip(labels, folders, pythons, strict=True)]
    for c in checkouts:
        print(f"{c['label']}: {c['folder']} (commit {c['commit']}"
              f"{', with uncommitted changes' if c['uncommitted_changes'] else ''}), "
              f"{c['python']}, SQLite {c['sqlite']}")  # fmt: skip

    temporary = args.work is None
    work = Path(tempfile.mkdtemp(prefix="engine-")) if temporary else args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    target = args.json or work / "engine_scale.json"
    fixtures = {"unannotated": (UNANNOTATED, args.unannotated_unit),
                "annotated": (FIXTURE, UNIT_COPIES)}  # fmt: skip
    names = [n for n in fixtures if n in (args.exports or fixtures)]
    result: dict[str, Any] = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()})",
        "python": platform.python_version(),
        **stamp(os.getloadavg()),
        "checkouts": checkouts,
        "scales": [],
    }

    def save() -> None:
        result["load_after"] = os.getloadavg()
        target.write_text(json.dumps(result, indent=2))

    failed = False
    try:
        expected = {n: fixture_phases(fixtures[n][0], work) for n in names if args.rounds}
        jobs = {
            (times, n): (fix, times * unit, work / f"{n}-x{times}.sqlite")
            for times in args.times
            for n, (fix, unit) in fixtures.items()
            if n in names
        }
        built = build_all({f"{n} ×{t}": job for (t, n), job in jobs.items()})
        for times in args.times:
            scale: dict[str, Any] = {"times": times, "rounds_done": 0, "exports": {}}
            result["scales"].append(scale)
            for n in names:
                export = jobs[(times, n)][2]
                info = built[f"{n} ×{times}"]
                fixture = expected.get(n, {"source": None, "kernels": {}})
                scale["exports"][n] = {
                    **info,
                    "expected_phases": {
                        "source": fixture["source"],
                        "kernels": {p: k * info["copies"] for p, k in fixture["kernels"].items()},
                    },
                    "fixture_phases": fixture,
                    "scan_sql": scan_sql(export),
                    "runs": {"scan": {}, **{c["label"]: {"first": [], "repeat": [],
                             "repeat_same_output": []} for c in checkouts}},
                }  # fmt: skip
            for _ in range(args.rounds):
                for n in names:
                    entry = scale["exports"][n]
                    one_round(jobs[(times, n)][2], entry, checkouts, work,
                              entry["expected_phases"])  # fmt: skip
                    entry["summary"] = summarize(entry, checkouts)
                scale["rounds_done"] += 1
                save()
            if not scale["rounds_done"]:
                continue  # --rounds 0: built, nothing timed
            show(scale, checkouts)
            for n in names:
                for label, row in scale["exports"][n]["summary"].items():
                    if not row["phases_exact"]:
                        failed = True
                        want = scale["exports"][n]["expected_phases"]
                        print(f"{n} ×{times} {label}: phases not ×{jobs[(times, n)][1]} the "
                              f"fixture's {want}")  # fmt: skip
        save()
        print(f"wrote {target}")
    finally:
        if temporary:  # the exports and caches go; the JSON stays
            for path in work.iterdir():
                if path != target:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
