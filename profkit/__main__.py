"""``python -m profkit`` and the ``profkit`` command: the CLI, after a fast path.

``profkit --version`` answers before the CLI is imported (Typer, rich and the commands'
options: a few tenths of a second), so a script asking for the version does not wait for
them. The commands import pandas, numpy and pyarrow only when they run, not for ``--help``.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from profkit import __version__

        print(f"profkit {__version__}")
        return
    from profkit.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
