"""CUDA memory snapshots: capture, safe loading, the reconstructed peak, the timeline picture.

- ``recorder``: inside the child process, records the allocator's history and dumps it.
- ``capture``: runs one child per config and builds the peak tables (``profkit memory``).
- ``snapshot``: loads snapshots as plain data only (no pickle global is ever resolved).
- ``timeline``: allocated/reserved memory in every traced state, walked back from the dump.
- ``summary``: the peak, its time and the call sites holding it (``memory summarize``).
- ``plot``: the active-memory timeline drawn with matplotlib (``memory plot``).
"""

from profkit.memory.snapshot import load_snapshot
from profkit.memory.summary import summarize, summarize_file
from profkit.memory.timeline import Timeline, reconstruct

__all__ = ["Timeline", "load_snapshot", "reconstruct", "summarize", "summarize_file"]
