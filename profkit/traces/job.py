"""The traces of one command, loaded in one call: :func:`load` gives a :class:`Job`.

A command (``profkit kernels``, ``diff``, ``torch``, ``nsys``, ``report``) reads its files
here, once, and hands the job to the analysis, which never reads files. Loading has two
steps, the shape a job of many files spread over workers needs:

1. **per file**: each file's compact columns (:func:`~.load.load_columns`, through the
   columnar cache), read on its own: no file's read needs another's;
2. **the job**: how the files go together, from what their columns say (:func:`together`):

   - one file: one trace (its processes, where several ran GPU work, are the ranks of one
     run);
   - the per-rank traces of one run: each names a distinct rank (torch.profiler's
     ``distributedInfo``, or profkit's header), and :func:`~.ranks.rank_set` finds that
     they can be one run's (else one line: world sizes differ, ...);
   - several nodes' Nsight Systems exports of one job: :func:`why_not_one_job` finds
     nothing against it (each holds NCCL kernels, their captures overlap, no process is
     in two of them);
   - otherwise traces to compare side by side; where they are all multi-GPU exports,
     :attr:`Job.why_apart` says why they are not one job.

Several nsys exports are read with each activity's GPU start and device (``timed``): the
nodes' join needs them, a node of one GPU included, and so does telling whether their
captures overlap. Joining the files' columns into one job's is the analysis' part
(:mod:`profkit.analysis.joins`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from profkit.errors import BadInput
from profkit.traces.columns import DEVICE, START, ActivityColumns, Progress
from profkit.traces.load import is_nsys_export, load_columns_of
from profkit.traces.ranks import names_distinct_ranks, rank_info_of, rank_set
from profkit.traces.schema import NCCL_PREFIX, PROCESS_MASK, PROCESS_SHIFT

JobKind = Literal["trace", "ranks", "nodes", "side_by_side"]
NSYS_FORMAT = "nsys-sqlite"


@dataclass
class Job:
    """The loaded traces of one command and how they go together (see the module doc).

    ``files`` holds each file's columns in the order given (the per-file results a join
    starts from); ``kind`` says what they are: ``trace`` (one file), ``ranks`` (the
    per-rank traces of one run), ``nodes`` (several nodes' exports of one job) or
    ``side_by_side`` (traces to compare); ``why_apart``, for traces compared that are all
    multi-GPU nsys exports, why they are not one job.
    """

    paths: list[Path]
    files: list[ActivityColumns]
    kind: JobKind
    why_apart: str | None = None
    facts: list[NodeFacts] = field(default_factory=list)
    """Each export's :class:`NodeFacts`, where they were asked for (several exports)."""
    reread: Callable[[int], ActivityColumns] | None = None
    """Where ``files`` hold no activity (each file analysed where it lies, on a Dask
    worker: their names, threads, ranges and meta came back), what reads file *i*'s
    columns again, here (a picture of a step's kernels wants some)."""

    def parts(self) -> list[Job]:
        """Each file as a job of its own (a side-by-side set, one trace at a time)."""
        return [Job([p], [f], "trace") for p, f in zip(self.paths, self.files, strict=True)]


def load(
    paths: list[Path] | list[str | os.PathLike[str]],
    nsys: str | os.PathLike[str] | None = None,
    cache: bool | None = None,
    progress: Progress | None = None,
    *,
    side_by_side: bool = False,
) -> Job:
    """Read every file at ``paths`` and say how they go together (see the module doc).

    ``nsys`` exports a ``.nsys-rep`` (:func:`~.load.load_columns`); ``cache`` overrides
    ``$PROFKIT_CACHE``; ``progress`` hears of the whole read, in bytes of the files on disk;
    ``side_by_side``: the files are compared whatever they are (``--compare``, ``diff``),
    each read as it is read alone. Raises :class:`~profkit.errors.BadInput` for a file that
    cannot be read (before any is, where a path is not a readable file) and for per-rank
    traces that cannot be one run's.
    """
    given = [Path(p) for p in paths]
    if not given:
        raise BadInput("no trace given")
    exports = [is_nsys_export(p) for p in given]  # checks every path before any read
    timed = len(given) > 1 and not side_by_side and all(exports)
    files = load_columns_of(given, nsys, cache, progress, timed=timed)
    return together(given, files, side_by_side)


@dataclass(frozen=True)
class FileFacts:
    """What telling a set of files' job needs of each one's activities (:func:`file_facts`;
    the rest is in its meta): a client that holds none (a read on Dask workers) tells the
    job from these."""

    node: NodeFacts | None
    """An export's (read with its GPU starts), else None."""
    rank: dict[str, Any] | None
    """Its :func:`~.ranks.rank_info_of` (None: it names no rank)."""
    window: tuple[int, int] | None
    """The first and last time it holds (:func:`_capture_window`)."""


def file_facts(cols: ActivityColumns) -> FileFacts:
    """A file's :class:`FileFacts`, from its columns."""
    export = cols.meta.get("format") == NSYS_FORMAT and START in cols.arrays
    return FileFacts(
        node_facts(cols) if export else None, rank_infos([cols])[0], _capture_window(cols)
    )


def together(
    paths: list[Path],
    files: list[ActivityColumns],
    side_by_side: bool = False,
    facts: list[FileFacts] | None = None,
) -> Job:
    """The job these files' columns make (the reduce after each file's read); ``facts``:
    theirs (:func:`file_facts`), where the columns hold no activity."""
    if len(files) == 1:
        return Job(paths, files, "trace")
    if side_by_side:
        return Job(paths, files, "side_by_side")
    exports = [c.meta.get("format") == NSYS_FORMAT for c in files]
    if all(exports):
        if facts is None:
            nodes = [node_facts(c) for c in files]
        elif all(f.node is not None for f in facts):
            nodes = [f.node for f in facts if f.node is not None]
        else:
            raise ValueError("an export's node facts need its columns' GPU starts")
        why = why_not_one_job(nodes)
        if why is None:
            return Job(paths, files, "nodes", facts=nodes)
        multi_gpu = all(f.nccl for f in nodes)  # a set of one-GPU runs needs no reason
        return Job(paths, files, "side_by_side", why if multi_gpu else None, nodes)
    if not any(exports):
        infos = rank_infos(files) if facts is None else [f.rank for f in facts]
        if names_distinct_ranks(infos):
            rank_set([c.meta for c in files], infos)  # one run's? else one line, now
            windows = (
                [_capture_window(c) for c in files] if facts is None else [f.window for f in facts]
            )
            _check_captured_together(windows, infos)
            return Job(paths, files, "ranks")
    return Job(paths, files, "side_by_side")


RUN_SLACK_NS = 60_000_000_000
"""How far apart per-rank captures of one run may lie and still be one run's: their ranks
profile the same steps together, on hosts whose clocks NTP keeps within ms; a minute covers
a slow start."""


def _check_captured_together(captured: list[tuple[int, int] | None], infos: list[Any]) -> None:
    """Per-rank traces of one run were captured at the same time (``captured``: each one's
    window): one line where a rank's capture ends before another's begins (two runs'
    traces, a day apart)."""
    windows = [(w, info["rank"]) for w, info in zip(captured, infos, strict=True)
               if w is not None]  # fmt: skip
    if len(windows) < 2:
        return
    (late, late_rank) = max(windows, key=lambda item: item[0][0])
    (early, early_rank) = min(windows, key=lambda item: item[0][1])
    gap = late[0] - early[1]
    if gap > RUN_SLACK_NS:
        raise BadInput(
            f"rank {late_rank}'s capture begins {gap / 3.6e12:,.1f} h after rank {early_rank}'s "
            "ends: these traces come from different runs; give the ranks of one run"
        )


def _capture_window(cols: ActivityColumns) -> tuple[int, int] | None:
    """The first and last time a trace holds (GPU activities where it keeps their starts,
    else launches, else ranges), or None for an empty one."""
    if len(cols) and START in cols.arrays:
        return _window(cols)
    bounds = cols.launch_bounds()
    if bounds is not None:
        return bounds
    if len(cols.ranges):
        return int(cols.ranges["start"].min()), int(cols.ranges["end"].max())
    return None


def rank_infos(files: list[ActivityColumns]) -> list[dict[str, Any] | None]:
    """:func:`~.ranks.rank_info` of each trace's columns (None: it names no rank); its
    device is its activities' most frequent one, as for the tables."""
    infos = []
    for cols in files:
        devices = cols.arrays[DEVICE] if DEVICE in cols.arrays else np.zeros(0, np.int16)
        infos.append(rank_info_of(cols.meta, devices))
    return infos


@dataclass(frozen=True)
class NodeFacts:
    """What of one export tells whether a set of them is the nodes of one job (from its
    compact columns, :func:`node_facts`)."""

    path: str
    nsys: bool
    host: str | None
    session_start_utc_ns: int | None
    gpu_pids: list[int]
    """Processes with a traced launch of GPU work, in pid order."""
    nccl: bool
    window: tuple[int, int]
    """The first activity's start and the last one's end (ns from the session start)."""


def node_facts(cols: ActivityColumns) -> NodeFacts:
    """:class:`NodeFacts` of one export's columns, read with their GPU starts (``timed``)."""
    if START not in cols.arrays:
        raise ValueError("an export's node facts need its columns' GPU starts (a timed read)")
    meta = cols.meta
    cols.load(["name", "duration", "launch_thread", START])
    start = meta.get("session_start_utc_ns")
    launching = cols.launch_threads(np.unique(cols.arrays["launch_thread"]))
    return NodeFacts(
        str(meta.get("path")), meta.get("format") == NSYS_FORMAT, meta.get("host"),
        None if start is None else int(start), sorted(process_ids(launching).tolist()),
        bool(nccl_name_codes(cols).any()), _window(cols),
    )  # fmt: skip


def nccl_name_codes(cols: ActivityColumns) -> np.ndarray:
    """Per name code of the columns: whether it is an NCCL kernel's (:data:`NCCL_PREFIX`)."""
    pairs = zip(cols.names, cols.kinds, strict=True)
    return np.array([k == "kernel" and bool(NCCL_PREFIX.match(n)) for n, k in pairs], dtype=bool)


def process_ids(threads: np.ndarray) -> np.ndarray:
    """The distinct processes of global thread ids (-1, no thread, left out)."""
    return np.unique((threads[threads >= 0] >> PROCESS_SHIFT) & PROCESS_MASK)


def _window(cols: ActivityColumns) -> tuple[int, int]:
    if not len(cols):
        return 0, 0
    start = cols.arrays[START]
    return int(start.min()), int((start + cols.arrays["duration"]).max())


def why_not_one_job(facts: list[NodeFacts]) -> str | None:
    """Why the exports with these :class:`NodeFacts` are not the nodes of one job (None:
    they are); for traces of other formats, that they are not all nsys exports."""
    labels = path_labels([f.path for f in facts])
    if not all(f.nsys for f in facts):
        return "not all of them are Nsight Systems exports"
    files: dict[Path, str] = {}
    for fact, label in zip(facts, labels, strict=True):
        path = Path(fact.path).resolve()
        if path in files:
            return f"{files[path]} is given twice"
        files[path] = label
    windows = []
    seen: dict[tuple[Any, int], str] = {}
    for fact, label in zip(facts, labels, strict=True):
        start = fact.session_start_utc_ns
        if start is None:
            return f"{label} records no session start (TARGET_INFO_SESSION_START_TIME)"
        if not fact.gpu_pids:
            return f"{label} has no GPU activity with a traced launch call"
        if not fact.nccl:
            return f"{label} has no NCCL kernels"
        windows.append((start + fact.window[0], start + fact.window[1]))
        for pid in fact.gpu_pids:
            who = (fact.host, pid)
            if who in seen:
                return f"{seen[who]} and {label} hold the same process ({who[0]}, pid {pid})"
            seen[who] = label
    if max(w[0] for w in windows) >= min(w[1] for w in windows):
        return "their captures do not overlap in time"
    return None


def path_labels(given: list[str]) -> list[str]:
    """Each file's name, or where two files share a name (``d0/report.sqlite``,
    ``d1/report.sqlite``) its path below their common folder."""
    paths = [Path(p) for p in given]
    names = [p.name for p in paths]
    if len(set(names)) == len(names):
        return names
    try:
        common = Path(os.path.commonpath([p.resolve() for p in paths]))
    except ValueError:  # paths on different drives
        return [str(p) for p in paths]
    below = [str(p.resolve().relative_to(common)) for p in paths]
    # One file given twice (or under two names) has no path below the common folder.
    return below if len(set(below)) == len(below) else [str(p) for p in paths]
