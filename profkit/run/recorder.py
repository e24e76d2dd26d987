"""Inside the child process: record the CUDA allocator's history and dump the snapshot.

Recording starts before the model is built, so that every weight keeps the stack that
allocated it and a run that runs out of memory during warm-up still leaves a trace; the
history is then cleared when the timed steps begin, so the trace holds only those
(``clear_history``; the blocks alive then keep their stacks). The snapshot is dumped
when the timed steps end, or after a failure (an OOM above all: that is when the
snapshot is most needed). Probes of ``memory_allocated`` run at the end of each phase,
outside the phase's timing.
"""

from __future__ import annotations

import inspect
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profkit.errors import MissingTool

# Protocol 5 breaks pytorch.org/memory_viz; 4 is what it reads.
PROTOCOL = 4
STACKS = ("python", "all")
DEFAULT_MAX_ENTRIES = 1_000_000


class MemoryRecorder:
    """One config's memory capture: ``begin`` -> ``attach`` -> start/stop hooks -> ``finish``."""

    def __init__(
        self, snapshot: str, max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str = "python"
    ) -> None:
        self.snapshot_path = Path(snapshot)
        self.max_entries = int(max_entries)
        self.stacks = stacks
        self.recording = False
        self.timing = False
        self.dumped = False
        self.info: dict[str, Any] = {"snapshot": str(self.snapshot_path), "phase_marks": []}

    def _record(self, enabled: str | None, clear: bool = False) -> None:
        import torch

        record = torch.cuda.memory._record_memory_history
        params = inspect.signature(record).parameters
        if enabled is None:
            record(enabled=None)
            return
        kwargs: dict[str, Any] = {
            "enabled": enabled,
            "context": "all",
            "max_entries": self.max_entries,
        }
        if "stacks" in params:  # torch >= 2.1; before that only Python stacks existed
            kwargs["stacks"] = self.stacks
        if clear and "clear_history" in params:
            kwargs["clear_history"] = True
        elif clear:  # older torch: switching off and on again drops the history
            record(enabled=None)
        record(**kwargs)

    def begin(self) -> None:
        """Start recording (before the model is built)."""
        import torch

        if not torch.cuda.is_available():
            raise MissingTool("memory snapshots need a CUDA device; none is visible here")
        self._record("all")
        self.recording = True

    def attach(self, workload: Any) -> tuple[Callable[[], None], Callable[[], None]]:
        """Note the memory of the built model and hook the phases; returns (start, stop)."""
        import torch

        self.info["model_bytes"] = torch.cuda.memory_allocated()
        workload.on_phase_end = self._on_phase_end
        return self._start, self._stop

    def _on_phase_end(self, name: str) -> None:
        import torch

        if self.timing:
            self.info[f"after_{name}_bytes"] = torch.cuda.memory_allocated()
        # Marks from warm-up too: a run that fails there keeps its trace, and its phases.
        # The allocator stamps its events with wall-clock microseconds; the monotonic
        # clock is kept too in case a torch build stamps with that instead.
        self.info["phase_marks"].append(
            {
                "phase": name,
                "time_us": time.time_ns() // 1000,
                "monotonic_us": time.monotonic_ns() // 1000,
            }
        )

    def _start(self) -> None:
        import torch

        torch.cuda.synchronize()
        self._record("all", clear=True)
        self.info["recording_started_us"] = time.time_ns() // 1000
        self.timing = True

    def _stop(self) -> None:
        import torch

        torch.cuda.synchronize()
        self.timing = False
        self._dump()

    def _dump(self) -> None:
        import torch

        stats = torch.cuda.memory_stats()
        self.info.update(
            max_memory_allocated_bytes=torch.cuda.max_memory_allocated(),
            max_memory_reserved_bytes=torch.cuda.max_memory_reserved(),
            peak_requested_bytes=stats.get("requested_bytes.all.peak"),
            allocated_at_dump_bytes=torch.cuda.memory_allocated(),
            reserved_at_dump_bytes=torch.cuda.memory_reserved(),
            device_name=torch.cuda.get_device_name(),
            torch_version=torch.__version__,
        )
        snapshot = torch.cuda.memory._snapshot()
        self._record(None)
        self.recording = False
        dump_snapshot(snapshot, self.snapshot_path)
        self.info["snapshot_bytes"] = self.snapshot_path.stat().st_size
        self.dumped = True

    def finish(self) -> dict[str, Any]:
        """Dump the snapshot if the run ended early; the capture's facts for the result."""
        if self.recording and not self.dumped:
            try:
                self._dump()
            except Exception as exc:  # a failed dump must not hide the run's own result
                self.info["snapshot_error"] = f"{type(exc).__name__}: {exc}"
        return self.info


def dump_snapshot(snapshot: dict[str, Any], path: Path) -> None:
    """Write ``snapshot`` with pickle protocol 4 (what memory_viz reads), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        pickle.dump(snapshot, f, protocol=PROTOCOL)
    os.replace(tmp, path)
