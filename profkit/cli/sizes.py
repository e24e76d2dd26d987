"""``profkit sizes``: the model sizes with their shapes and parameter counts."""

from __future__ import annotations

from profkit.cli._common import FormatOpt, OutOpt, command
from profkit.cli.app import app
from profkit.cli.render import emit_tables
from profkit.workload import specs


@command(app)
def sizes(fmt: FormatOpt = "table", out: OutOpt = None) -> None:
    """Model sizes: d_model, d_ff, layers, heads and parameter counts (no weights allocated)."""
    import pandas as pd  # here, not at the top: `--help` does not import it (test_startup)

    rows = specs.sizes()
    table = pd.DataFrame(rows)  # one name per quantity: the JSON's, non_embedding_params
    emit_tables([("Model sizes", table)], fmt, out, json_value=rows)
