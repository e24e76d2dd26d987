"""A job's kernel statistics across its ranks from its files' duration counts: the reduce's
share of the kernel tables of a job read on Dask workers (:mod:`.node_parts`).

Each file, analysed alone where it lies, keeps its activities' durations as counts per
(name, phase) (:class:`.duration_counts.DurationCounts`) and the launch shape of each
group's first longest activity (:class:`FileStats`); the client renames every file's
names and phases as the job's, adds the counts up and reads the statistics from them,
never from the job's activities. A group's shape is that of the first file, in join
order, whose longest activity of the group is as long as the job's: the first longest in
the joined activities' order, as one process reading the joined files finds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit.analysis.attribution import Plan
from profkit.analysis.duration_counts import DURATION_BITS, DURATION_MASK, DurationCounts, added
from profkit.analysis.kernel_stats import MAX_GROUPS, STAT_COLUMNS, KernelStats
from profkit.errors import BadInput
from profkit.workload.names import PHASES


@dataclass
class Shapes:
    """The launch shape of each group's first longest activity, by (name, phase) codes
    (phase -1: per name): plain arrays and lists, a few objects a file."""

    name: np.ndarray
    phase: np.ndarray
    grid: list[str]
    block: list[str]

    @classmethod
    def of(cls, table: pd.DataFrame) -> Shapes:
        return cls(
            name=table["name"].to_numpy(np.int64),
            phase=table["phase"].to_numpy(np.int64),
            grid=table["grid"].tolist(),
            block=table["block"].tolist(),
        )


@dataclass
class FileStats:
    """One file's share of its job's kernel statistics: its kernel names (by code), its
    phases as its own plan names them (the first ``annotated`` from its ranges, the
    inferred ones after, ``remap`` giving each ``PHASES`` index its own), the duration
    counts of its selected activities per (name, phase) and the shapes (``grid``,
    ``block``) of each group's first longest, per (name, phase) and per name."""

    names: list[str]
    phases: list[str]
    annotated: int
    remap: np.ndarray
    counts: DurationCounts
    shapes: Shapes
    shapes_overall: Shapes

    @classmethod
    def of(cls, names: list[str], plan: Plan, stats: KernelStats) -> FileStats:
        """A file's, from its plan and its statistics (computed with their counts)."""
        assert stats.counts is not None, "the statistics were computed without their counts"
        per_phase, overall = stats.whole()
        codes = plan.phase_code[:-1]
        return cls(
            names=list(names),
            phases=list(plan.phase_names),
            annotated=int(codes.max()) + 1 if len(codes) else 0,
            remap=plan.remap.copy(),
            counts=stats.counts,
            shapes=Shapes.of(per_phase),
            shapes_overall=Shapes.of(overall),
        )

    def phase_codes(self, names: list[str], remap: np.ndarray) -> np.ndarray:
        """Per phase of this file, the job's code for it (``names``: the job's phases,
        ``remap``: its code of each ``PHASES`` index): a phase range's by its name, an
        inferred phase by what it is (the job may call it by another file's range name)."""
        job = {name: i for i, name in enumerate(names[:-1])}
        codes = np.full(len(self.phases), len(names) - 1, dtype=np.int64)
        codes[: self.annotated] = [job[name] for name in self.phases[: self.annotated]]
        for code, own in enumerate(self.remap[: len(PHASES)].tolist()):
            if own >= self.annotated and own < len(self.phases) - 1:
                codes[own] = remap[code]
        return codes


def job_stats(
    files: list[FileStats], names: list[str], phases: list[str], remap: np.ndarray
) -> KernelStats:
    """The job's statistics per (name, phase) and per name (``names``: the job's kernel
    names by code; ``phases``, ``remap``: its phases, :func:`.job_scope.job_phases`) from
    its files' shares, in join order."""
    n_phases = len(phases)
    if len(names) * n_phases >= MAX_GROUPS:
        raise BadInput("too many (kernel name, phase) groups for one report")
    code_of = {name: i for i, name in enumerate(names)}
    per_phase: list[_Share] = []
    per_name: list[_Share] = []
    for f in files:
        name_code = np.array([code_of[n] for n in f.names], dtype=np.int64)
        phase_code = f.phase_codes(phases, remap)
        counts = _renamed(f.counts, name_code, phase_code, n_phases)
        group = name_code[f.shapes.name] * n_phases + phase_code[f.shapes.phase]
        per_phase.append(_Share(counts, group, f.shapes))
        by_name = counts.regrouped(lambda g: g // n_phases)
        per_name.append(_Share(by_name, name_code[f.shapes_overall.name], f.shapes_overall))
    fine = _table(per_phase)
    fine["name"], fine["phase"] = fine["group"] // n_phases, fine["group"] % n_phases
    coarse = _table(per_name)
    coarse["name"], coarse["phase"] = coarse["group"], -1
    return KernelStats(per_phase=fine[STAT_COLUMNS], overall=coarse[STAT_COLUMNS])


def _renamed(
    counts: DurationCounts, name_code: np.ndarray, phase_code: np.ndarray, n_phases: int
) -> DurationCounts:
    """A file's counts in the job's group codes (its own: ``name * phases + phase``)."""
    own = len(phase_code)
    return counts.regrouped(lambda g: name_code[g // own] * n_phases + phase_code[g % own])


@dataclass
class _Share:
    """One file's counts in the job's group codes, and its groups' shapes (one per code of
    ``group``)."""

    counts: DurationCounts
    group: np.ndarray
    shapes: Shapes


def _table(shares: list[_Share]) -> pd.DataFrame:
    """The statistics of the shares' counts added up, each group with the shape of the
    first share whose longest activity of the group is the group's longest."""
    table = added([s.counts for s in shares]).stats()
    groups, high = table["group"].to_numpy(), table["high"].to_numpy()
    grid = np.full(len(table), None, dtype=object)
    block = np.full(len(table), None, dtype=object)
    todo = np.ones(len(table), dtype=bool)
    for share in shares:
        own, own_high = _highest(share.counts)
        at = np.searchsorted(groups, own)
        hit = todo[at] & (own_high == high[at])
        if not hit.any():
            continue
        order = np.argsort(share.group, kind="stable")
        rows = order[np.searchsorted(share.group, own[hit], sorter=order)]
        grid[at[hit]] = [share.shapes.grid[i] for i in rows.tolist()]
        block[at[hit]] = [share.shapes.block[i] for i in rows.tolist()]
        todo[at[hit]] = False
    table["grid"], table["block"] = grid, block
    return table.drop(columns=["high"])


def _highest(counts: DurationCounts) -> tuple[np.ndarray, np.ndarray]:
    """Each group's code and longest duration (its last key)."""
    group = counts.keys >> DURATION_BITS
    last = np.flatnonzero(np.diff(group, append=-1))
    return group[last], counts.keys[last] & DURATION_MASK
