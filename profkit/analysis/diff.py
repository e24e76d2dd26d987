"""What changed between two profiles: GPU time deltas per phase, per category and per kernel.

:func:`diff_reports` compares two :class:`~profkit.analysis.KernelReport` (any mix of
backends); :func:`diff` reports the two traces of a loaded job first (what ``profkit diff``
calls).
Times are per step by default (each phase divided by its range instances, as in
``profkit kernels --compare``): two captures rarely hold the same number of steps.

A kernel's change of time per step is two changes: it runs more or fewer times per step
(``calls_delta_ms``: the change of instances at A's time per call), and each run is faster
or slower (``per_call_delta_ms``: B's instances times the change of time per call); the two
add up to ``delta_ms``. A kernel is *faster* or *slower* only by its time per call, and only
beyond ``noise_pct`` (default :data:`NOISE_PCT`): a kernel's mean time per call moves by a
few per cent between two runs of the same program on the same GPU, so smaller changes are
not findings. One that only runs more or fewer times is in ``more_calls``/``fewer_calls``.

Kernels are matched by their full name through :func:`match_key`: Nsight Systems and
torch.profiler spell one demangled name differently (``(int)128`` / ``128``, ``<unnamed>`` /
``(anonymous namespace)``, ``[lambda() (instance 1)]`` / ``{lambda()#1}``, parameter lists,
``[CUDA memcpy Device-to-Device]`` / ``[memcpy DtoD]``); compared as written, a
mixed-format diff would call most kernels vanished and then appeared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from profkit.analysis import crosscheck
from profkit.analysis.names import short_kernel_name
from profkit.analysis.phase_marks import PhaseRanges
from profkit.analysis.presentation import TERMINAL_ROWS, fold_rest, terminal_rows
from profkit.analysis.report_types import KernelReport
from profkit.errors import BadInput
from profkit.formats import plural

if TYPE_CHECKING:
    from profkit.traces.job import Job

NOISE_PCT = 5.0
"""Per-call changes within ± this (%) are run-to-run noise, not faster or slower."""
GROUPS = {
    "appeared": "Appeared (only in B)",
    "vanished": "Vanished (only in A)",
    "faster": "Faster per call in B",
    "slower": "Slower per call in B",
    "fewer_calls": "Fewer calls in B (time per call within noise)",
    "more_calls": "More calls in B (time per call within noise)",
}
PHASE_COLUMNS = {  # crosscheck.compare_phases' columns, A the reference
    "A kernels": "a_kernels", "B kernels": "b_kernels", "A gpu_time_ms": "a_ms",
    "B gpu_time_ms": "b_ms", "B − A gpu_time_ms": "delta_ms", "B vs A %": "delta_pct",
}  # fmt: skip
KERNEL_COLUMNS = [
    "name", "short_name", "category", "a_instances", "b_instances", "a_total_ms",
    "b_total_ms", "delta_ms", "delta_pct", "a_avg_us", "b_avg_us", "avg_delta_pct",
    "calls_delta_ms", "per_call_delta_ms",
]  # fmt: skip
KERNEL_PARTS = {  # which part of a kernel's Δ ms makes its group (Δ ms all: the whole)
    "faster": "of the change per call", "slower": "of the change per call",
    "fewer_calls": "of the change of calls", "more_calls": "of the change of calls",
}  # fmt: skip
PARTS = {"kernels": "kernels", "instances": "calls", "ms": "ms", "total_ms": "ms", "avg_us": "µs/call"}  # fmt: skip
HEADERS = {
    "short_name": "kernel",
    "delta_ms": "Δ ms",
    "delta_pct": "Δ %",
    "avg_delta_pct": "Δ %/call",
    "calls_delta_ms": "Δ ms calls",
    "per_call_delta_ms": "Δ ms per call",
} | {
    f"{side}_{part}": f"{side.upper()} {header}" for side in "ab" for part, header in PARTS.items()
}

_COPY = re.compile(r"^\[CUDA (memcpy|memset)(?: (\w)\w*-to-(\w)\w*)?\]$")
_VOID = re.compile(r"\bvoid\s+")  # nsys writes it before function-template arguments too
_ANONYMOUS = re.compile(r"\(anonymous namespace\)|<unnamed>")
_LAMBDA = re.compile(r"\[lambda\([^()]*\) \(instance (\d+)\)\]|\{lambda\([^()]*\)#(\d+)\}")
_PARENS = re.compile(r"\([^()]*\)")  # casts and parameter lists: spelled differently
_LITERAL = re.compile(r"\b(false|true)\b|\b(\d+)(?:ull|ul|ll|u|l)\b")
_SPACES = re.compile(r"\s+")


def match_key(name: str) -> str:
    """A kernel name with the demangler's spelling taken out, for matching across formats."""
    text = _COPY.sub(lambda m: f"[{m[1]} {m[2]}to{m[3]}]" if m[2] else f"[{m[1]}]", name)
    text = _ANONYMOUS.sub("anon", _VOID.sub("", text))
    text = _LAMBDA.sub(lambda m: f"lambda#{m[1] or m[2]}", text)
    previous = None
    while previous != text:  # innermost first: parameter lists nest
        previous, text = text, _PARENS.sub("", text)
    text = _LITERAL.sub(lambda m: {"false": "0", "true": "1"}.get(m[1]) or m[2], text)
    return _SPACES.sub("", text)


