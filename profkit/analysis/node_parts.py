"""The nodes of a job analysed apart, then joined: the map and the reduce of a job read on
Dask workers (``--workers``, ``--scheduler``: :mod:`profkit.cluster.tasks`).

A rank's tables, its NCCL overlap, its steps and its host-side findings need only its own
node's activities, so each node's export is analysed alone where it lies
(:func:`node_ranks`, the map): what comes back is each rank's
:class:`~.report_types.RankEntry`, on its node's clock, and its host findings, which are
what the per-rank work of a job of many ranks costs. The client joins the nodes' compact
columns as :func:`.joins.merge_nodes` always does (their clocks, ranks and GPUs numbered
across nodes) and makes only the job's own tables from them (:func:`join_node_ranks`, the
reduce): the entries are renumbered and their steps put on the job's clock, then the job's
steps, stragglers and job-wide findings are found across them.

Per-rank torch traces (one Chrome trace a rank) go the same way: each trace's rank is
analysed alone (:func:`rank_file_ranks`) and the client joins the traces in rank order,
each moved onto the first host's clock (:func:`join_rank_parts`).

The result is the one :func:`.joins.analyze_node_columns` (or
:func:`.joins.analyze_rank_file_columns`) gives in one process: a rank's entry does not
depend on the other files (tests/test_cluster.py compares the JSON whole).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.comm import is_nccl
from profkit.analysis.engine import check_rank, rank_entries, ranked_report
from profkit.analysis.findings import HostPart, host_side
from profkit.analysis.job_scope import FileWhole, check_phase, job_scope
from profkit.analysis.joins import (
    JoinFacts,
    as_job_of_nodes,
    as_job_of_rank_files,
    join_facts,
    merge_node_columns,
    merge_nodes,
    merge_rank_columns,
    merge_ranks,
    real_ids,
)
from profkit.analysis.phase_marks import PhaseRanges
from profkit.analysis.phase_ranges import PhaseMode
from profkit.analysis.rank_comm import ColumnSteps, kernels_reader
from profkit.analysis.rank_layout import Layout, ranks_of
from profkit.analysis.report_tables import query_source, scope_report
from profkit.analysis.report_types import RankedReport, RankEntry
from profkit.analysis.sums import KERNEL, name_codes
from profkit.errors import BadInput
from profkit.traces.columns import ActivityColumns
from profkit.traces.host_calls import HostTrace

Reread = Callable[[int], ActivityColumns]
"""What reads file *i*'s columns again (the client of a read on Dask workers)."""


@dataclass
class NodeRanks:
    """One file's ranks analysed alone (a node's, or a per-rank trace's one): their
    entries (positions counted from 0, times on the file's clock, no reader of their
    steps' kernels) and host findings (a node's ranks numbered from 0; a per-rank trace's
    by its own rank)."""

    entries: list[RankEntry]
    host: HostPart | None
    whole: FileWhole
    """The file's share of its job's whole-trace tables (:mod:`.job_scope`)."""
    facts: JoinFacts
    """What joining it into its job needs of its activities: the client holds none."""


@dataclass(frozen=True)
class Options:
    """What a kernel report is asked for (the command's options), as the map needs them."""

    top: int = 20
    phase: str | None = None
    range: str | None = None
    phases: PhaseMode = "auto"
    phase_ranges: PhaseRanges | None = None
    rank_tables: bool = False
    """Each rank's whole report comes back (``--rank``: the job's tables are that rank's);
    else its phase table alone, its other tables being in its JSON text."""


def node_ranks(cols: ActivityColumns, host: HostTrace | None, options: Options) -> NodeRanks | None:
    """The map: one node's export (its columns read with GPU starts) analysed alone, or
    None where it cannot be a node of a job (the client's join says why, from every file).
    ``host``: its API calls, for the host-side findings (None: no findings asked)."""

    facts = join_facts(cols, with_file=True)

    def joined() -> tuple[ActivityColumns, Layout, Callable[[list[dict[str, Any]]], None]]:
        merged, layout, real = merge_node_columns([cols], facts=[facts])
        return merged, layout, lambda infos: real_ids(infos, real)

    return _analysed_alone(cols, host, options, joined, facts)


