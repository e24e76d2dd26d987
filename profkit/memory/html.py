"""torch's interactive memory viewer as one HTML file, written without holding the snapshot.

``torch.cuda._memory_viz.trace_plot`` pickles the snapshot again and embeds it, base64,
in a page that loads MemoryViz.js and d3 from public CDNs when it is opened (it needs
network access then; profkit itself never touches the network). That needs the whole
snapshot as Python objects: several times the pickle's size for millions of entries.

So when the file is what the viewer reads anyway, a protocol 4 pickle of a snapshot dict
(what torch and ``profkit memory`` write), the page embeds the file's own bytes, streamed
through base64 a few MiB at a time: memory stays flat whatever the size. Any other file
(another protocol, the legacy list of segments) is loaded whole and pickled with protocol
4 as torch does, up to :data:`HTML_WHOLE_MAX_ENTRIES` trace entries.
"""

from __future__ import annotations

import base64
import io
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from profkit.errors import BadInput
from profkit.files import open_input, reading, written
from profkit.memory.snapshot import WHAT, load_snapshot
from profkit.memory.trace_columns import SnapshotColumns

HTML_WHOLE_MAX_ENTRIES = 1_000_000
"""Most trace entries of a snapshot that must be loaded whole to be embedded."""
VIZ_KIND = "Active Memory Timeline"
_CHUNK_BYTES = 3 << 20  # a multiple of 3: base64 of the pieces is base64 of the whole


def write_html(path: Path, snapshot: SnapshotColumns, out: Path) -> Path:
    """Write torch's viewer of the snapshot file ``path`` (read as ``snapshot``) to ``out``."""
    head, tail = _template()
    streamed = _is_protocol_4(path) and not snapshot.legacy
    if not streamed:
        entries = sum(len(trace) for trace in snapshot.traces)
        if entries > HTML_WHOLE_MAX_ENTRIES:
            raise BadInput(
                f"--html: {path} is not a protocol 4 pickle of a snapshot dict, so it would be "
                f"loaded whole, and it has {entries:,} trace entries (at most "
                f"{HTML_WHOLE_MAX_ENTRIES:,}); save it with pickle protocol 4 (torch does)"
            )
    with written(out) as temporary, temporary.open("w", encoding="utf-8") as page, reading(path):
        page.write(head)
        page.write('[{"name": "snapshot.pickle", "base64": "')
        if streamed:
            with open_input(path, WHAT) as source:
                _write_base64(page, source)
        else:
            _write_base64(page, io.BytesIO(pickle.dumps(load_snapshot(path), protocol=4)))
        page.write('"}]')
        page.write(tail)
    return out


def _template() -> tuple[str, str]:
    """torch's page, cut where the snapshot goes."""
    try:
        from torch.cuda import _memory_viz
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        raise BadInput(f"--html needs torch.cuda._memory_viz: {exc}") from None
    template = getattr(_memory_viz, "_memory_viz_template", "")
    if template.count("$SNAPSHOT") != 1:
        raise BadInput("--html: this torch's memory viewer page is not one profkit knows")
    return tuple(template.replace("$VIZ_KIND", repr(VIZ_KIND)).split("$SNAPSHOT"))  # type: ignore[return-value]


def _is_protocol_4(path: Path) -> bool:
    with open_input(path, WHAT) as stream, reading(path):
        return stream.read(2) == b"\x80\x04"


def _write_base64(page: IO[str], source: IO[bytes]) -> None:
    """base64 of the source's bytes padded with zeros as torch pads them (1 to 3 bytes)."""
    total = 0
    for piece in _pieces(source):
        total += len(piece)
        if len(piece) % 3:  # the last one
            piece += b"\x00" * (3 - total % 3)
            total = 0
        page.write(base64.b64encode(piece).decode("ascii"))
    if total:  # the bytes ended on a multiple of 3: torch still adds three
        page.write(base64.b64encode(b"\x00" * 3).decode("ascii"))


def _pieces(source: IO[bytes]) -> Iterator[bytes]:
    """The source's bytes in pieces of ``_CHUNK_BYTES`` (the last one shorter)."""
    pending = b""
    while True:
        data = source.read(_CHUNK_BYTES - len(pending))
        if not data:
            if pending:
                yield pending
            return
        pending += data
        if len(pending) == _CHUNK_BYTES:
            yield pending
            pending = b""
