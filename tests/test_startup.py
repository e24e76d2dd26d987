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


HEAVY = ("pandas", "numpy", "pyarrow", "torch", "matplotlib")

# Every command's --help, rendered in a fresh interpreter; then what it imported. The paths
# come from the Typer app itself (groups recursively), so a new command is covered at once.
_HELP_IMPORTS = """
import json, sys
from typer.main import get_command
from typer.testing import CliRunner
from profkit.cli import app

def paths(cmd, prefix):
    yield prefix
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from paths(sub, [*prefix, name])

runner = CliRunner()
done = []
for path in paths(get_command(app), []):
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, (path, result.output, result.exception)
    assert "Usage" in result.output, (path, result.output)
    done.append(" ".join(path))
print(json.dumps({"helps": done, "heavy": [m for m in HEAVY if m in sys.modules]}))
"""


def test_help_imports_no_pandas_numpy_pyarrow_torch() -> None:
    """`profkit --help` and every `profkit COMMAND --help` answer without pandas, numpy,
    pyarrow, torch or matplotlib (issue 27: the help took 2.4 s of pandas before)."""
    import json

    code = f"HEAVY = {HEAVY!r}\n{_HELP_IMPORTS}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"", "kernels", "memory", "memory plot", "cache clear", "torch"} <= set(found["helps"])
    assert found["heavy"] == []


def test_python_m_profkit_help_imports_no_pandas() -> None:
    """The real entry point too (``python -m profkit --help``, through ``__main__``)."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['profkit', 'kernels', '--help']\n"
        "try:\n"
        "    runpy.run_module('profkit', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_diff_noise_default_is_the_analysis_default() -> None:
    """`profkit diff --noise` declares its default without importing the analysis."""
    from profkit.analysis.diff import NOISE_PCT
    from profkit.cli import diff

    assert diff.NOISE_PCT == NOISE_PCT
