"""``profkit cache``: what the columnar trace cache holds, and emptying it."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from profkit.cli._common import FormatOpt, PlainGroup, command
from profkit.cli.app import app
from profkit.cli.render import emit_tables, err_console
from profkit.traces import cache_size

# profkit.traces.cache (numpy) is imported by each command, not here: `--help` does not
# import numpy or pandas (tests/test_startup.py).

cache_app = typer.Typer(
    cls=PlainGroup,
    help="The trace cache (~/.cache/profkit, or PROFKIT_CACHE_DIR): show it, or clear it.",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(cache_app, name="cache")


@cache_app.callback()
def _default(ctx: typer.Context, fmt: FormatOpt = "table") -> None:
    """What the cache holds (the default): each trace, its size and when it was last used."""
    if ctx.invoked_subcommand is None:
        info(fmt)


@command(cache_app, name="info")
def info(fmt: FormatOpt = "table") -> None:
    """Each cached trace, its size and when it was last used; the total against the cap."""
    from profkit.traces import cache as cache_lib

    held = cache_size.entries(cache_lib.entries_dir(), cache_lib.INDEX)
    cap = cache_size.max_bytes()
    total = sum(e.size_bytes for e in held)
    rows = [
        {
            "trace": e.trace,
            "size_mib": e.size_bytes / (1 << 20),
            "used_at": time.strftime("%Y-%m-%d %H:%M", time.localtime(e.used_at)),
        }
        for e in held
    ]
    import pandas as pd

    cap_text = f"{cap / (1 << 20):,.1f} MiB ({cache_size.ENV_MAX})" if cap else "none"
    title = (
        f"Trace cache {cache_lib.cache_dir()}: {len(held)} trace(s), "
        f"{total / (1 << 20):,.1f} MiB; cap {cap_text}; least recently used go first"
    )
    value = {
        "dir": str(cache_lib.cache_dir()),
        "entries": len(held),
        "size_bytes": total,
        "max_bytes": cap,
        "traces": [
            {"trace": e.trace, "size_bytes": e.size_bytes, "used_at": e.used_at} for e in held
        ],
    }
    frame = pd.DataFrame(rows, columns=["trace", "size_mib", "used_at"])
    if not held and fmt == "table":
        err_console.print(f"the trace cache at {cache_lib.cache_dir()} is empty", highlight=False)
        return
    emit_tables([(title, frame)], fmt, json_value=value)


@command(cache_app, name="clear")
def clear(
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Remove every cached trace (the traces themselves are untouched; the next read of
    each takes its full time once)."""
    from profkit.traces import cache as cache_lib

    held = cache_size.entries(cache_lib.entries_dir(), cache_lib.INDEX)
    if not held:
        err_console.print(f"the cache at {cache_lib.cache_dir()} is empty", highlight=False)
        return
    total = sum(e.size_bytes for e in held) / (1 << 20)
    if not yes and not typer.confirm(
        f"remove {len(held)} cached trace(s), {total:,.1f} MiB?", err=True
    ):
        raise typer.Exit(1)
    removed = cache_size.clear(cache_lib.entries_dir(), cache_lib.INDEX)
    err_console.print(
        f"removed {len(removed)} cached trace(s), "
        f"{sum(e.size_bytes for e in removed) / (1 << 20):,.1f} MiB",
        highlight=False,
    )