@dataclass
class ProfileDiff:
    """B against A: ``delta_ms`` is B − A, ``delta_pct`` relative to A (NaN where A is 0).

    ``phases`` (with a ``total`` row) and ``categories`` (summed over phases) hold each
    side's kernel launches (``a_kernels``) and GPU ms of all activities (``a_ms``: kernels,
    memcpy and memset); ``kernels`` maps each group of :data:`GROUPS` to its first
    ``top`` rows; ``counts`` says how many each has in all, and how many are ``unchanged``
    (same calls, time per call within ``noise_pct``).
    ``a`` and ``b`` hold path, format, steps (and the run's config when known).
    """

    a: dict[str, Any]
    b: dict[str, Any]
    per_step: bool
    phases: pd.DataFrame
    categories: pd.DataFrame
    kernels: dict[str, pd.DataFrame]
    counts: dict[str, int]
    notes: list[str] = field(default_factory=list)
    noise_pct: float = NOISE_PCT

    def to_json(self) -> dict[str, Any]:
        """``{a, b, per_step, noise_pct, phases, categories, kernels: {appeared, vanished,
        faster, slower, fewer_calls, more_calls}, counts}``; whole counts as integers."""
        return {
            "a": self.a,
            "b": self.b,
            "per_step": self.per_step,
            "noise_pct": self.noise_pct,
            "phases": _records(self.phases),
            "categories": _records(self.categories),
            "kernels": {g: _records(rows) for g, rows in self.kernels.items()},
            "counts": dict(self.counts),
        }

    def lines(self) -> list[str]:
        """What A and B are, total GPU time A → B, kernels per group, how to read the tables."""
        total = self.phases.set_index("phase").loc["total"]
        pct = "" if np.isnan(total["delta_pct"]) else f", {total['delta_pct']:+.1f}%"
        groups = ", ".join(f"{self.counts[g]} {g}" for g in [*GROUPS, "unchanged"])
        sides = (("A", self.a), ("B", self.b))
        return [
            *(
                f"{k} = {s['path']} ({s['format']}, {plural(s['steps'], 'step')}"
                + (f" over {s['ranks']} ranks)" if s["ranks"] > 1 else ")")
                for k, s in sides
            ),
            f"GPU time {'per step' if self.per_step else 'in all'}: {total['a_ms']:,.3f} ms → "
            f"{total['b_ms']:,.3f} ms ({total['delta_ms']:+,.3f} ms{pct}); kernels: "
            f"{groups.replace('_', ' ')}.",
            f"Faster/slower means the time per call changed by more than ±{self.noise_pct:g}% "
            "(--noise; smaller changes are run-to-run noise). A kernel's whole change (Δ ms "
            "all) is what its calls changed, at A's time per call, plus what its time per "
            "call changed; each group's Δ ms is the part that puts it there.",
            *self.notes,
        ]

    def data_tables(self) -> list[tuple[str, pd.DataFrame]]:
        """The JSON's tables under its column names, for ``--format csv`` (its ``table``
        column: ``phases``, ``categories``, then a kernel group's name); whole counts as
        integers."""
        tables = [("Phases", self.phases), ("Categories", self.categories)]
        tables += [(GROUPS[g], rows) for g, rows in self.kernels.items() if not rows.empty]
        out = []
        for title, table in tables:
            table = table.copy()
            for column in table:
                if column.endswith(("_kernels", "_instances")):
                    table[column] = _counts(table[column])
            out.append((title, table))
        return out

    def display_tables(self, terminal: bool = False) -> list[tuple[str, pd.DataFrame]]:
        """(title, table) pairs for people: short names, A/B headers, empty groups left out.
        ``terminal``: the phases busiest in A or B and one row for the rest
        (:func:`~profkit.analysis.presentation.terminal_rows`)."""
        unit = "per step" if self.per_step else "total"
        title = f"Phases — kernel launches; GPU ms {unit} (kernels, memcpy, memset)"
        phases = self.phases
        each = phases[phases["phase"] != "total"]  # the total row stays, last
        keep = terminal_rows(each[["a_ms", "b_ms"]].max(axis=1).to_numpy()) if terminal else None
        if keep is not None:
            folded = fold_rest(each, keep, "phase", ("a_kernels", "b_kernels"))
            rest = folded.iloc[-1]
            folded.loc[len(folded) - 1, "delta_pct"] = (
                100.0 * rest["delta_ms"] / rest["a_ms"] if rest["a_ms"] > 0 else np.nan
            )
            phases = pd.concat([folded, phases[phases["phase"] == "total"]], ignore_index=True)
            title += (
                f" (the {TERMINAL_ROWS} with most GPU time; all {len(each):,} phases: "
                "-f md/csv/json or --out)"
            )
        tables = [
            (title, _view(phases)),
            (
                f"Categories — kernel launches; GPU ms {unit} (kernels, memcpy, memset), all phases",
                _view(self.categories),
            ),
        ]
        for group, rows in self.kernels.items():
            if rows.empty:
                continue
            some = f"{len(rows)} of " if len(rows) < self.counts[group] else ""
            title = f"{GROUPS[group]} — {some}{plural(self.counts[group], 'kernel')}, ms {unit}"
            if group in KERNEL_PARTS:
                title += f"; calls and µs/call A→B, Δ ms {KERNEL_PARTS[group]}"
            tables.append((title, _kernel_view(group, rows)))
        return tables


