"""Tables of the attention grid: one row per cell, and variants side by side.

Memory is shown in MiB (1024² bytes). Options that hold one value over the whole grid
(impl, compile, dtype) move into the title instead of repeating in every row.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

MIB = 1024**2
VARIANT_KEYS = ("impl", "compile", "dtype")


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


def variant_label(row: dict[str, Any], keys: tuple[str, ...]) -> str:
    """The parts of a row's variant that differ across the grid (``compiled``, ``sdpa bf16``)."""
    parts = []
    for key in keys:
        value = row[key]
        parts.append(("compiled" if value else "eager") if key == "compile" else str(value))
    return " ".join(parts)


def _varying(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(k for k in VARIANT_KEYS if len({r[k] for r in rows}) > 1)


def title(rows: list[dict[str, Any]]) -> str:
    """``Attention: naive eager fp32, batch 8, NVIDIA H100 80GB HBM3`` (fixed parts only)."""
    first = rows[0]
    fixed = [k for k in VARIANT_KEYS if k not in _varying(rows)]
    parts = [variant_label(first, tuple(fixed))] if fixed else []
    parts.append(f"batch {first['batch']}")
    if first["causal"]:
        parts.append("causal")
    parts.append(f"{first['iters']} timed passes")
    parts.append(first["device_name"] or first["device"])
    if first.get("device") == "cpu" and first.get("threads"):
        parts.append(f"{first['threads']} thread{'s' if first['threads'] != 1 else ''}")
    return "Attention: " + ", ".join(p for p in parts if p)


def progress_line(done: int, total: int, row: dict[str, Any]) -> str:
    """``[3/12] naive eager fp32 d_head 16 seq 1,024  ok  fwd 0.41 ms  bwd 1.20 ms``."""
    label = (
        f"{row['impl']} {'compiled' if row['compile'] else 'eager'} {row['dtype']} "
        f"d_head {row['d_head']} seq {row['seq']:,}"
    )
    head = f"[{done}/{total}] {label:<40}"
    if row["status"] == "ok":
        return f"{head} ok   fwd {row['forward_ms']:,.2f} ms  bwd {row['backward_ms']:,.2f} ms"
    return f"{head} {row['status']}  {row.get('error') or ''}".rstrip()


def cells_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per cell: times (mean ± std over the timed passes) and memory beside the count."""
    varying = _varying(rows)
    records = []
    for r in rows:
        record: dict[str, Any] = {}
        if varying:
            record["variant"] = variant_label(r, varying)
        record.update(
            {
                "d_head": r["d_head"],
                "seq": r["seq"],
                "status": r["status"],
                "fwd ms": r["forward_ms"],
                "fwd ±": r["forward_ms_std"],
                "bwd ms": r["backward_ms"],
                "bwd ±": r["backward_ms_std"],
                "before bwd MiB": _mib(r["memory_before_backward_bytes"]),
                "expected MiB": _mib(r["expected_bytes"]),
                "saved MiB": _mib(r["saved_bytes"]),
                "saved (hooks) MiB": _mib(r["saved_measured_bytes"]),
                "peak MiB": _mib(r["peak_memory_bytes"]),
            }
        )
        if r["sdpa_backend"] is not None or r["impl"] == "sdpa":
            record["backend"] = r["sdpa_backend"]
        records.append(record)
    table = pd.DataFrame(records)
    # Columns nothing in this grid measured (CUDA memory on a CPU, say) are noise.
    empty = [c for c in table.columns if table[c].isna().all() and c != "status"]
    return table.drop(columns=empty)


def side_by_side(rows: list[dict[str, Any]]) -> pd.DataFrame | None:
    """Per shape, each variant's forward and backward ms; with two variants, the ratio.

    ``speed-up`` is the first variant's time over the second's (2.0: the second is twice
    as fast). A cell that did not finish shows its status instead of a time.
    """
    varying = _varying(rows)
    if not varying:
        return None
    labels = list(dict.fromkeys(variant_label(r, varying) for r in rows))
    by_shape: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_shape.setdefault((r["d_head"], r["seq"]), {})[variant_label(r, varying)] = r
    records = []
    for (d_head, seq), variants in by_shape.items():
        record: dict[str, Any] = {"d_head": d_head, "seq": seq}
        for phase, key in (("fwd", "forward_ms"), ("bwd", "backward_ms")):
            for label in labels:
                record[f"{phase} ms {label}"] = _time_or_status(variants.get(label), key)
            if len(labels) == 2:
                a, b = (record[f"{phase} ms {label}"] for label in labels)
                ok = isinstance(a, float) and isinstance(b, float) and b > 0
                record[f"{phase} speed-up"] = a / b if ok else None
        records.append(record)
    return pd.DataFrame(records)


def tables(rows: list[dict[str, Any]]) -> list[tuple[str, pd.DataFrame]]:
    """The titled tables of a grid: every cell, then the variants side by side if several."""
    found = [(title(rows), cells_table(rows))]
    pairs = side_by_side(rows)
    if pairs is not None:
        found.append(("Side by side", pairs))
    return found


def _time_or_status(row: dict[str, Any] | None, key: str) -> float | str | None:
    if row is None:
        return None
    value = row[key]
    return float(value) if value is not None else row["status"]


def failures(rows: list[dict[str, Any]]) -> list[str]:
    """One line per cell that did not finish: what failed and where."""
    varying = _varying(rows)
    lines = []
    for r in rows:
        if r["status"] not in ("ok", "interrupted"):
            variant = f"{variant_label(r, varying)} " if varying else ""
            lines.append(
                f"{variant}d_head {r['d_head']} seq {r['seq']}: {r['status']}: {r['error']}"
            )
    return lines
