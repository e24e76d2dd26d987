"""What a query picks of a trace: its options checked, the phase a ``--phase`` name means,
the labels ``--range`` matches, and :class:`Selection`, the activities a pass adds up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profkit.analysis.phase_ranges import PHASE_MODES
from profkit.analysis.tables import pair_groups
from profkit.errors import BadInput


def check_options(top: int, phases: str) -> None:
    """Raise :class:`BadInput` for a ``top`` or ``phases`` no report can take."""
    if top < 0:
        raise BadInput(f"--top must be 0 (all) or more, got {top}")
    if phases not in PHASE_MODES:
        raise BadInput(f"--phases must be one of {', '.join(PHASE_MODES)}, got {phases!r}")


def phase_index(phase_names: list[str], unattributed_seen: bool, phase: str) -> int:
    """The code of ``phase`` (any case) among ``phase_names``, whose last name, the
    catch-all ``unattributed``, is offered only where some activity has it."""
    last = len(phase_names) - 1
    present = [name for i, name in enumerate(phase_names) if i < last or unattributed_seen]
    lowered = [p.lower() for p in present]
    if phase.lower() not in lowered:
        listed = ", ".join(present) or "none"
        raise BadInput(f"no phase {phase!r} in this trace; phases: {listed}")
    return lowered.index(phase.lower())


def range_labels(ranges: pd.DataFrame) -> np.ndarray:
    """``name`` for the default NVTX domain, ``domain:name`` for others (as nsys shows them)."""
    names = ranges["name"].to_numpy(dtype=object)
    domains = ranges["domain"].fillna("").to_numpy(dtype=object)

    def label(n: object, d: object) -> object:
        return f"{d}:{n}" if d else n

    # One label per distinct (name, domain), not one f-string per range row.
    group, first = pair_groups(names, domains)
    distinct = np.array([label(names[f], domains[f]) for f in first.tolist()], dtype=object)
    labels = np.empty(len(names), dtype=object)
    known = group >= 0
    labels[known] = distinct[group[known]]
    for row in np.flatnonzero(~known).tolist():  # a missing name: as it reads
        labels[row] = label(names[row], domains[row])
    return labels


def no_range(range_: str, labels: np.ndarray) -> BadInput:
    """The error of a ``--range`` that names none of these ranges (``labels``)."""
    known = ", ".join(list(dict.fromkeys(labels.tolist()))[:12]) or "none"
    return BadInput(f"no range named {range_!r} in this trace; ranges: {known}")


@dataclass
class Selection:
    """Which activities a pass adds up: per rank the phase code ``--phase`` keeps (-1:
    none of its activities), and per slot whether it lies in a range ``--range`` names
    (:meth:`.attribution.Plan.slots_inside`). None: no such filter."""

    phase_of_rank: np.ndarray | None = None
    inside: np.ndarray | None = None

    @property
    def everything(self) -> bool:
        return self.phase_of_rank is None and self.inside is None

    def of(
        self, rank: np.ndarray | int, att: Mapping[str, np.ndarray], lo: int, hi: int
    ) -> np.ndarray | None:
        """Mask of the chunk's selected activities (``rank``: theirs, or one for all;
        None: every activity is)."""
        if self.everything:
            return None
        keep = np.ones(hi - lo, dtype=bool)
        if self.phase_of_rank is not None:
            keep &= att["phase"][lo:hi] == self.phase_of_rank[rank]
        if self.inside is not None:
            keep &= self.inside[att["self_slot"][lo:hi]] | self.inside[att["owner_slot"][lo:hi]]
        return keep
