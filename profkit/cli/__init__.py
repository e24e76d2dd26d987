"""The ``profkit`` command line: thin Typer commands that call one library function each.

``app`` (the Typer application) lives in :mod:`profkit.cli.app`; each command lives in its
own module and registers itself on it; importing them here builds the whole CLI. Only this
package renders (``render``: consoles, rich tables, the one ``progress_bar``) and turns
library errors into one line and exit status 2 (``_common.command``). Options that several
commands share are declared once in ``_common``: the workload options by
``@workload_options()``, which hands a command one ``WorkloadOptions``.
"""

from __future__ import annotations

from profkit.cli import (  # noqa: F401  (importing a command module registers it)
    attention,
    bench,
    cache,
    compare,
    demo,
    diff,
    doctor,
    kernels,
    memory,
    nsys,
    precision,
    report,
    sizes,
)
from profkit.cli import torch as _torch  # noqa: F401  (the module name shadows torch)
from profkit.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    from profkit.run import teardown
    from profkit.run.proc import install_terminate_as_interrupt

    install_terminate_as_interrupt()  # `kill PID` ends a sweep as Ctrl-C does, nothing lost
    try:
        app()
    except SystemExit as exc:  # how the app always ends (OneLineErrors.main)
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        teardown.leave(status)  # after torch.profiler on CUDA: no interpreter teardown
        raise
