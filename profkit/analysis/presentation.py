"""A :class:`KernelReport` as titled display tables and as a markdown report; a
:class:`RankedReport`'s rank tables besides.

The report's DataFrames keep fractions and full names (for JSON and code); these views
show percentages, short kernel names and a category x phase pivot, for people.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profkit.analysis.findings import findings_markdown
from profkit.analysis.report_types import KernelReport, RankedReport
from profkit.analysis.tables import ALL_PHASES
from profkit.formats import markdown_table
from profkit.workload.config import RUN_FIELDS
from profkit.workload.names import FINAL, SCORES, SOFTMAX

SHARE = "share %"  # a share (JSON and CSV: `share`, a fraction) as people read it
KERNEL_VIEW = [
    "short_name", "category", SHARE, "total_ms", "instances",
    "avg_us", "med_us", "min_us", "max_us", "std_us", "grid", "block",
]  # fmt: skip


def display_tables(
    report: KernelReport, as_data: bool = False, terminal: bool = False
) -> list[tuple[str, pd.DataFrame]]:
    """Phases, top kernels overall and per phase, ranges, categories: (title, table) pairs.

    ``as_data`` (``--format csv``): each top-kernels table also carries its ``phase``
    (``all`` for all phases) and each kernel's full ``name``, which the shortened names of
    a display may not tell apart, and shares are ``share`` fractions as in the JSON (people
    read ``share %``). ``terminal``: for a person at a terminal, the phase and range tables
    keep their :data:`TERMINAL_ROWS` rows with most GPU time and one row for the rest, and
    the category table the busiest phases' columns (:func:`_busiest`).
    """
    top = f"Top {report.top} by GPU time" if report.top else "All by GPU time"
    top += " (kernels, memcpy, memset)"
    ranges = _range_view(report)
    if terminal:
        ranges = _busiest(ranges, "range")
    if not report.activities:
        # A CPU-only trace: the ranges' CPU times are all there is; empty kernel tables
        # would only hide that (the report's notes say why there are no kernels).
        tables = [("Phases — no GPU activities in this trace", report.phases)]
        if len(report.ranges):
            tables.append(("Ranges", ranges))
        return tables
    phase_table = report.phases if as_data else _percent(report.phases, "share")
    title = f"Phases{_inferred(report)} — {counts_sentence(report.totals)}"
    if terminal:
        phase_table = _busiest(phase_table, "phase")
        if len(phase_table) < len(report.phases):
            title += _all_of(report.phases, "phases")
    tables = [
        (title, phase_table),
        (f"{top}, {_scope(report)}", _kernel_view(report.top_kernels(), as_data and ALL_PHASES)),
    ]
    phases = [p for p in report.phases["phase"] if p != ALL_PHASES]
    if len(phases) > 1:
        tables += _phase_tables(report, phases, top, as_data)
    if len(report.ranges):
        tables.append(
            (
                RANGES_TITLE
                + (_all_of(report.ranges, "ranges") if len(ranges) < len(report.ranges) else ""),
                ranges,
            )
        )
    shown = _busiest_phases(report) if terminal else None
    pivot = category_pivot(report, shown)
    if as_data:
        pivot = pivot.assign(**{SHARE: pivot[SHARE] / 100}).rename(columns={SHARE: "share"})
    tables.append(("GPU time by category (ms, kernels, memcpy and memset)", pivot))
    return tables


TERMINAL_ROWS = 20
"""Phase and range rows a person is shown at most in the terminal: those with most GPU
time, in their order, then one row that sums the rest (``1,982 more phases``). Markdown,
csv and json keep every row. A trace whose every step names its own phase has thousands,
which no one reads and which took a terminal longer to draw than the trace to read."""
SUMMED = ("instances", "kernels", "memcpy", "memset", "share", SHARE)
"""The columns, besides every ``*_ms`` one, that the row of the rest sums."""


def _busiest(table: pd.DataFrame, key: str) -> pd.DataFrame:
    """``table``'s :data:`TERMINAL_ROWS` rows with most GPU time, in their order, and one
    row for the rest (:func:`fold_rest`); ``table`` itself when that would hide at most one
    row."""
    keep = terminal_rows(table["gpu_time_ms"].to_numpy())
    return table if keep is None else fold_rest(table, keep, key)


def terminal_rows(time_ms: np.ndarray) -> np.ndarray | None:
    """Which rows a terminal shows: the :data:`TERMINAL_ROWS` with most ``time_ms``, or
    None for all of them (when the rest would be one row or none)."""
    if len(time_ms) <= TERMINAL_ROWS + 1:
        return None
    order = np.argsort(-time_ms, kind="stable")
    keep = np.zeros(len(time_ms), dtype=bool)
    keep[order[:TERMINAL_ROWS]] = True
    return keep


def fold_rest(
    table: pd.DataFrame, keep: np.ndarray, key: str, summed: tuple[str, ...] = SUMMED
) -> pd.DataFrame:
    """The rows where ``keep``, then one ``N more {key}s`` row of the others' ``summed``
    columns and ``*_ms`` times summed (none when there are no others)."""
    rest = table[~keep]
    if rest.empty:
        return table
    sums = {c: rest[c].sum() for c in table.columns if c in summed or c.endswith("_ms")}
    more = pd.DataFrame([{key: f"{len(rest):,} more {key}s", **sums}], columns=table.columns)
    return pd.concat([table[keep], more], ignore_index=True)


def _all_of(table: pd.DataFrame, what: str) -> str:
    """The title's note on a cut table: where every row is."""
    return f" (the {TERMINAL_ROWS} with most GPU time; all {len(table):,} {what}: -f md/csv/json or --out)"


