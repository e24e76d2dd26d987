"""``profkit sizes``: the model sizes with their shapes and parameter counts."""

from __future__ import annotations

import pandas as pd

from profkit import specs
from profkit.cli import app
from profkit.cli._common import FormatOpt, OutOpt, command
from profkit.render import emit_tables


@command(app)
def sizes(fmt: FormatOpt = "table", out: OutOpt = None) -> None:
    """Model sizes: d_model, d_ff, layers, heads and parameter counts (no weights allocated)."""
    rows = specs.sizes()
    table = pd.DataFrame(rows).rename(columns={"non_embedding_params": "params w/o LM head"})
    emit_tables([("Model sizes", table)], fmt, out, json_value=rows)
