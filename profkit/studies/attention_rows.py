"""The ``attention`` table of the results DB: its columns, and reading it back checked.

``profkit attention`` commits one row per cell (:func:`profkit.studies.attention.new_row`
gives its shape); ``attention --resume`` and ``profkit report`` read them back through
:func:`load`, the one schema check of this table. No torch here: the report reads rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from profkit.run import results

TABLE = "attention"

# What a row cannot do without: which cell of which grid it is, and how it ended.
REQUIRED = (
    "impl", "compile", "dtype", "d_head", "seq", "batch", "causal", "iters", "warmup",
    "device", "status",
)  # fmt: skip
_BYTES = (
    "memory_before_backward", "peak_memory", "inputs", "saved", "mask", "expected", "saved_measured",
)  # fmt: skip
COLUMN_TYPES: dict[str, type] = {
    **{name: str for name in ("impl", "dtype", "device", "device_name", "status", "error")},
    **{name: str for name in ("stage", "sdpa_backend")},
    **{name: bool for name in ("compile", "causal")},
    **{name: int for name in ("d_head", "seq", "batch", "iters", "warmup", "threads", "pid")},
    **{
        f"{phase}_ms{suffix}": float for phase in ("forward", "backward") for suffix in ("", "_std")
    },
    **{f"{name}_bytes": int for name in _BYTES},
    "wall_s": float,
}
"""Every column :func:`~profkit.studies.attention.new_row` writes, with the type it holds."""


def load(db_path: Path | str) -> list[dict[str, Any]]:
    """Every attention row in the results DB, oldest first, with the columns of
    :data:`COLUMN_TYPES` typed (``compile`` and ``causal`` as bools).

    Raises :class:`~profkit.errors.BadInput` when the table is not one profkit wrote; cells
    of the wrong type read as null and rows without their cell are left out, said in one
    warning (:func:`profkit.run.results.checked_rows`).
    """
    return results.checked_rows(
        db_path, TABLE, REQUIRED, lambda row, bad: results.typed_cells(row, COLUMN_TYPES, bad)
    )
