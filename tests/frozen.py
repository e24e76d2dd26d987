"""Reports the full tables' engine gave, frozen before it was deleted, for the tests whose
inputs are made in the test (variants of the real captures that tests/test_golden.py
does not hold): ``tests/data/frozen/<name>.json.gz`` maps a case to its output.

``ranks_streaming_tables`` holds every table of those reports besides (pandas'
``to_json(orient="split", double_precision=15)``), their notes and rank infos. They were recorded
from the code of commit 0f93f55 (the reports of
the pandas engine on the full tables, which the columns' reports equalled then:
each test compared the two). Folders that differ between runs are written ``{name}``
(:func:`normalised`). What the reports gained after they were frozen is set aside when
they are compared: the phase story of issue 25 (``source.phases_from``, ``source.patterns``
and the notes that say them, :func:`without_story`).
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from pathlib import Path
from typing import Any

FROZEN = Path(__file__).parent / "data" / "frozen"


@functools.cache
def _store(name: str) -> dict[str, Any]:
    return json.loads(gzip.decompress((FROZEN / f"{name}.json.gz").read_bytes()))


def frozen(name: str, case: str) -> Any:
    """The frozen output of ``case`` in the store ``name``."""
    return _store(name)[case]


STORY_KEYS = ("phases_from", "patterns")
STORY_NOTES = ("Phases from ", "Recognized: ")


def normalised(value: Any, **folders: Path) -> Any:
    """``value`` as JSON, each folder's path written ``{name}``, the phase story aside."""
    text = json.dumps(value, default=str)
    for name, folder in folders.items():
        text = text.replace(str(folder), "{" + name + "}")
    return without_story(json.loads(text))


def without_story(value: Any) -> Any:
    """``value`` without what says where its phases came from (added after the freeze)."""
    if isinstance(value, dict):
        return {
            k: [n for n in v if not (isinstance(n, str) and n.startswith(STORY_NOTES))]
            if k == "notes" and isinstance(v, list)
            else without_story(v)
            for k, v in value.items()
            if k not in STORY_KEYS
        }
    if isinstance(value, list):
        return [without_story(v) for v in value]
    return value


def normalised_text(text: str, **folders: Path) -> str:
    for name, folder in folders.items():
        text = text.replace(str(folder), "{" + name + "}")
    text = re.sub(r"• (?:Phases from |Recognized: )[^•]*", "", text)  # the terminal's notes
    return re.sub(r"(?m)^- (?:Phases from |Recognized: ).*\n", "", text)  # markdown's


def assert_shows_the_numbers(text: str, report: dict[str, Any]) -> None:
    """A rendering (markdown, terminal) shows the frozen JSON report's phase rows: each
    phase, its kernel count and its GPU ms to two decimals. The renderings themselves were
    frozen before issue 27 changed how tables look (share %, shortened names), so they
    are held to the numbers, which did not change, rather than to the character."""
    for row in report["phases"]:
        assert row["phase"] in text, row["phase"]
        assert f"{int(row['kernels']):,}" in text or str(int(row["kernels"])) in text, row
        assert f"{row['gpu_time_ms']:,.2f}" in text or f"{row['gpu_time_ms']:.2f}" in text, row