def diff(
    job: Job,
    per_step: bool = True,
    top: int = 10,
    noise_pct: float = NOISE_PCT,
    phase_ranges: PhaseRanges | None = None,
) -> ProfileDiff:
    """Compare two loaded traces (:func:`profkit.traces.job.load` of A and B, side by side),
    B against A, each reported as `profkit kernels` reports it alone (per rank where it
    holds several processes)."""
    from profkit.analysis import kernel_report

    if len(job.files) != 2:
        raise BadInput(f"profkit diff takes two profiles, A and B; got {len(job.files)}")
    a, b = (kernel_report(part, top=0, phase_ranges=phase_ranges) for part in job.parts())
    return diff_reports(a, b, per_step=per_step, top=top, noise_pct=noise_pct)


def diff_reports(
    a: KernelReport,
    b: KernelReport,
    per_step: bool = True,
    top: int = 10,
    noise_pct: float = NOISE_PCT,
) -> ProfileDiff:
    """Phase, category and kernel deltas of B against A; ``top`` kernels per group (0 = all);
    per-call changes within ``noise_pct`` are neither faster nor slower."""
    if top < 0:
        raise BadInput(f"--top must be 0 (all) or more, got {top}")
    if not noise_pct >= 0:  # nan too
        raise BadInput(f"--noise must be >= 0 (a percentage); got {noise_pct:g}")
    for label, report in (("A", a), ("B", b)):
        if not report.activities:
            raise BadInput(
                f"{label} ({report.source.get('path')}) has no GPU activities (a CPU-only "
                "trace?); profkit diff compares GPU time"
            )
    scale = crosscheck.per_step if per_step else lambda phases: phases
    phases = crosscheck.compare_phases([("A", scale(a.phases)), ("B", scale(b.phases))])
    phases = phases.rename(columns=PHASE_COLUMNS)[["phase", *PHASE_COLUMNS.values()]]
    # compare_phases casts kernel counts to integers, but per step they can be fractional
    # (94 optimizer kernels over 5 steps): take them from the scaled tables as they are.
    for side, report in (("a", a), ("b", b)):
        per_phase = scale(report.phases).set_index("phase")["kernels"].astype(float)
        column = phases["phase"].map(per_phase).fillna(0.0)
        phases[f"{side}_kernels"] = column.where(phases["phase"] != "total", per_phase.sum())
    ca, cb = (_scaled(r.categories, r, per_step, ["kernels", "gpu_time_ms"]) for r in (a, b))
    categories = _merge(ca, cb, "category", {"kernels": "kernels", "gpu_time_ms": "ms"})
    kernels = _kernel_groups(a, b, per_step, noise_pct)
    counts = {g: len(rows) for g, rows in kernels.items()}
    kernels.pop("unchanged")
    return ProfileDiff(
        a=_side(a),
        b=_side(b),
        per_step=per_step,
        phases=phases,
        categories=categories[["category", *PHASE_COLUMNS.values()]],
        kernels={g: (rows.head(top) if top else rows) for g, rows in kernels.items()},
        counts=counts,
        notes=_notes(a, b, per_step),
        noise_pct=noise_pct,
    )


