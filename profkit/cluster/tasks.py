"""What a Dask worker does with one file of a job, and the job the client makes of them
(``--workers N``, ``--scheduler ADDRESS``: docs/MULTI_GPU.md, "A thousand ranks").

:func:`file_part` (the map, on a worker): the file's compact columns, read through the
worker's own cache (:func:`profkit.traces.load.load_columns`); where the file may be one
node of a job, its ranks analysed alone (:func:`profkit.analysis.node_parts.node_ranks`),
else its API calls for the findings. :func:`load_on` (the client): the parts, in the order
given, and the :class:`~profkit.traces.job.Job` their columns make, as
:func:`profkit.traces.job.load` makes it in one process. The files are read where the
workers are; paths are the workers' (a shared filesystem, as on a cluster).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from profkit.analysis.node_parts import NodeRanks, Options, node_ranks
from profkit.cluster.client import map_files
from profkit.cores import limited
from profkit.traces.columns import SHAPE, ActivityColumns, Progress
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
        if several and options is not None and cols.meta.get("format") == NSYS_FORMAT:
            node = node_ranks(cols, host, options)
        return FilePart(_portable(cols), node, None if node is not None else host)


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
        client, file_part, paths, done, nsys=None if nsys is None else str(nsys), cache=cache,
        several=several, options=options, findings=findings,
    )  # fmt: skip
    for part in parts:
        cols = part.columns
        if cols.kernel_rows is not None and SHAPE not in cols.arrays:
            cols.read_shapes = shape_reader(Path(str(cols.meta.get("path"))), cols.kernel_rows)
    job = together(list(paths), [p.columns for p in parts], side_by_side)
    return job, parts
