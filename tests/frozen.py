"""Reports the full tables' engine gave, frozen before it was deleted, for the tests whose
inputs are made in the test (variants of the real captures that tests/test_golden.py
does not hold): ``tests/data/frozen/<name>.json.gz`` maps a case to its output.

``ranks_streaming_tables`` holds every table of those reports besides (pandas'
``to_json(orient="split", double_precision=15)``), their notes and rank infos. They were recorded
from the code of commit 0f93f55 (the reports of
the pandas engine on the full tables, which the columns' reports equalled then:
each test compared the two). Folders that differ between runs are written ``{name}``
(:func:`normalised`).
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path
from typing import Any

FROZEN = Path(__file__).parent / "data" / "frozen"


@functools.cache
def _store(name: str) -> dict[str, Any]:
    return json.loads(gzip.decompress((FROZEN / f"{name}.json.gz").read_bytes()))


def frozen(name: str, case: str) -> Any:
    """The frozen output of ``case`` in the store ``name``."""
    return _store(name)[case]


def normalised(value: Any, **folders: Path) -> Any:
    """``value`` as JSON, each folder's path written ``{name}``."""
    text = json.dumps(value, default=str)
    for name, folder in folders.items():
        text = text.replace(str(folder), "{" + name + "}")
    return json.loads(text)


def normalised_text(text: str, **folders: Path) -> str:
    for name, folder in folders.items():
        text = text.replace(str(folder), "{" + name + "}")
    return text
