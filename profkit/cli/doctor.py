"""``profkit doctor``: what this machine has and which commands can run here."""

from __future__ import annotations

from profkit.cli._common import FormatOpt, OutOpt, command
from profkit.cli.app import app
from profkit.cli.render import emit_tables


@command(app)
def doctor(fmt: FormatOpt = "table", out: OutOpt = None) -> None:
    """Check torch, CUDA, the GPU, nsys, nvtx and packages; list what each command needs."""
    # Imported here, not at the top: `--help` must not import pandas (tests/test_startup.py).
    import pandas as pd

    from profkit.formats import check_format
    from profkit.run import doctor as doctor_lib

    check_format(fmt)
    found = doctor_lib.doctor()
    components = pd.DataFrame(found["components"]).assign(
        found=lambda df: df["found"].map({True: "yes", False: "no"})
    )
    commands = pd.DataFrame(found["commands"])
    emit_tables(
        [("This machine", components), ("What runs here", commands)],
        fmt,
        out,
        json_value=found,
    )
