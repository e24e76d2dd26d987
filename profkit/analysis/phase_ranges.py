"""Which ranges are phases, and how phases are named (docs/ATTRIBUTION.md).

Phase ranges are the owner's ranges, in the phase domain (the default NVTX domain), named
``forward``/``backward``/``optimizer`` wherever they nest, plus the user's own outermost
ranges beside them in a step that has one of those (``eager``, ``data``); a range that only
wraps them (a ``step`` range) is not a phase. No other range is ever promoted to a phase:
without those names, ``computing softmax`` or an ``aten::`` op range stays a range. A
process's *owner* is the thread whose phase ranges cover the most time: the main thread.

Steps without phase ranges get their phases inferred (:mod:`profkit.analysis.inference`):
annotated phases win per step (``PhaseMode``), and :func:`phase_source` says which it was.
Each activity's phase and ranges are found by :mod:`.attribution`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from profkit.analysis.inference import InferredPhases, TraceHints
from profkit.analysis.intervals import Lanes
from profkit.analysis.names import matching
from profkit.traces.schema import PROCESS_SHIFT
from profkit.workload.names import PHASES

KNOWN_PHASES = PHASES
UNATTRIBUTED = "unattributed"
PhaseMode = Literal["auto", "annotated", "inferred"]
PHASE_MODES: tuple[PhaseMode, ...] = ("auto", "annotated", "inferred")
"""``auto``: annotated phases where a step has them, inferred elsewhere."""


def default_phase_domain(ranges: pd.DataFrame) -> str:
    """The NVTX domain phase ranges are looked for in: the default one ("") where any range
    uses it, else the most used."""
    domains = ranges["domain"].fillna("").astype(str)
    return "" if (domains == "").any() or domains.empty else domains.mode().iloc[0]


def phase_range_rows(
    ranges: pd.DataFrame, in_domain: np.ndarray, lanes: Lanes, inferred: InferredPhases | None
) -> tuple[np.ndarray, dict[int, int]] | None:
    """Rows of the phase ranges, and each process's owner thread (most known-phase time).

    Known phases (``forward``, ``backward``, ``optimizer``) count wherever they nest; the
    owner's other outermost ranges count only in a step that holds a known one, so that a
    trace without phase ranges never turns ``computing softmax`` into a "phase". Steps come
    from ``inferred``: without it, None where such a range must be placed in its step.
    """
    candidates = _outermost(ranges, in_domain, lanes)
    thread = ranges["thread"].to_numpy(dtype=np.int64)[candidates]
    start = ranges["start"].to_numpy(dtype=np.int64)[candidates]
    end = ranges["end"].to_numpy(dtype=np.int64)[candidates]
    known = _known(ranges)[candidates]
    owners = _owners(thread[known], end[known] - start[known])
    on_owner = np.isin(thread, list(owners.values()))
    if inferred is None:
        if (on_owner & ~known).any():
            return None
        return candidates[on_owner & known], owners
    step = inferred.step_of(thread, start)
    anchored = np.isin(step, step[known & on_owner])
    return candidates[on_owner & (known | anchored)], owners


def _outermost(ranges: pd.DataFrame, mask: np.ndarray, lanes: Lanes) -> np.ndarray:
    """Rows of the outermost in-domain ranges that do not wrap known phases."""
    if not mask.any():
        return np.empty(0, dtype=np.int64)
    thread = ranges["thread"].to_numpy(dtype=np.int64)
    start = lanes.key(thread, ranges["start"].to_numpy(dtype=np.int64))
    end = lanes.key(thread, ranges["end"].to_numpy(dtype=np.int64))
    known = mask & _known(ranges)
    known_starts = np.sort(start[known])
    holds_known = np.searchsorted(known_starts, end, "left") > np.searchsorted(
        known_starts, start, "left"
    )
    candidates = np.flatnonzero(mask & (known | ~holds_known))
    order = np.lexsort((-end[candidates], start[candidates]))
    candidates = candidates[order]
    c_start, c_end = start[candidates], end[candidates]
    # Outermost: starts at or after every earlier candidate of its lane has ended. Keys of
    # a later lane are larger than any of an earlier one, so one running max serves all.
    reach = np.maximum.accumulate(c_end)
    outermost = np.ones(len(candidates), dtype=bool)
    outermost[1:] = c_start[1:] >= reach[:-1]
    return candidates[outermost]


def _known(ranges: pd.DataFrame) -> np.ndarray:
    """Per range: is it named forward, backward or optimizer (any case)?"""
    return matching(ranges["name"], lambda name: name.lower() in KNOWN_PHASES)


def _owners(threads: np.ndarray, durations: np.ndarray) -> dict[int, int]:
    """Per process, the thread whose phase ranges last longest in total."""
    if not len(threads):
        return {}
    per_thread = pd.Series(durations).groupby(threads).sum()
    frame = pd.DataFrame(
        {"thread": per_thread.index, "time": per_thread.to_numpy()},
    )
    frame["process"] = frame["thread"].to_numpy() >> PROCESS_SHIFT
    best = frame.sort_values(["process", "time", "thread"], ascending=[True, False, True])
    best = best.drop_duplicates("process")
    return dict(zip(best["process"].tolist(), best["thread"].tolist(), strict=True))


def ordered_phase_names(annotated: list[str], inferred: np.ndarray) -> tuple[list[str], np.ndarray]:
    """All phase names (annotated, then inferred ones not among them, then unattributed),
    and the index of each inferred phase (``PHASES`` order) in that list."""
    names = list(annotated)
    lowered = {name.lower(): i for i, name in enumerate(names)}
    remap = np.full(len(PHASES) + 1, -1, dtype=np.int64)  # the last slot maps NO_PHASE
    present = set(inferred.tolist())  # a rank's steps: few (np.unique costs more)
    for code, phase in enumerate(PHASES):
        if code in present:
            if phase not in lowered:
                lowered[phase] = len(names)
                names.append(phase)
            remap[code] = lowered[phase]
    names.append(UNATTRIBUTED)
    return names, remap


def phase_source(use_inferred: np.ndarray, has_annotated: bool, phases: PhaseMode) -> str:
    """``annotated``, ``inferred`` or ``mixed``, from which launches' phases were inferred."""
    if phases != "auto":
        return phases
    if not len(use_inferred):
        return "annotated" if has_annotated else "inferred"
    if use_inferred.all():
        return "inferred"
    return "mixed" if use_inferred.any() else "annotated"