def rank_file_ranks(
    cols: ActivityColumns, host: HostTrace | None, options: Options
) -> NodeRanks | None:
    """The map of a per-rank trace (torch.profiler writes one a rank): its rank analysed
    alone, as :func:`node_ranks` analyses a node's, or None where it names no rank (the
    client's join says why, from every file). Its findings carry its own rank number,
    which is the job's."""

    def joined() -> tuple[ActivityColumns, Layout, Callable[[list[dict[str, Any]]], None]]:
        merged, layout = merge_rank_columns([cols])
        real = {int(info["rank"]): info for info in merged.meta["ranks"]}

        def real_ranks(infos: list[dict[str, Any]]) -> None:
            for info in infos:  # the layout's pid was its merged process key
                info.update(real[int(info["rank"])])

        return merged, layout, real_ranks

    return _analysed_alone(cols, host, options, joined, join_facts(cols, with_file=True))


def _analysed_alone(
    cols: ActivityColumns,
    host: HostTrace | None,
    options: Options,
    joined: Callable[[], tuple[ActivityColumns, Layout, Callable[[list[dict[str, Any]]], None]]],
    facts: JoinFacts,
) -> NodeRanks | None:
    """One file's ranks analysed alone: ``joined()`` gives its columns as a job of one file,
    their ranks and what tells the ranks' infos their real ids (None: a BadInput)."""
    try:
        merged, layout, real = joined()
        entries, phases, whole = rank_entries(
            merged, layout, options.top, options.phase, options.range, options.phases,
            options.phase_ranges,
        )  # fmt: skip
    except BadInput:
        return None
    every_rank = [dict(info) for info in layout.info]
    real([e.info for e in entries] + every_rank)
    found = (
        None
        if host is None
        else host_side(phases, every_rank, [cols], [host], options.phase_ranges)
    )
    for entry in entries:
        assert isinstance(entry.steps, ColumnSteps)
        entry.steps = entry.steps.moved(entry.steps.rank, 0)  # its reader reads this file
        entry.encode(options.rank_tables)  # its JSON made here, not on the client
    return NodeRanks(entries, found, whole, facts)


def join_node_ranks(
    nodes: list[ActivityColumns],
    parts: list[NodeRanks],
    options: Options,
    rank: int | None,
    reread: Reread,
) -> tuple[RankedReport, HostPart]:
    """The reduce: the job's report from its nodes' columns, which hold no activity (their
    names, threads, ranges and meta), and their :class:`NodeRanks` (in the same order),
    and the ranks' host findings renumbered as the job's ranks. ``reread``: what reads
    node *i*'s columns again (a step's kernels, for a picture)."""
    trace_keys = _trace_keys(nodes, options)
    _check_tables(parts, rank)
    facts = [p.facts for p in parts]
    cols, layout, real, shifts = merge_nodes(nodes, facts=facts, activities=False)
    files = list(range(len(nodes)))
    report, found = _joined(
        cols, layout, parts, shifts, trace_keys, options, rank, True, files, reread
    )
    as_job_of_nodes(report, real, cols.meta["nodes"])
    return report, found


def join_rank_parts(
    files: list[ActivityColumns],
    parts: list[NodeRanks],
    options: Options,
    rank: int | None,
    reread: Reread,
) -> tuple[RankedReport, HostPart]:
    """The reduce of per-rank traces: :func:`join_node_ranks` for the parts of
    :func:`rank_file_ranks` (in the order of ``files``), joined in rank order."""
    trace_keys = _trace_keys(files, options)
    _check_tables(parts, rank)
    facts = [p.facts for p in parts]
    cols, layout, order, shifts = merge_ranks(files, facts=facts, activities=False)
    ordered = [parts[i] for i in order]
    keys = [trace_keys[i] for i in order]
    report, found = _joined(
        cols, layout, ordered, shifts, keys, options, rank, False, order, reread
    )
    as_job_of_rank_files(report, cols.meta)
    return report, found


