"""Nsight Systems as a launcher: ``profkit nsys`` for the built-in model or a user's program.

- ``argv``: the ``nsys profile`` command line, built from one options dataclass.
- ``profile``: the run itself, the export, and the kernel report written after it.
- ``record``: what a run records beside its export (the run section of the report).
"""