TERMINAL_PHASE_COLUMNS = 6
"""Phase columns of the category table a person is shown at most (those with most GPU
time), beside one column for the rest: each is a dozen characters wide."""


def _busiest_phases(report: KernelReport) -> list[str] | None:
    """The phases a terminal shows in columns (the :data:`TERMINAL_PHASE_COLUMNS` with most
    GPU time, in their order), or None for all of them."""
    phases = report.phases
    if len(phases) <= TERMINAL_PHASE_COLUMNS + 1:
        return None
    busiest = phases.nlargest(TERMINAL_PHASE_COLUMNS, "gpu_time_ms", keep="first")["phase"]
    return [p for p in phases["phase"] if p in set(busiest)]


MAX_PHASE_TABLES = 12
"""Per-phase top-kernel tables a person is shown at most (the phases with the most GPU
time); csv and json keep every phase. A trace whose every step names its own phase would
otherwise print thousands of tables, and take time per name rather than per activity."""


def _phase_tables(
    report: KernelReport, phases: list[str], top: str, as_data: bool
) -> list[tuple[str, pd.DataFrame]]:
    """Each phase's top kernels, cut from one view of every phase's rows (one pass, not one
    per phase); for people only the :data:`MAX_PHASE_TABLES` phases with most GPU time,
    and a line saying how to see the others."""
    rows = (
        report.kernels.groupby("phase", sort=False).head(report.top)
        if report.top
        else report.kernels
    )
    view = _kernel_view(rows, ALL_PHASES if as_data else False)
    if as_data:
        view["phase"] = rows["phase"].to_numpy()
    shown = phases
    if not as_data and len(phases) > MAX_PHASE_TABLES:
        by_time = report.phases.set_index("phase")["gpu_time_ms"]
        busiest = set(by_time.loc[phases].nlargest(MAX_PHASE_TABLES).index)
        shown = [p for p in phases if p in busiest]
    of_phase = rows["phase"].to_numpy()
    tables = []
    for phase in shown:
        part = view[of_phase == phase].reset_index(drop=True)
        tables.append((f"{top} in {phase}{_inferred(report)}", part))
    if len(shown) < len(phases):
        left = len(phases) - len(shown)
        note = pd.DataFrame({"phases not shown": [
            f"{left:,} more phases with less GPU time: --phase NAME shows one, "
            "--format csv or json has them all"
        ]})  # fmt: skip
        tables.append((f"{left:,} more phases", note))
    return tables


def _scope(report: KernelReport) -> str:
    """What the report covers: every phase, or the one --phase / --range chose."""
    chosen = report.source.get("phase")
    if chosen:
        return f"phase {chosen}"
    if report.source.get("range"):
        return f"range {report.source['range']!r}"
    return "all phases"


RANGES_TITLE = (
    "Ranges (what each encloses: kernels, memcpy, memset; kernel_time_ms the kernels', "
    "gpu_time_ms all of them)"
)


def counts_sentence(totals: dict[str, Any]) -> str:
    """``3,858 kernels, 98 memcpy, 72 memset: 37.52 ms of GPU time, 37.28 ms in kernels``."""
    counts = (
        f"{totals['kernels']:,} kernels, {totals['memcpy']:,} memcpy, {totals['memset']:,} memset"
    )
    if totals.get("graphs"):
        counts += f", {totals['graphs']:,} CUDA graphs"
    return (
        f"{counts}: {totals['gpu_time_ms']:,.2f} ms of GPU time, "
        f"{totals['kernel_time_ms']:,.2f} ms in kernels"
    )


def _inferred(report: KernelReport) -> str:
    """`` (inferred)`` after a phase title when the trace's phase ranges did not say it."""
    source = report.source.get("phase_source")
    if source == "inferred":
        return " (inferred)"
    return " (inferred in steps without phase ranges)" if source == "mixed" else ""