def _steps(report: KernelReport) -> int:
    """The most range instances of any phase: the steps the capture holds (0: no phases)."""
    return int(report.phases["instances"].max()) if len(report.phases) else 0


def _scaled(
    table: pd.DataFrame, report: KernelReport, per: bool, columns: list[str]
) -> pd.DataFrame:
    """``table`` (a row per phase and more) with ``columns`` divided by its phase's steps."""
    out = table.copy()
    if per:
        steps = out["phase"].map(report.phases.set_index("phase")["instances"]).fillna(0)
        out[columns] = out[columns].div(steps.where(steps > 0, 1), axis=0)
    return out


def _merge(a: pd.DataFrame, b: pd.DataFrame, key: str, sums: dict[str, str]) -> pd.DataFrame:
    """Per ``key``, the columns of ``sums`` summed on each side (renamed ``a_``/``b_`` + value),
    absent = 0, and B − A of the last (the time); by A + B time, most first."""
    a_sum, b_sum = (
        t.groupby(key, sort=False)[list(sums)].sum().rename(columns=sums) for t in (a, b)
    )
    merged = a_sum.add_prefix("a_").join(b_sum.add_prefix("b_"), how="outer").fillna(0.0)
    time = list(sums.values())[-1]
    ms_a, ms_b = merged[f"a_{time}"], merged[f"b_{time}"]
    merged["delta_ms"] = ms_b - ms_a
    merged["delta_pct"] = 100.0 * merged["delta_ms"] / ms_a.where(ms_a > 0)
    return merged.loc[(ms_a + ms_b).sort_values(ascending=False, kind="stable").index].reset_index()


