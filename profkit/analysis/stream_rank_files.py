"""Per-rank traces of one run (torch.profiler's, one file a rank) joined as compact columns.

:func:`profkit.traces.ranks.merge_rank_traces` joins the ranks' full tables (twelve columns
an activity, text included); :func:`merge_rank_columns` joins their
:class:`ActivityColumns` (each rank's read once and kept in the columnar cache, with its
activities' GPU starts and devices: :data:`profkit.traces.columns.TIMED`), so the ranked
report comes from the analysis of columns (:func:`.engine.analyze_columns`). The
join is the full tables':

- what makes the traces one run, their order, each rank's process key in the merged thread
  ids and the merged meta are :func:`profkit.traces.ranks.rank_set`'s, for both;
- where the traces name several hosts, each further host's clock is put on the first's by
  :func:`.nodes.host_clocks`, as :func:`.nodes.merge_ranks_of_hosts` does for the tables;
- the columns themselves are joined as several nodes' are
  (:func:`.stream_nodes.joined_columns`), GPUs kept as the traces number them.

Which activity is which rank's needs no rule here: a per-rank trace names its rank, and
every activity in it is that rank's, launched or not. The :class:`~.rank_layout.Layout` is
the files', where :func:`.rank_layout.ranks_of` (for an export that names no ranks)
infers ranks from devices and launch counts.

:func:`analyze_rank_file_columns` gives the report, ranks without GPU activity included (a
CPU run's traces: their phases' CPU time, no kernels). What the columns cannot hold is
refused with one line: a trace whose device ordinals do not fit their 16 bits (it keeps
no start times), more launching threads than their 16-bit codes hold.
"""

from __future__ import annotations

import functools

import numpy as np

from profkit.analysis.attribution import PhaseMode
from profkit.analysis.engine import analyze_columns
from profkit.analysis.nodes import clock_notes, host_clocks
from profkit.analysis.rank_layout import Layout
from profkit.analysis.report_types import RankedReport
from profkit.analysis.stream_nodes import ARRAYS, joined_columns, nccl_ends, shapes_of
from profkit.errors import BadInput
from profkit.traces.columns import DEVICE_LIMIT, START, ActivityColumns, check_threads
from profkit.traces.job import path_labels, rank_infos
from profkit.traces.ranks import process_key, rank_set, rank_thread_ids


def merge_rank_columns(
    columns: list[ActivityColumns], consume: bool = False
) -> tuple[ActivityColumns, Layout]:
    """The per-rank traces' columns as one multi-process set, and its ranks (each info's
    ``pid`` the rank's process key in the merged thread ids; ``meta["ranks"]`` has the real
    ones).

    Raises :class:`~profkit.errors.BadInput` where they cannot be the ranks of one run, with
    :func:`~profkit.traces.ranks.merge_rank_traces`'s words, or where the columns cannot
    hold them (see the module doc). ``consume``: each trace's arrays are given up as they
    are copied into the merged ones.
    """
    infos = rank_infos(columns)
    ranked = rank_set([c.meta for c in columns], infos)
    for cols in columns:
        if START not in cols.arrays:
            raise BadInput(
                f"{cols.meta.get('path')}: device ordinals beyond {DEVICE_LIMIT:,}: its GPU "
                "activity cannot be joined to the other ranks'"
            )
    check_threads(sum(len(c.threads) for c in columns))
    for cols in columns:
        cols.load(list(ARRAYS))
    labels = path_labels([str(c.meta.get("path")) for c in columns])
    known = [info or {} for info in infos]
    hosts = host_clocks(known, labels, lambda i: nccl_ends(columns[i]))
    ordered = [columns[i] for i in ranked.order]
    shifts = [hosts.shifts[i] if hosts else 0 for i in ranked.order]
    counts = [len(c) for c in ordered]
    range_counts = [len(c.ranges) for c in ordered]
    rekeys = [
        functools.partial(rank_thread_ids, process=process_key(info)) for info in ranked.ranks
    ]
    read_shapes = shapes_of(ordered)
    merged = joined_columns(ordered, rekeys, _kept_known(ordered, shifts), 0, consume)
    meta = ranked.meta
    if hosts is not None:
        meta["nodes"] = hosts.nodes
        meta["warnings"] = list(meta["warnings"]) + clock_notes(hosts.nodes)
    merged.meta, merged.read_shapes = meta, read_shapes
    layout = Layout(
        info=[{**info, "pid": process_key(info)} for info in ranked.ranks],
        rank=np.repeat(np.arange(len(ordered), dtype=np.int16), counts),
        range_rank=np.repeat(np.arange(len(ordered), dtype=np.int64), range_counts),
    )
    return merged, layout


def analyze_rank_file_columns(
    columns: list[ActivityColumns],
    top: int = 20,
    phase: str | None = None,
    range_: str | None = None,
    rank: int | None = None,
    consume: bool = False,
    phases: PhaseMode = "auto",
) -> RankedReport:
    """The ranked report of per-rank traces of one run from their columns: what
    :func:`.ranks.analyze_ranks` gives of :func:`.nodes.merge_ranks_of_hosts`' trace.
    ``consume``: as for :func:`merge_rank_columns`; ``phases``: where phases come from
    (auto, annotated, inferred)."""
    cols, layout = merge_rank_columns(columns, consume)
    report = analyze_columns(cols, top, phase, range_, phases=phases, layout=layout, rank=rank)
    assert isinstance(report, RankedReport)  # a layout gives one
    real = {int(info["rank"]): info for info in cols.meta["ranks"]}
    for entry in report.ranks:  # the layout's pid was the merged key
        entry.info = dict(real[int(entry.info["rank"])])
    report.nodes = list(cols.meta.get("nodes") or [])
    return report


def _kept_known(columns: list[ActivityColumns], shifts: list[int]) -> list[int]:
    """The shifts, all raised by one amount where one would move a known launch below 0
    (an unknown launch reads as a negative time): Chrome traces count from the epoch, so
    only a trace near its clock's 0 (a hand-made one) is raised."""
    lows = [
        bounds[0] + shift
        for cols, shift in zip(columns, shifts, strict=True)
        if (bounds := cols.launch_bounds()) is not None
    ]
    lift = max(0, -min(lows, default=0))
    return [shift + lift for shift in shifts]