def category_pivot(report: KernelReport, shown: list[str] | None = None) -> pd.DataFrame:
    """Categories down, phases across, GPU milliseconds in the cells, then total and %.
    ``shown``: only these phases' columns, the others' summed in one ``more_phases_ms``."""
    table = report.categories
    if table.empty:
        return pd.DataFrame({"category": [], "total_ms": [], SHARE: []})
    phases = list(dict.fromkeys(table["phase"]))
    pivot = table.pivot_table(
        index="category", columns="phase", values="gpu_time_ms", aggfunc="sum", fill_value=0.0
    )[phases]
    total_ms = pivot.sum(axis=1)
    if shown is not None:
        kept = [p for p in phases if p in set(shown)]
        rest = pivot.drop(columns=kept).sum(axis=1)
        pivot = pivot[kept].copy()
        pivot.columns = [f"{p}_ms" for p in kept]
        pivot[f"{len(phases) - len(kept):,} more phases_ms"] = rest
    else:
        pivot.columns = [f"{p}_ms" for p in phases]
    pivot["total_ms"] = total_ms
    total = pivot["total_ms"].sum()
    pivot[SHARE] = 100 * pivot["total_ms"] / total if total else 0.0
    return pivot.sort_values("total_ms", ascending=False).reset_index()


def kernel_report_markdown(report: KernelReport, title: str) -> str:
    """The whole report as markdown (for ``reports/NAME.md``); a multi-rank trace's ends
    with its rank tables (:func:`ranks_markdown`)."""
    lines = [f"# {title}", "", _source_line(report), ""]
    lines += [findings_markdown(report.findings)] if report.findings is not None else []
    lines += [
        f"GPU activities: {counts_sentence(report.totals)} (durations summed, so streams "
        "that overlap count twice).",
        "",
    ]
    tables = display_tables(report)
    _, phases = tables[0]
    lines += [f"## Phases{_inferred(report)}", "", markdown_table(phases), ""]
    if "python_ms" in phases:
        lines += [
            "`cpu_time_ms` is the wall time of the phase's NVTX ranges, `python_ms` the run's "
            "own synchronized timing of the phase, both summed over the captured steps; "
            "`gpu_time_ms` sums the durations of the kernels, copies and memsets attributed "
            "to the phase, `kernel_time_ms` of its kernels alone.",
            "",
        ]
    lines += [f"- {note}" for note in report.notes]
    lines += [""] if report.notes else []
    for title_, table in tables[1:]:
        lines += [f"## {title_}", "", markdown_table(table), ""]
        if title_.startswith("Ranges"):
            sentence = attention_sentence(report.ranges)
            lines += [sentence, ""] if sentence else []
    text = "\n".join(lines).rstrip() + "\n"
    return text + ranks_markdown(report) if isinstance(report, RankedReport) else text


def attention_sentence(ranges: pd.DataFrame) -> str | None:
    """Matmul vs softmax inside attention: analytic FLOPs beside measured GPU time."""
    if "mflop" not in ranges:
        return None
    rows = ranges.set_index("range")
    if not {SCORES, SOFTMAX, FINAL} <= set(rows.index):
        return None
    matmul_mflop = rows.at[SCORES, "mflop"] + rows.at[FINAL, "mflop"]
    matmul_ms = rows.at[SCORES, "gpu_time_ms"] + rows.at[FINAL, "gpu_time_ms"]
    softmax_mflop, softmax_ms = rows.at[SOFTMAX, "mflop"], rows.at[SOFTMAX, "gpu_time_ms"]
    if not softmax_ms or not softmax_mflop:
        return None
    return (
        f"Per attention call (forward), the scores and final matmuls do {matmul_mflop:,.1f} "
        f"MFLOP and the softmax {softmax_mflop:,.2f} MFLOP ({matmul_mflop / softmax_mflop:.1f}× "
        f"the FLOPs), yet they take only {matmul_ms / softmax_ms:.1f}× its GPU time "
        f"({matmul_ms:.3f} ms vs {softmax_ms:.3f} ms over all calls): the softmax is bound by "
        "memory traffic (it reads and writes the whole score matrix), not by FLOPs."
    )


def _source_line(report: KernelReport) -> str:
    source = report.source
    facts = [
        f"{source.get('tool', '')} {source.get('tool_version', '')}".strip(),
        source.get("gpu") or "",
    ]
    line = f"Source: `{source.get('path')}`" + (
        f" ({', '.join(f for f in facts if f)})" if any(facts) else ""
    )
    config: dict[str, Any] | None = source.get("config")
    if config:
        shown = {key: config.get(key) for key in RUN_FIELDS}
        if (shown.get("nproc") or 1) == 1:  # one process is not data parallel
            shown.pop("parallel", None)
        run = ", ".join(
            f"{key} {_said(value)}" for key, value in shown.items() if value is not None
        )
        line += f". Run: {run}."
    filters = [f"{k} `{source[k]}`" for k in ("phase", "range") if source.get(k)]
    if filters:
        line += f" Only activities in {' and '.join(filters)}."
    return line