def _kernel_groups(
    a: KernelReport, b: KernelReport, per: bool, noise_pct: float
) -> dict[str, pd.DataFrame]:
    """Kernels matched by :func:`match_key`, split into appeared, vanished, faster and slower
    per call (beyond ``noise_pct``), fewer and more calls (per call within it), unchanged."""
    tables = [_scaled(r.kernels, r, per, ["instances", "total_ms"]) for r in (a, b)]
    for table in tables:
        table["key"] = table["name"].map(match_key)
    merged = _merge(tables[0], tables[1], "key", {"instances": "instances", "total_ms": "total_ms"})
    # Name and category as A has them, else B; but torch.profiler's spelling of a name
    # makes a poorer short name than Nsight Systems', so an nsys B comes first then.
    named = [t.drop_duplicates("key").set_index("key")[["name", "category"]] for t in tables]
    if a.source.get("format") == "chrome" and b.source.get("format") != "chrome":
        named.reverse()
    names = named[0].combine_first(named[1]).loc[merged["key"]]
    merged["name"], merged["category"] = names["name"].to_numpy(), names["category"].to_numpy()
    merged["short_name"] = merged["name"].map(short_kernel_name)
    for side in "ab":
        count = merged[f"{side}_instances"]
        merged[f"{side}_avg_us"] = 1e3 * merged[f"{side}_total_ms"] / count.where(count > 0)
    a_avg_ms, b_avg_ms = merged["a_avg_us"] / 1e3, merged["b_avg_us"] / 1e3
    merged["avg_delta_pct"] = 100.0 * (b_avg_ms / a_avg_ms - 1.0)
    # delta_ms = (b_n - a_n) * a_avg + b_n * (b_avg - a_avg): more or fewer runs, each run
    # faster or slower. Only where both sides ran it; else the whole delta is the calls'.
    calls = (merged["b_instances"] - merged["a_instances"]) * a_avg_ms
    merged["calls_delta_ms"] = calls.where(a_avg_ms.notna() & b_avg_ms.notna())
    merged["per_call_delta_ms"] = merged["b_instances"] * (b_avg_ms - a_avg_ms)
    merged = merged[KERNEL_COLUMNS]
    in_a, in_b = merged["a_instances"] > 0, merged["b_instances"] > 0
    both, change = in_a & in_b, merged["avg_delta_pct"]
    same_speed = both & (change.abs() <= noise_pct)
    calls_change = merged["b_instances"] - merged["a_instances"]
    picks = {
        "appeared": (~in_a, "b_total_ms", False),
        "vanished": (~in_b, "a_total_ms", False),
        "faster": (both & (change < -noise_pct), "per_call_delta_ms", True),
        "slower": (both & (change > noise_pct), "per_call_delta_ms", False),
        "fewer_calls": (same_speed & (calls_change < 0), "calls_delta_ms", True),
        "more_calls": (same_speed & (calls_change > 0), "calls_delta_ms", False),
        "unchanged": (same_speed & (calls_change == 0), "a_total_ms", False),
    }
    return {
        g: merged[rows].sort_values(by, ascending=up, kind="stable").reset_index(drop=True)
        for g, (rows, by, up) in picks.items()
    }


def _side(report: KernelReport) -> dict[str, Any]:
    source = report.source
    side = {
        "path": source.get("path"),
        "format": source.get("format"),
        "steps": _steps(report),
        "ranks": _ranks(report),
    }
    return side | ({"config": source["config"]} if source.get("config") else {})


