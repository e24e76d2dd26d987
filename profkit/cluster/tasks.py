"""What a Dask worker does with one file of a job, and the job the client makes of them
(``--workers N``, ``--scheduler ADDRESS``: docs/MULTI_GPU.md, "A thousand ranks").

:func:`file_part` (the map, on a worker): the file's compact columns, read through the
worker's own cache (:func:`profkit.traces.load.load_columns`); where the file may be one
node of a job, its ranks analysed alone (:func:`profkit.analysis.node_parts.node_ranks`;
a per-rank trace's rank: ``rank_file_ranks``), else its API calls for the findings.
:func:`load_on` (the client): the parts, in the order given, and the
:class:`~profkit.traces.job.Job` their columns make, as
:func:`profkit.traces.job.load` makes it in one process. The files are read where the
workers are; paths are the workers' (a shared filesystem, as on a cluster).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from profkit.analysis.node_parts import NodeRanks, Options, node_ranks, rank_file_ranks
from profkit.cluster.client import as_given, map_files
from profkit.cores import limited
from profkit.traces.columns import SHAPE, ActivityColumns, Progress, ShapeReader
from profkit.traces.host_calls import HostTrace, host_traces
from profkit.traces.job import NSYS_FORMAT, Job, together
from profkit.traces.load import load_columns, shape_reader

WORKER_ARRAYS = ("name", "duration", "launch_start", "launch_thread", "start", "device", SHAPE)
"""The per-activity arrays a worker sends: what the job's join and tables read."""


@dataclass
class FilePart:
    """What a worker sends back for one file: its columns, and its ranks analysed alone
    (a node of a job) or its API calls (for the findings)."""

    columns: ActivityColumns
    node: NodeRanks | None
    host: HostTrace | None
    shapes: dict[int, tuple[str, str]] = field(default_factory=dict)
    """The launch shapes the node's analysis read, by row: the rows the job's tables ask
    for are among them (each rank's longest kernel of a name and phase), so the client
    reads no file for them."""


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
        node, read = None, _Recorded(cols.read_shapes)
        if several and options is not None:
            # an export: a node of a job; else a per-rank trace: one rank of a run
            analyse = node_ranks if cols.meta.get("format") == NSYS_FORMAT else rank_file_ranks
            kept, cols.read_shapes = cols.read_shapes, read if cols.read_shapes else None
            try:
                node = analyse(cols, host, options)
            finally:
                cols.read_shapes = kept
        return FilePart(_portable(cols), node, None if node is not None else host, read.known)


class _Recorded:
    """A shape reader that keeps what it read."""

    def __init__(self, read: ShapeReader | None) -> None:
        self.read = read
        self.known: dict[int, tuple[str, str]] = {}

    def __call__(self, rows: np.ndarray) -> list[tuple[str, str]]:
        assert self.read is not None
        shapes = self.read(rows)
        self.known.update(zip(rows.tolist(), shapes, strict=True))
        return shapes


def _known_first(known: dict[int, tuple[str, str]], read: ShapeReader) -> ShapeReader:
    """A shape reader that reads the file only for rows not in ``known``."""

    def read_rows(rows: np.ndarray) -> list[tuple[str, str]]:
        missing = [r for r in rows.tolist() if r not in known]
        if missing:
            known.update(zip(missing, read(np.array(missing, dtype=np.int64)), strict=True))
        return [known[r] for r in rows.tolist()]

    return read_rows


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
    their columns make. ``options``: the kernel report that will be asked of the job
    (nodes analysed where they lie); ``findings``: the report will want findings."""
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
            read = shape_reader(Path(str(cols.meta.get("path"))), cols.kernel_rows)
            cols.read_shapes = _known_first(part.shapes, read)
    job = together(list(paths), [p.columns for p in parts], side_by_side)
    return job, parts
