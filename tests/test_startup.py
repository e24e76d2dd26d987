"""The CLI starts without importing torch: reading traces and DBs should not pay ~1 s for it."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_cli_does_not_import_torch() -> None:
    code = "import sys, profkit, profkit.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_phase_helper_is_still_one_attribute_away() -> None:
    code = "import profkit; print(profkit.phase('x').name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "x"


def test_every_db_option_honours_profkit_db() -> None:
    """Users (and the test session) can point every command at one results DB."""
    from typer.main import get_command

    from profkit.cli import app

    group = get_command(app)
    seen = []
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        subcommands = getattr(cmd, "commands", {name: cmd})
        for sub in subcommands.values():
            for param in sub.params:
                if "--db" in getattr(param, "opts", []):
                    seen.append(sub.name)
                    assert param.envvar == "PROFKIT_DB", sub.name
    assert {"bench", "attention", "compare", "report"} <= set(seen)
