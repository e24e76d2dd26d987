"""``profkit report``: one markdown report, with pictures, from whatever has been measured.

- ``collect``: what the results DB and ``profiles/`` hold.
- ``figures``: the numbers behind each picture; ``plots``: the PNGs.
- ``sections`` / ``traces``: one function per section, each returning markdown.
- ``build``: puts it together (:func:`build_report`).
- ``plan`` / ``run``: ``--run``, measuring what is missing first.
"""

from profkit.report.build import ReportResult, build_report

__all__ = ["ReportResult", "build_report"]
