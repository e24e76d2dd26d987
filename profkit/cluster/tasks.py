"""What a Dask worker does with one file of a job, and the job the client makes of them
(``--workers N``, ``--scheduler ADDRESS``: docs/MULTI_GPU.md, "A thousand ranks").

:func:`file_part` (the map, on a worker): the file read through the worker's own cache
(:func:`profkit.traces.load.load_columns`); where it may be one node of a job, its ranks
analysed alone (:func:`profkit.analysis.node_parts.node_ranks`; a per-rank trace's rank:
``rank_file_ranks``), and then no activity of it leaves the worker: the part is the ranks'
entries, the file's share of the job's tables and what joining it needs. Else the part is
its compact columns and its API calls (for the findings). :func:`load_on` (the client):
the parts, in the order given, and the :class:`~profkit.traces.job.Job` they make, as
:func:`profkit.traces.job.load` makes it in one process; so the client's memory grows with
the ranks, not with the kernels. The files are read where the workers are; paths are the
workers' (a shared filesystem, as on a cluster).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from profkit.analysis.node_parts import NodeRanks, Options, node_ranks, rank_file_ranks
from profkit.cluster.client import as_given, map_files
from profkit.cores import limited
from profkit.errors import BadInput
from profkit.traces.columns import SHAPE, ActivityColumns, Progress
from profkit.traces.host_calls import HostTrace, host_traces
from profkit.traces.job import NSYS_FORMAT, Job, load, together
from profkit.traces.load import load_columns, shape_reader

WORKER_ARRAYS = ("name", "duration", "launch_start", "launch_thread", "start", "device", SHAPE)
"""The per-activity arrays a worker sends for a file it could not analyse alone (the client
then reads the job as one process does)."""


@dataclass
class FilePart:
    """What a worker sends back for one file: its ranks analysed alone (a node of a job:
    then its columns hold no activity, only its names, threads, ranges and meta), or its
    columns and API calls (for the findings) where they could not be."""

    columns: ActivityColumns
    node: NodeRanks | None
    host: HostTrace | None


def file_part(
    path: str,
    nsys: str | None,
    cache: bool | None,
    several: bool,
    options: Options | None,
    findings: bool,
) -> FilePart:
    """The map, on a worker: ``path``'s part. ``several``: the job has several files read
    as one (each export then keeps its GPU starts, as a node's must); ``options``: the
    report asked for (None: columns only); ``findings``: read the API calls too."""
    with limited(1):  # the worker's parallelism is its tasks (profkit.cores)
        cols = load_columns(path, nsys, cache, None, timed=several)
        host = host_traces([Path(path)], [cols])[0] if findings else None  # through the cache
        node = None
        if several and options is not None:
            # an export: a node of a job; else a per-rank trace: one rank of a run
            analyse = node_ranks if cols.meta.get("format") == NSYS_FORMAT else rank_file_ranks
            node = analyse(cols, host, options)
        if node is not None:
            return FilePart(_without_activities(cols), node, None)
        return FilePart(_portable(cols), None, host)


def _without_activities(cols: ActivityColumns) -> ActivityColumns:
    """The columns' names, threads, ranges and meta, without any activity: what the
    client's join of analysed files reads."""
    return ActivityColumns(
        arrays={}, names=list(cols.names), kinds=list(cols.kinds), shapes=[],
        threads=np.asarray(cols.threads), ranges=cols.ranges, meta=dict(cols.meta),
        known_launch_bounds=cols.launch_bounds() or (),
    )  # fmt: skip


def _portable(cols: ActivityColumns) -> ActivityColumns:
    """The columns as plain arrays the client can unpickle: no cache files, no readers
    of the worker's files (the client makes its own reader of shapes)."""
    present = [n for n in WORKER_ARRAYS if n in cols.arrays]
    cols.load(present)
    arrays = {n: np.asarray(cols.arrays[n]) for n in present}
    return ActivityColumns(
        arrays=arrays, names=list(cols.names), kinds=list(cols.kinds), shapes=list(cols.shapes),
        threads=np.asarray(cols.threads), ranges=cols.ranges, meta=dict(cols.meta),
        kernel_rows=cols.kernel_rows, known_launch_bounds=cols.known_launch_bounds,
    )  # fmt: skip


def _for_workers(nsys: str | os.PathLike[str] | None) -> str | None:
    """``--nsys`` as a worker can run it: a file here, named relative to this directory,
    by its absolute path (a worker runs in its own); a command name as given (each
    worker finds it on its own PATH)."""
    if nsys is None:
        return None
    path = Path(nsys)
    return str(Path.cwd() / path) if path.is_file() and not path.is_absolute() else str(nsys)


def load_on(
    client: Any,
    paths: list[Path],
    nsys: str | os.PathLike[str] | None = None,
    cache: bool | None = None,
    progress: Progress | None = None,
    *,
    side_by_side: bool = False,
    options: Options | None = None,
    findings: bool = False,
) -> tuple[Job, list[FilePart]]:
    """The client: each file's part from the workers (``progress`` in files), and the job
    they make. ``options``: the kernel report that will be asked of the job (its files
    analysed where they lie); ``findings``: the report will want findings.

    Where every file was analysed and they are the nodes or ranks of one job, the job's
    files hold no activity (:attr:`Job.reread` reads one again, for a picture); else,
    where some file's activities stayed on its worker, the job is read here, as one
    process reads it (a set to compare, a rank an option cannot be asked of)."""
    several = len(paths) > 1 and not side_by_side

    def done(finished: int, total: int) -> None:
        if progress is not None:
            progress(finished, total, "files")

    parts = map_files(
        client, file_part, paths, done, nsys=_for_workers(nsys), cache=cache, several=several,
        options=options, findings=findings,
    )  # fmt: skip
    for given, part in zip(paths, parts, strict=True):
        cols = part.columns
        cols.meta["path"] = as_given(str(cols.meta.get("path")), Path(given))
        if part.host is not None:
            part.host.path = as_given(part.host.path, Path(given))
        if cols.kernel_rows is not None and SHAPE not in cols.arrays:
            cols.read_shapes = shape_reader(Path(str(cols.meta.get("path"))), cols.kernel_rows)
    nodes = [p.node for p in parts]
    if several and all(n is not None for n in nodes):
        facts = [n.facts.file for n in nodes if n is not None and n.facts.file is not None]
        assert len(facts) == len(nodes), "a worker's part tells its file's facts"
        job = together(list(paths), [p.columns for p in parts], side_by_side, facts)
        if job.kind in ("nodes", "ranks"):
            job.reread = _rereader(paths, nsys, cache)
            return job, parts
    if any(n is not None for n in nodes):  # their activities stayed on the workers
        for part in parts:
            part.node = None
        return load(list(paths), nsys, cache, progress, side_by_side=side_by_side), parts
    return together(list(paths), [p.columns for p in parts], side_by_side), parts


def _rereader(
    paths: list[Path], nsys: str | os.PathLike[str] | None, cache: bool | None
) -> Callable[[int], ActivityColumns]:
    """What reads file *i*'s columns again here, as its worker read them (the last one
    kept: a picture asks a rank's steps one after the other)."""
    kept: dict[int, ActivityColumns] = {}

    def reread(i: int) -> ActivityColumns:
        if i not in kept:
            kept.clear()
            try:
                kept[i] = load_columns(paths[i], nsys, cache, None, timed=True)
            except BadInput as exc:
                raise BadInput(
                    f"a step's kernels stayed on the Dask workers, and this machine cannot "
                    f"read them from {paths[i]} ({exc}): draw the picture where the files "
                    "are, or read the job without --plot"
                ) from None
        return kept[i]

    return reread