def inference_sentence(
    inferred: int, source: str, autograd_threads: np.ndarray, meta: Mapping[str, Any]
) -> list[str]:
    """The note on ``inferred`` activities whose phases were inferred (none for 0)."""
    if not inferred:
        return []
    names = TraceHints.of(meta).thread_names
    threads = autograd_threads.tolist()
    workers = ", ".join(dict.fromkeys(names.get(t, f"thread {t}") for t in threads))
    which = (
        "every step has no forward/backward/optimizer range"
        if source == "inferred"
        else f"{inferred:,} GPU activities lie in steps without phase ranges"
    )
    backward = (
        f"backward = what autograd's threads ({workers}) launched"
        if workers
        else "no autograd thread (pt_autograd_N) is named in this trace, so none is backward"
    )
    return [
        f"Phases inferred ({which}): {backward}; optimizer = the main thread's launches "
        "after a backward pass up to its last optimizer kernel or Optimizer.step range; "
        "forward = the rest (docs/ATTRIBUTION.md, 'Phases without annotations')."
    ]


@dataclass
class PhaseIntervals:
    """The phase ranges chosen, as intervals on their lanes in start order, and their codes."""

    is_phase: np.ndarray
    """Per range row: is it one of the phases."""
    rows: np.ndarray
    start: np.ndarray
    end: np.ndarray
    names: list[str]
    """Distinct phase names in order of first start."""
    code: np.ndarray
    """Per phase (in start order) its name's index, then one last -1: what ``stab``'s -1
    (no phase open) indexes."""


def phase_intervals(ranges: pd.DataFrame, rows: np.ndarray, lanes: Lanes) -> PhaseIntervals:
    """Order the phase ``rows`` of ``ranges`` by their start key on ``lanes`` and code them."""
    r_thread = ranges["thread"].to_numpy(dtype=np.int64)
    is_phase = np.zeros(len(ranges), dtype=bool)
    is_phase[rows] = True
    start = lanes.key(r_thread[rows], ranges["start"].to_numpy(dtype=np.int64)[rows])
    end = lanes.key(r_thread[rows], ranges["end"].to_numpy(dtype=np.int64)[rows])
    order = np.argsort(start, kind="stable")
    rows, start, end = rows[order], start[order], end[order]
    row_names = ranges["name"].to_numpy(dtype=object)[rows]
    names = list(dict.fromkeys(row_names.tolist()))
    name_code = {name: i for i, name in enumerate(names)}
    code = np.append(np.array([name_code[x] for x in row_names], dtype=np.int64), -1)
    return PhaseIntervals(is_phase, rows, start, end, names, code)
