"""One attribution of a multi-process trace, split by process: the ranks' own attributions.

Attribution works per process (docs/ATTRIBUTION.md): a launch takes its phase and ranges
from its own process's threads, phase owners and inferred steps are found per process, and
(thread, time) keys never mix two processes. So the :class:`~profkit.analysis.attribution.
Attribution` of one rank's rows is the whole trace's, restricted to them, with the phase
names renumbered as the rank alone would number them (its phase ranges' names in order,
then the inferred phases it has, then ``unattributed``). :func:`restrict` does that
without attributing anything again: a rank's tables are group-bys of the one attribution.

The one input that is not per process is the NVTX domain phases are looked for in, chosen
from all the ranges (``attribution.default_phase_domain``): a caller whose rank would
choose another domain attributes that rank's rows anew.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from profkit.analysis.attribution import (
    Attribution,
    inferred_spans,
    ordered_phase_names,
    phase_source,
)
from profkit.traces.schema import PROCESS_SHIFT
from profkit.workload.names import PHASES


def restrict(
    att: Attribution,
    rows: np.ndarray,
    range_rows: np.ndarray,
    range_names: np.ndarray,
    launch_start: np.ndarray,
    processes: np.ndarray,
) -> Attribution | None:
    """The attribution :func:`~profkit.analysis.attribution.attribute` gives activities
    ``rows`` and ranges ``range_rows`` alone (sorted row numbers of the whole tables),
    numbered from 0 as those rows; None if ``att`` cannot tell it (attribute them anew).

    ``range_names`` and ``launch_start`` (-1: no launch call) are the whole tables' columns;
    ``processes`` the process keys (``thread >> 24``) of the rows' threads.
    """
    inferred = att.inferred[rows]
    inferred_phase = att.inference.phase[rows]
    assert att.inference.instance is not None  # attribute() keeps every activity's instance
    phase_rows = att._phase_rows[np.isin(att._phase_rows, range_rows)]
    annotated = list(dict.fromkeys(range_names[phase_rows].tolist()))
    names, remap = ordered_phase_names(annotated, inferred_phase[inferred])
    # Whole codes -> this subset's: the phase ranges' names by name, unattributed last.
    local = {name: i for i, name in enumerate(annotated)}
    to_local = np.full(len(att.phase_names), -1, dtype=np.int64)
    for code, name in enumerate(att.phase_names[: att._annotated]):
        to_local[code] = local.get(name, -1)
    to_local[-1] = len(names) - 1
    kernel_phase = to_local[att.kernel_phase[rows]]
    kernel_phase[inferred] = remap[inferred_phase[inferred]]
    same_thread = to_local[att.same_thread_phase[rows]]
    if (kernel_phase < 0).any() or (same_thread < 0).any():
        return None  # a phase from outside these rows: not what they alone would give
    launch = launch_start[rows]
    points, point_rows = _points_of(att, rows)
    inferred_names = [names[r] if r >= 0 else p for r, p in zip(remap, PHASES, strict=False)]
    inference = dataclasses.replace(
        att.inference,
        phase=inferred_phase,
        instance=att.inference.instance[rows],
        main_threads=_of(att.inference.main_threads, processes),
    )
    return dataclasses.replace(
        att,
        phase_names=names,
        kernel_phase=kernel_phase,
        same_thread_phase=same_thread,
        cross_thread=att.cross_thread[rows],
        is_phase_range=att.is_phase_range[range_rows],
        owners=_of(att.owners, processes),
        inferred=inferred,
        phase_source=phase_source(inferred[launch >= 0], bool(annotated), att._mode),
        inference=inference,
        _inferred_spans=inferred_spans(
            inference.instance[inferred],  # type: ignore[index]
            inferred_phase[inferred],
            launch[inferred],
            inferred_names,
        ),
        _points=points,
        _point_rows=point_rows,
        _range_start=att._range_start[range_rows],
        _range_end=att._range_end[range_rows],
        _phase_rows=np.searchsorted(range_rows, phase_rows),
        _annotated=len(annotated),
    )


def _points_of(att: Attribution, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted (thread, time) points of ``rows``' activities, renumbered as those rows."""
    local = np.full(len(att.kernel_phase), -1, dtype=np.int64)
    local[rows] = np.arange(len(rows))
    point_rows = local[att._point_rows]
    kept = point_rows >= 0
    return att._points[kept], point_rows[kept]


def _of(by_process: dict[int, int], processes: np.ndarray) -> dict[int, int]:
    """The entries of a process -> thread map for ``processes`` only."""
    wanted = set(processes.tolist())
    return {p: t for p, t in by_process.items() if p in wanted}


def processes_of(threads: np.ndarray) -> np.ndarray:
    """The process keys of thread ids (-1: none)."""
    threads = threads[threads >= 0]
    return np.unique(threads >> PROCESS_SHIFT)
