"""Nsight Systems test data: the committed real exports, and tiny synthetic ones.

Real exports (tests/data/nsys-fixtures.md says how each was captured) are committed
xz-compressed and unpacked once per session into a temporary directory, with their
``.profkit.json`` sidecar beside them. Synthetic exports hold only the tables and columns
the reader uses; they cover edge cases no real capture here shows (several processes,
2022-era column sets, unmatched correlation ids).
"""

from __future__ import annotations

import lzma
import shutil
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

DATA = Path(__file__).parent / "data"
STATS = DATA / "nsys-stats"
PROBE = DATA / "nsys-2025.3-probe.sqlite"
OLD_NO_KERNELS = "nsys-2022.4-no-kernels"
SMALL_FP32 = "nsys-2025.3-h100-small-fp32"
SMALL_BF16 = "nsys-2025.3-h100-small-bf16"
TINY_COMPILE = "nsys-2025.3-h100-tiny-compile"
GRAPH_NODES = "nsys-2025.3-h100-cudagraph-node"
GRAPH_WHOLE = "nsys-2025.3-h100-cudagraph-whole"

# globalTid = pid << 24 | tid (plus high bits nsys sets); two threads of process 100.
PID = 100
MAIN = (1 << 48) | (PID << 24) | 100
WORKER = (1 << 48) | (PID << 24) | 101
PUSH_POP, START_END, DOMAIN_CREATE = 59, 60, 75


def unpack(name: str, into: Path) -> Path:
    """``tests/data/NAME.sqlite.xz`` unpacked into ``into`` (with its sidecar, if any)."""
    target = into / f"{name}.sqlite"
    if not target.exists():
        with lzma.open(DATA / f"{name}.sqlite.xz") as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        sidecar = DATA / f"{name}.profkit.json"
        if sidecar.exists():
            shutil.copy(sidecar, into / sidecar.name)
    return target


KIND_TABLES = {
    "kernels": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memset": "CUPTI_ACTIVITY_KIND_MEMSET",
}
"""The export table behind each count profkit reports (``kernels`` = kernel launches)."""


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def sql_counts(path: Path) -> dict[str, tuple[int, int]]:
    """Per count of :data:`KIND_TABLES`: (rows, summed ns) in the export, by plain SQL:
    an answer independent of profkit's reader to check its totals against."""
    with sqlite3.connect(path) as db:
        tables = _tables(db)
        counts = {}
        for key, table in KIND_TABLES.items():
            if table not in tables:  # nsys writes no table for a kind that never happened
                counts[key] = (0, 0)
                continue
            row = db.execute(f"SELECT count(*), sum(end - start) FROM {table}").fetchone()
            counts[key] = (row[0], row[1] or 0)
    return counts


def sql_activity_totals(path: Path) -> tuple[int, int]:
    """(count, summed ns) of every kernel, copy and memset in an export, by plain SQL."""
    counts = sql_counts(path).values()
    return sum(c for c, _ in counts), sum(ns for _, ns in counts)


def sql_counts_in_ranges(path: Path, names: Sequence[str], kind: str = "kernels") -> dict[str, int]:
    """Per range name, the rows of ``kind``'s table launched while a range of that name was
    open on any thread (the launch: the runtime call with the same correlation id).

    For one process whose ranges live on the main thread this is profkit's attribution
    rule, written in SQL: autograd's launches fall inside the main thread's ``backward``.
    """
    marks = ", ".join("?" * len(names))
    query = f"""
        SELECT name, count(*) FROM (
            SELECT DISTINCT coalesce(n.text, s.value) AS name, k.rowid
            FROM {KIND_TABLES[kind]} AS k
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME AS r ON r.correlationId = k.correlationId
            JOIN NVTX_EVENTS AS n ON n.start <= r.start AND r.start < n.end
            LEFT JOIN StringIds AS s ON s.id = n.textId
            WHERE n.eventType = {PUSH_POP} AND coalesce(n.text, s.value) IN ({marks})
        ) GROUP BY name
    """
    with sqlite3.connect(path) as db:
        if KIND_TABLES[kind] not in _tables(db):
            return {}
        return dict(db.execute(query, list(names)).fetchall())