def _notes(a: KernelReport, b: KernelReport, per: bool) -> list[str]:
    """How to read the numbers: per step or totals, and what differs between the runs."""
    steps = {"A": _steps(a), "B": _steps(b)}
    if per:
        notes = [
            "Per step: each phase's kernels and GPU time are divided by its range instances, "
            "since two captures rarely hold the same number of steps (--total: the sums)."
        ]
        notes += [
            f"{k} has no phase ranges: its numbers are totals." for k, n in steps.items() if not n
        ]
    else:
        notes = ["Totals over each capture."]
        if steps["A"] != steps["B"]:
            notes.append(
                "A and B hold different numbers of steps: per step compares like with like."
            )
    reading = "its per-step numbers are one rank's step" if per else "its totals add up its ranks"
    for key, report in (("A", a), ("B", b)):
        if _ranks(report) > 1:
            notes.append(
                f"{key} holds {_ranks(report)} ranks, each step counted per rank: {reading}."
            )
    config_a, config_b = a.source.get("config") or {}, b.source.get("config") or {}
    changed = [
        f"{k} {v} → {config_b[k]}"
        for k, v in config_a.items()
        if config_b.get(k, v) != v and not (k == "device" and "auto" in (v, config_b[k]))
    ]  # `auto` is whatever the machine had: not a difference of its own
    if _ranks(a) != _ranks(b):
        changed.insert(0, f"ranks {_ranks(a)} → {_ranks(b)}")
    notes += [f"The runs differ in: {', '.join(changed)}."] if changed else []
    if a.source.get("format") != b.source.get("format"):
        notes.append(
            "Kernel names are matched across the two formats' spellings (Nsight Systems and "
            "torch.profiler demangle them differently)."
        )
    return notes


def _ranks(report: KernelReport) -> int:
    """How many ranks the trace holds (1: one process)."""
    return int(report.source.get("ranks") or 1)


def _kernel_view(group: str, rows: pd.DataFrame) -> pd.DataFrame:
    """A group's kernels for people, narrow enough for 80 columns: one side's calls, time
    per call and ms for those on one side; else calls and time per call as ``A→B`` and the
    part of Δ ms that makes the group (each call's change, or the calls'), the whole Δ last."""
    view = pd.DataFrame({"kernel": rows["short_name"], "category": rows["category"]})
    if group in ("appeared", "vanished"):
        side = "b" if group == "appeared" else "a"
        view[f"{side.upper()} calls"] = _counts(rows[f"{side}_instances"])
        view[f"{side.upper()} µs/call"] = rows[f"{side}_avg_us"]
        view[f"{side.upper()} ms"] = rows[f"{side}_total_ms"]
        return view
    view["calls"] = [
        f"{_count_text(a)}→{_count_text(b)}"
        for a, b in zip(rows["a_instances"], rows["b_instances"], strict=True)
    ]
    view["µs/call"] = [
        f"{a:,.2f}→{b:,.2f}" for a, b in zip(rows["a_avg_us"], rows["b_avg_us"], strict=True)
    ]
    view["Δ %/call"] = rows["avg_delta_pct"]
    by_calls = group in ("fewer_calls", "more_calls")
    view["Δ ms"] = rows["calls_delta_ms" if by_calls else "per_call_delta_ms"]
    view["Δ ms all"] = rows["delta_ms"]
    return view


def _counts(column: pd.Series) -> pd.Series:
    return column.astype("int64") if (column % 1 == 0).all() else column


def _count_text(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows for JSON, a count that is whole (always, in --total; per step when every
    phase ran it as often) as an integer."""
    records = table.to_dict(orient="records")
    for record in records:
        for key, value in record.items():
            if (
                key.endswith(("_kernels", "_instances"))
                and isinstance(value, float)
                and value.is_integer()
            ):
                record[key] = int(value)
    return records


def _view(table: pd.DataFrame) -> pd.DataFrame:
    """Display headers (``A ms``, ``Δ %``); whole counts as integers."""
    view = table.copy()
    for column in view:
        if column.endswith(("_kernels", "_instances")) and (view[column] % 1 == 0).all():
            view[column] = view[column].astype("int64")
    return view.rename(columns=HEADERS)