def _said(value: Any) -> Any:
    """A config value as a sentence says it (``compile no``, not ``compile False``)."""
    return ("yes" if value else "no") if isinstance(value, bool) else value


def _percent(table: pd.DataFrame, column: str) -> pd.DataFrame:
    view = table.copy()
    view.insert(list(view.columns).index(column), SHARE, 100 * view[column])
    return view.drop(columns=[column])


def _kernel_view(table: pd.DataFrame, phase: str | bool = False) -> pd.DataFrame:
    """The displayed columns; given a ``phase``, that phase and the full names besides."""
    view = _percent(table, "share")[KERNEL_VIEW]
    if not phase:
        return view
    data = [*KERNEL_VIEW[:2], "share", *KERNEL_VIEW[3:]]
    view = view.assign(share=table["share"].to_numpy(), name=table["name"].to_numpy())
    return view.assign(phase=phase)[["phase", *data, "name"]]


def _range_view(report: KernelReport) -> pd.DataFrame:
    view = report.ranges.drop(columns=["domain"])
    return view


def rank_tables(report: RankedReport, terminal: bool = False) -> list[tuple[str, pd.DataFrame]]:
    """Display tables of the ranks: one row per rank, collectives, phases, steps.
    ``terminal``: each rank's phases are those the job's phase table shows (
    :func:`_busiest`), then one row for the rest."""
    rows, collectives, phases = [], [], []
    keep = terminal_rows(report.phases["gpu_time_ms"].to_numpy()) if terminal else None
    shown = None if keep is None else set(report.phases["phase"][keep])
    # The host only where ranks span several (several nodes' reports): else one value.
    several_hosts = len({entry.info.get("host") for entry in report.ranks}) > 1
    keys = ("rank", "host", "device", "pid") if several_hosts else ("rank", "device", "pid")
    for entry in report.ranks:
        who = {key: entry.info.get(key) for key in keys}
        comm = entry.comm
        rows.append(
            {
                **who,
                **entry.totals,
                "nccl_kernels": comm.kernels,
                "nccl_ms": comm.time_ms,
                "overlapped_ms": comm.overlapped_ms,
                "exposed_ms": comm.exposed_ms,
            }
        )
        collectives += [{"rank": who["rank"], **c} for c in comm.by_collective]
        table = entry.report.phases[["phase", "kernels", "gpu_time_ms"]]
        if shown is not None:
            table = fold_rest(table, table["phase"].isin(shown).to_numpy(), "phase")
        phases += [{"rank": who["rank"], **r} for r in table.to_dict(orient="records")]
    tables = [(f"Ranks — world size {report.world_size}", pd.DataFrame(rows))]
    if report.nodes:
        tables.append((NODES_TITLE, node_table(report)))
    if collectives:
        tables.append(("NCCL kernels by collective, per rank", pd.DataFrame(collectives)))
    tables.append(("Phases per rank", pd.DataFrame(phases)))
    if not report.steps.empty:
        title = "Steps across ranks — GPU span of each step; NCCL time waiting for the last rank"
        tables.append((title, report.steps))
    return tables


NODES_TITLE = "Nodes — each report's clock against the first's"


def node_table(report: RankedReport) -> pd.DataFrame:
    """One row per node: its file, host, ranks and how its clock was aligned."""
    rows = []
    for node in report.nodes:
        ranks = node["ranks"]
        rows.append(
            {
                "node": node["path"],
                "host": node["host"],
                "ranks": f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0]),
                "session_start_ms": node["base_ms"],
                "clock_offset_us": _us(node["offset_ms"]),
                "spread_us": _us(node["spread_ms"]),
                "paired": node["pairs"],
                "agreeing": node["agreeing"],
                "offset_taken_out": _taken_out(node),
            }
        )
    return pd.DataFrame(rows)


def _taken_out(node: dict[str, Any]) -> str:
    if node["applied"]:
        return "yes"
    return "no (ambiguous)" if node["ambiguous"] else "no"


def _us(ms: float | None) -> float | None:
    return None if ms is None else ms * 1000


def ranks_markdown(report: RankedReport) -> str:
    """The rank tables as markdown sections (appended to the kernel report)."""
    return "".join(
        f"\n## {title}\n\n{markdown_table(table, 2)}\n" for title, table in rank_tables(report)
    )
