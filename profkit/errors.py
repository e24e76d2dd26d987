"""User-facing errors.

Library code raises :class:`ProfkitError` (or a subclass) for anything the user can
fix: a bad option, a missing or wrong-kind file, a missing tool, no CUDA. The CLI
turns it into one line on stderr and exit status 2, in one place.

What is odd but not fatal (a broken sidecar, activities a reader had to drop) is said with
:func:`warn`: a :class:`ProfkitWarning` that the CLI prints as one ``warning:`` line on
stderr, and that library callers can filter or turn into errors like any Python warning.
"""

import warnings

DASK_INSTALL = "pip install 'profkit[dask]'"
"""How to add the optional Dask extra that ``--workers`` and ``--scheduler`` run on."""


class ProfkitError(Exception):
    """An error the user can act on; its message is the whole story (one line)."""


class BadInput(ProfkitError):
    """A file or value that is not what it should be."""


class MissingTool(ProfkitError):
    """A program or device the command needs is not available here."""


class ProfkitWarning(UserWarning):
    """Something about an input the user should know; the work goes on."""


def warn(message: str) -> None:
    """Say ``message`` (one line) as a :class:`ProfkitWarning`."""
    warnings.warn(ProfkitWarning(message), stacklevel=2)