def _trace_keys(files: list[ActivityColumns], options: Options) -> list[set[str]]:
    """What each file's own source says of it (the job's replaces it in its ranks')."""
    return [set(query_source(f.meta, options.phase, options.range, options.top)) for f in files]


def _check_tables(parts: list[NodeRanks], rank: int | None) -> None:
    if rank is not None and not all(e.tables_kept for p in parts for e in p.entries):
        raise ValueError("--rank needs each rank's tables: Options(rank_tables=True)")


def _joined(
    cols: ActivityColumns,
    layout: Layout,
    parts: list[NodeRanks],
    shifts: list[int],
    trace_keys: list[set[str]],
    options: Options,
    rank: int | None,
    nodes: bool,
    files: list[int],
    reread: Reread,
) -> tuple[RankedReport, HostPart]:
    """The job's report from its joined columns (no activity) and its files' parts (in join
    order, each moved by its shift; ``files``: the index of each as given), and the host
    findings (``nodes``: a part's ranks are counted from 0, as a node's are). A step's
    kernels are read from the rank's own file (``reread``), when asked for."""
    job_source = query_source(cols.meta, options.phase, options.range, options.top)
    entries: list[RankEntry] = []
    found = HostPart([], [], [])
    firsts = []
    for part, shift, keys, file in zip(parts, shifts, trace_keys, files, strict=True):
        first = len(entries)
        firsts.append(first)
        for local, entry in enumerate(part.entries):  # its source's file's words: the job's
            own = {k: v for k, v in entry.report.source.items() if k not in keys}
            entry.report.source = {**job_source, **own}
            r = len(entries)
            assert isinstance(entry.steps, ColumnSteps)
            steps = entry.steps.moved(r, shift)
            steps.read_kernels = _file_kernels(reread, file, local, entry.steps.starts, shift,
                                               nodes)  # fmt: skip
            entries.append(replace(entry, steps=steps))
        if part.host is not None:
            mine = part.host.renumbered(first) if nodes else part.host
            found = HostPart(found.found + mine.found, found.notes + mine.notes,
                             found.spans + mine.spans)  # fmt: skip
    if len(entries) != len(layout.info):
        raise ValueError(f"{len(entries)} ranks analysed apart, {len(layout.info)} joined")
    for entry, info in zip(entries, layout.info, strict=True):
        entry.info = info
    check_rank(layout, rank)
    wholes = [p.whole for p in parts]
    check_phase(wholes, options.phase)
    whole = None
    if rank is None:
        scope = job_scope(cols, wholes, [layout.info[i]["pid"] for i in firsts],
                          options.phase_ranges)  # fmt: skip
        whole = scope_report(cols, scope, name_codes(cols)[1], options.top, options.phase,
                             options.range)  # fmt: skip
    return ranked_report(whole, layout, entries, rank), found


def _file_kernels(
    reread: Reread, file: int, local: int, starts: np.ndarray, shift: int, node: bool
) -> Callable[[int], pd.DataFrame]:
    """``read(step)`` of a rank whose file's activities the client does not hold: its
    file's columns read again (``local``: its rank among the file's; ``starts``: its steps'
    on the file's clock), its kernels in the step moved by ``shift`` onto the job's."""

    def read(step: int) -> pd.DataFrame:
        cols = reread(file)
        layout = ranks_of(cols, fewest=1) if node else None
        rank = layout.rank if layout is not None else np.zeros(len(cols), np.int16)
        kernel_name = name_codes(cols)[0] == KERNEL
        nccl_name = kernel_name & is_nccl(np.array(cols.names, dtype=object))
        frame = kernels_reader(cols, rank, local, starts, kernel_name, nccl_name)(step)
        frame["start"] += shift
        frame["end"] += shift
        return frame

    return read