class Export:
    """A minimal nsys-like SQLite export built row by row (times in ns)."""

    def __init__(self, path: Path, *, pid_column: bool = True, short_names: bool = True,
                 text_ids: bool = True, meta_table: str = "META_DATA_EXPORT") -> None:  # fmt: skip
        self.path = path
        self.conn = sqlite3.connect(path)
        self.strings: dict[str, int] = {}
        self.correlation = 0
        self.text_ids = text_ids
        kernel_cols = ["start", "end", "deviceId", "streamId", "correlationId"]
        kernel_cols += ["globalPid"] if pid_column else []
        kernel_cols += ["demangledName"] + (["shortName"] if short_names else [])
        kernel_cols += ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"]
        self.kernel_cols = kernel_cols
        nvtx_cols = ["start", "end", "eventType", "globalTid", "domainId", "text"]
        nvtx_cols += ["textId"] if text_ids else []
        self.conn.executescript(
            f"""
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ({", ".join(kernel_cols)});
            CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME
                (start, end, eventClass, globalTid, correlationId, nameId, returnValue);
            CREATE TABLE NVTX_EVENTS ({", ".join(nvtx_cols)});
            CREATE TABLE {meta_table} (name TEXT NOT NULL, value TEXT);
            INSERT INTO {meta_table} VALUES ('EXPORT_PRODUCT_VERSION', '2099.1.0');
            """
        )

    def string(self, value: str) -> int:
        if value not in self.strings:
            self.strings[value] = len(self.strings) + 1
            self.conn.execute("INSERT INTO StringIds VALUES (?, ?)", (self.strings[value], value))
        return self.strings[value]

    def kernel(self, name: str, start: int, duration: int, launch_at: int | None,
               thread: int = MAIN, api: str = "cudaLaunchKernel_v7000",
               table: str = "CUPTI_ACTIVITY_KIND_RUNTIME", correlation: int | None = None,
               pid: int = PID, grid: Sequence[int] = (1, 1, 1),
               device: int = 0) -> int:  # fmt: skip
        """A kernel and (unless ``launch_at`` is None) the API call that launched it."""
        if correlation is None:
            self.correlation += 1
            correlation = self.correlation
        values = {
            "start": start, "end": start + duration, "deviceId": device, "streamId": 7,
            "correlationId": correlation, "globalPid": (1 << 48) | (pid << 24),
            "demangledName": self.string(name), "shortName": self.string(name.split("<")[0]),
            "gridX": grid[0], "gridY": grid[1], "gridZ": grid[2],
            "blockX": 128, "blockY": 1, "blockZ": 1,
        }  # fmt: skip
        cols = self.kernel_cols
        self.conn.execute(
            f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL ({', '.join(cols)}) "
            f"VALUES ({', '.join('?' * len(cols))})",
            [values[c] for c in cols],
        )
        if launch_at is not None:
            self.api(api, launch_at, thread, correlation, table)
        return correlation

    def api(self, name: str, start: int, thread: int, correlation: int,
            table: str = "CUPTI_ACTIVITY_KIND_RUNTIME") -> None:  # fmt: skip
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} "
            "(start, end, eventClass, globalTid, correlationId, nameId, returnValue)"
        )
        self.conn.execute(
            f"INSERT INTO {table} VALUES (?, ?, 0, ?, ?, ?, 0)",
            (start, start + 1_000, thread, correlation, self.string(name)),
        )

    def range(self, name: str, start: int, end: int | None, thread: int = MAIN,
              domain: int = 0, kind: int = PUSH_POP) -> None:  # fmt: skip
        text, text_id = (None, self.string(name)) if self.text_ids else (name, None)
        row = [start, end, kind, thread, domain, text] + ([text_id] if self.text_ids else [])
        self.conn.execute(f"INSERT INTO NVTX_EVENTS VALUES ({', '.join('?' * len(row))})", row)

    def domain(self, domain_id: int, name: str, thread: int = MAIN) -> None:
        row = [0, None, DOMAIN_CREATE, thread, domain_id, name]
        row += [None] if self.text_ids else []
        self.conn.execute(f"INSERT INTO NVTX_EVENTS VALUES ({', '.join('?' * len(row))})", row)

    def ranges(self, rows: Iterable[tuple[str, int, int]], thread: int = MAIN) -> None:
        for name, start, end in rows:
            self.range(name, start, end, thread)

    def save(self) -> Path:
        self.conn.commit()
        self.conn.close()
        return self.path


def sql_kernel_rows(path: Path) -> list[tuple[str, int, int, int, str, str]]:
    """Each kernel row of the export in row order, by plain SQL: (name, duration ns, its
    launch call's start ns or -1, that call's thread or -1, grid, block as ``"x,y,z"``).
    The activities' columns hold the kernels first, in this order."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        calls = [t for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")
                 if t in _tables(db)]  # fmt: skip
        launches = " UNION ALL ".join(
            f"SELECT correlationId, start, globalTid FROM {t}" for t in calls
        )
        return db.execute(
            'SELECT s.value, k."end" - k.start, ifnull(c.start, -1), ifnull(c.globalTid, -1),'
            " k.gridX || ',' || k.gridY || ',' || k.gridZ,"
            " k.blockX || ',' || k.blockY || ',' || k.blockZ"
            " FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
            f" LEFT JOIN ({launches}) c ON c.correlationId = k.correlationId ORDER BY k.rowid"
        ).fetchall()


def named_steps(path: Path, steps: int, ranks: int = 1) -> Path:
    """An export of ``steps`` steps, each a distinct outermost range ``load NNNN`` beside its
    ``forward`` and ``backward`` ranges (as per-step or per-batch names make): ``steps + 2``
    phases. Step i's kernels take 1 + i % 7 µs (load), 20 µs (forward) and 40 µs
    (backward), so the phases' GPU times differ and their order is known. ``ranks``: that
    many processes (pids 100, 101, ...), each on its own GPU, each with every step."""
    export = Export(path)
    for rank in range(ranks):
        pid = PID + rank
        thread = (1 << 48) | (pid << 24) | 100
        for i in range(steps):
            t = i * 100_000
            for name, offset, duration in (
                (f"load {i:04d}", 0, 1_000 * (1 + i % 7)),
                ("forward", 30_000, 20_000),
                ("backward", 60_000, 40_000),
            ):
                at = t + offset
                export.range(name, at, at + 20_000, thread)
                kernel = f"{name.split()[0]}_kernel"
                export.kernel(
                    kernel, at + 5_000, duration, at + 1_000, thread, pid=pid, device=rank
                )
    return export.save()
