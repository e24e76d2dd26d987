"""Which annotation ranges may be phases: never a library's, and the user's own by name.

Libraries annotate their own work with NVTX (NCCL's ``ncclAllReduce`` on NCCL's thread,
CUB's ``cub::DeviceRadixSort`` in ``CCCL``, cuDNN, cuBLAS, NVSHMEM) and PyTorch annotates
its ops (``emit_nvtx`` / ``nsys --pytorch``: ``aten::mm, seq = 12``; torch.profiler's
``ProfilerStep#N``, ``Optimizer.step#AdamW.step``): those are ranges, never phases, in
whatever domain and on whatever thread they lie (:func:`library_ranges`). Domains are
matched by name: an nsys export numbers them per process, and its reader names each
range's domain from its own process's ``NvtxDomainCreate``.

A program's own marks become phases without help when they are spelled as phases
(``forward``, ``backward``, ``optimizer``, any case) in the default domain or, where the
default domain holds none, in the one domain of its own that does (:func:`phase_domains`;
a torch.profiler range ``DOMAIN:forward`` counts as ``forward`` of domain ``DOMAIN``).
Other spellings are mapped by the user: ``--phase-ranges
forward=NAME,backward=NAME,optimizer=NAME`` (:class:`PhaseRanges`), a NAME being a range
name or ``domain:name``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.names import matching
from profkit.errors import BadInput
from profkit.traces.schema import PROCESS_SHIFT
from profkit.workload.names import PHASES

LIBRARY_DOMAINS = (
    "NCCL", "RCCL", "CCCL", "CUB", "Thrust", "cuDNN", "cuBLAS", "cuBLASLt", "cuSPARSE",
    "cuFFT", "cuSOLVER", "cuRAND", "NVSHMEM", "CUTLASS", "TensorRT", "NPP",
    "nvJPEG", "DALI", "UCX", "UCC", "MPI", "PyTorch", "torch", "libtorch", "JAX", "XLA",
    "TransformerEngine", "Megatron",
)  # fmt: skip
"""NVTX domains libraries annotate their own work in (matched without case)."""
_LIBRARY = {d.lower() for d in LIBRARY_DOMAINS}
_OP_RANGE = re.compile(
    r"^(?:[A-Za-z_][\w.]*::|ProfilerStep#|Optimizer\.|enumerate\(DataLoader\)#|nccl:|"
    r"cuda[A-Z]|cu[A-Z]\w*$)|, seq = |, op_id = "
)
"""Names of ranges PyTorch or CUDA libraries open in any domain: ``aten::`` ops (with
``emit_nvtx``'s ``, seq = N``), torch.profiler's step, optimizer and data-loader ranges,
``nccl:`` record_function ranges, CUDA API ranges."""


def is_library_domain(domain: str) -> bool:
    """Is ``domain`` a library's own NVTX domain?"""
    return str(domain).lower() in _LIBRARY


def library_ranges(ranges: pd.DataFrame) -> np.ndarray:
    """Per range: opened by a library (its domain, or an op range's name), never a phase."""
    if ranges.empty:
        return np.zeros(0, dtype=bool)
    by_domain = matching(ranges["domain"].fillna("").astype(str), is_library_domain)
    return by_domain | matching(ranges["name"], lambda name: bool(_OP_RANGE.search(name)))


_SPELLED = re.compile(r"^([A-Za-z_]\w*):(" + "|".join(PHASES) + r")$", re.IGNORECASE)


def spelled_in_domain(ranges: pd.DataFrame) -> pd.DataFrame:
    """``ranges`` with each default-domain ``DOMAIN:phase`` name (a torch.profiler
    ``record_function("truth:forward")``, which has no NVTX domain) read as the range
    ``phase`` of domain ``DOMAIN``, as nsys shows the same mark (a copy only where any)."""
    if ranges.empty:
        return ranges
    names = ranges["name"].astype(str)
    spelled = matching(names, lambda name: bool(_SPELLED.match(name)))
    spelled &= (ranges["domain"].fillna("").astype(str) == "").to_numpy()
    if not spelled.any():
        return ranges
    parts = names[spelled].str.extract(_SPELLED)
    out = ranges.copy()
    out.loc[spelled, "domain"] = parts[0].to_numpy()
    out.loc[spelled, "name"] = parts[1].str.lower().to_numpy()
    return out


def mapped_marks(
    ranges: pd.DataFrame, phase_ranges: PhaseRanges | None
) -> tuple[pd.DataFrame, np.ndarray] | None:
    """The ranges ``phase_ranges`` maps (``--phase-ranges``) renamed to their phases, the
    others to ``""``, and which are mapped; None where it maps none (or is None)."""
    mapped = None if phase_ranges is None else phase_ranges.phase_of(ranges)
    if mapped is None or not (mapped != None).any():  # noqa: E711 (elementwise)
        return None
    marks = ranges.copy()
    marks["name"] = np.where(mapped == None, "", mapped)  # noqa: E711 (elementwise)
    return marks, mapped != None  # noqa: E711


def under_phase_names(ranges: pd.DataFrame, phase_ranges: PhaseRanges | None) -> pd.DataFrame:
    """``ranges`` with the marks that are phases named as their phases, as the plan finds
    them: the ranges ``phase_ranges`` maps, where it maps any (the others unnamed), else
    each ``DOMAIN:phase`` spelling (:func:`spelled_in_domain`)."""
    found = mapped_marks(ranges, phase_ranges)
    return spelled_in_domain(ranges) if found is None else found[0]


def phase_domains(ranges: pd.DataFrame) -> np.ndarray:
    """Per range: in the NVTX domain its process takes phases from, and not a library's.

    That domain is, per process, the default one ("") where it holds a range named as a
    phase; else the one non-library domain that does (the most such ranges where several
    do; ties: the first name in order); else the default domain.
    """
    if ranges.empty:
        return np.zeros(0, dtype=bool)
    domains = ranges["domain"].fillna("").astype(str)
    library = library_ranges(ranges)
    known = matching(ranges["name"], lambda name: name.lower() in PHASES) & ~library
    process = ranges["thread"].to_numpy(np.int64) >> PROCESS_SHIFT
    frame = pd.DataFrame({"process": process, "domain": domains.to_numpy(dtype=object)})[known]
    counts = frame.groupby(["process", "domain"]).size().reset_index(name="n")
    counts["default"] = counts["domain"] == ""
    counts = counts.sort_values(["process", "default", "n", "domain"],
                                ascending=[True, False, False, True])  # fmt: skip
    first = counts.drop_duplicates("process")
    chosen = dict(zip(first["process"].tolist(), first["domain"].tolist(), strict=True))
    wanted = np.full(len(ranges), "", dtype=object)
    for pid, domain in chosen.items():  # processes are few
        wanted[process == pid] = domain
    return (domains.to_numpy(dtype=object) == wanted) & ~library


def unclosed_ranges(ranges: pd.DataFrame, meta: dict[str, Any]) -> np.ndarray:
    """Per range: left open when the capture ended (the reader's ``unclosed_ranges``)."""
    found = meta.get("unclosed_ranges") or []
    if ranges.empty or not found:
        return np.zeros(len(ranges), dtype=bool)
    keys = pd.MultiIndex.from_arrays([ranges["thread"].to_numpy(np.int64),
                                      ranges["start"].to_numpy(np.int64)])  # fmt: skip
    return np.asarray(keys.isin([tuple(pair) for pair in found]), dtype=bool)


@dataclass(frozen=True)
class PhaseRanges:
    """``--phase-ranges``: per phase, the range that marks it (``domain:name`` or a name)."""

    marks: tuple[tuple[str, str], ...]
    """(phase, NAME) pairs in the order given."""
    strict: bool = True
    """A trace none of whose ranges is mapped is an error (else: read as without them)."""

    @classmethod
    def parse(cls, text: str | None, strict: bool = True) -> PhaseRanges | None:
        """``forward=NAME,backward=NAME,optimizer=NAME`` (any of them; None for none)."""
        if text is None or not text.strip():
            return None
        marks: dict[str, str] = {}
        for part in text.split(","):
            phase, sep, name = part.partition("=")
            phase, name = phase.strip().lower(), name.strip()
            if not sep or not name:
                raise BadInput(
                    f"--phase-ranges takes PHASE=NAME pairs separated by commas "
                    f"(e.g. forward=truth:forward,backward=bwd); got {part.strip()!r}"
                )
            if phase not in PHASES:
                raise BadInput(f"--phase-ranges: {phase!r} is not a phase; use {', '.join(PHASES)}")
            if phase in marks:
                raise BadInput(f"--phase-ranges names {phase} twice")
            marks[phase] = name
        names = list(marks.values())
        if len(set(names)) < len(names):
            raise BadInput("--phase-ranges maps one range to two phases")
        return cls(tuple(marks.items()), strict)

    def __str__(self) -> str:
        return ",".join(f"{phase}={name}" for phase, name in self.marks)

    def phase_of(self, ranges: pd.DataFrame) -> np.ndarray:
        """Per range: the phase it marks, or None. A NAME matches a range of that name in
        any domain, or ``domain:name`` one in that domain (a Chrome trace's
        ``record_function("truth:forward")`` is matched by its whole name as well)."""
        out = np.full(len(ranges), None, dtype=object)
        if ranges.empty:
            return out
        name = ranges["name"].astype(str).to_numpy(dtype=object)
        domain = ranges["domain"].fillna("").astype(str).to_numpy(dtype=object)
        for phase, mark in self.marks:
            hit = name == mark
            dom, sep, bare = mark.partition(":")
            if sep and bare:
                hit |= (domain == dom) & (name == bare)
            out[hit & (out == None)] = phase  # noqa: E711 (elementwise)
        return out

    def check_found(self, ranges: pd.DataFrame) -> None:
        """One clear line when no range of the trace is mapped (where ``strict``)."""
        if self.strict and not (self.phase_of(ranges) != None).any():  # noqa: E711
            raise BadInput(
                f"--phase-ranges: no range of this trace matches {self} (a NAME is a range "
                "name or domain:name, as the ranges table shows them)"
            )
