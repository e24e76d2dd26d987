"""User-facing errors.

Library code raises :class:`ProfkitError` (or a subclass) for anything the user can
fix: a bad option, a missing or wrong-kind file, a missing tool, no CUDA. The CLI
turns it into one line on stderr and exit status 2, in one place.
"""


class ProfkitError(Exception):
    """An error the user can act on; its message is the whole story (one line)."""


class BadInput(ProfkitError):
    """A file or value that is not what it should be."""


class MissingTool(ProfkitError):
    """A program or device the command needs is not available here."""
