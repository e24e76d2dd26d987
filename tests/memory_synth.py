"""Synthetic CUDA memory snapshots for tests (no CUDA here to capture real ones).

They follow the format ``torch.cuda.memory._snapshot()`` documents (segments of blocks
tiling each segment; ``device_traces`` of alloc / free_requested / free_completed /
segment_alloc / segment_free / oom entries with ``time_us``; frames innermost first),
built by a toy allocator that follows the CUDA caching allocator's rules where they shape
the numbers: requests round up to 512 bytes; up to 1 MiB they come from 2 MiB small-pool
segments, larger ones from large-pool segments; a large request takes the whole rest of
a segment when splitting would leave 1 MiB or less; freed blocks are reused. So address
reuse, unsplit blocks, allocations older than the trace and a clipped ring buffer occur.
Real snapshots captured on a GPU (tests/data/) back the golden numbers.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

ROUND = 512
SEGMENT = 64 * 1024**2
SMALL = 1024**2
SMALL_SEGMENT = 2 * 1024**2
USER = "/work/proj/profkit/model.py"
TORCH = "/usr/lib/python3.12/site-packages/torch/nn/modules/module.py"


class RunsCode:
    """Pickles as a call of ``os.system`` that touches ``marker``: what a safe reader refuses."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def frames(line: int, name: str = "forward", filename: str = USER) -> list[dict[str, Any]]:
    """A stack as torch records it: innermost first, torch's own frames on top."""
    return [
        {"filename": TORCH, "line": 1750, "name": "_call_impl"},
        {"filename": filename, "line": line, "name": name},
        {"filename": "/work/proj/train.py", "line": 3, "name": "<module>"},
    ]


class SnapshotBuilder:
    """A toy caching allocator that records what torch's would."""

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self.events: list[dict[str, Any]] = []
        self.recording = True
        self.segments: list[dict[str, Any]] = []  # {address, total_size, top}
        self.live: dict[int, dict[str, Any]] = {}
        self.free_blocks: dict[int, list[int]] = {}  # block size -> addresses
        self.clock_us = 1_700_000_000_000_000
        self.marks: list[dict[str, Any]] = []  # phase ends, as the capture records them
        # Ground truth: requested and block bytes allocated in each state of the trace.
        self.truth: list[int] = [0]
        self.block_truth: list[int] = [0]
        self._next_segment = 0x7F00_0000_0000

    def start_recording(self) -> None:
        """Like ``_record_memory_history(clear_history=True)``: the trace starts afresh."""
        self.recording = True
        self.events = []
        self.truth = [self.requested_bytes()]
        self.block_truth = [self.block_bytes()]

    def _event(self, action: str, addr: int, size: int, fr: list[dict[str, Any]] | None) -> None:
        self.clock_us += 7
        if self.recording:
            entry = {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "time_us": self.clock_us,
            }
            entry["frames"] = fr or []
            self.events.append(entry)
            self.truth.append(self.requested_bytes())
            self.block_truth.append(self.block_bytes())

    def alloc(self, size: int, fr: list[dict[str, Any]] | None = None) -> int:
        block = max(ROUND, -(-size // ROUND) * ROUND)
        small = size <= SMALL
        if self.free_blocks.get(block):
            addr = self.free_blocks[block].pop()
        else:
            segment = next(
                (s for s in self.segments
                 if s["small"] == small and s["top"] + block <= s["total_size"]),
                None,
            )  # fmt: skip
            if segment is None:
                total = (
                    SMALL_SEGMENT if small else max(SEGMENT, -(-block // (2 * SMALL)) * 2 * SMALL)
                )
                segment = {
                    "address": self._next_segment,
                    "total_size": total,
                    "top": 0,
                    "small": small,
                }
                self._next_segment += total + SEGMENT
                self.segments.append(segment)
                self._event("segment_alloc", segment["address"], total, fr)
            addr = segment["address"] + segment["top"]
            rest = segment["total_size"] - segment["top"] - block
            if not small and rest <= SMALL:
                block += rest  # not worth splitting: the block keeps the rest of the segment
            segment["top"] += block
        self.live[addr] = {"size": block, "requested_size": size, "frames": fr or []}
        self._event("alloc", addr, size, fr)
        return addr

    def free(self, addr: int, fr: list[dict[str, Any]] | None = None) -> None:
        block = self.live.pop(addr)
        self._event("free_requested", addr, block["requested_size"], fr)
        self._event("free_completed", addr, block["requested_size"], fr)
        self.free_blocks.setdefault(block["size"], []).append(addr)

    def oom(self, size: int) -> None:
        self.clock_us += 7
        self.events.append(
            {"action": "oom", "device_free": 123, "size": size, "stream": 0,
             "time_us": self.clock_us, "frames": []}
        )  # fmt: skip
        self.truth.append(self.requested_bytes())
        self.block_truth.append(self.block_bytes())

    def mark(self, phase: str) -> None:
        self.clock_us += 3
        self.marks.append({"phase": phase, "time_us": self.clock_us})

    def requested_bytes(self) -> int:
        return sum(b["requested_size"] for b in self.live.values())

    def block_bytes(self) -> int:
        return sum(b["size"] for b in self.live.values())

    def snapshot(self, keep_last: int | None = None) -> dict[str, Any]:
        """The snapshot now; ``keep_last`` clips the trace like a full ring buffer."""
        segments = []
        for seg in self.segments:
            blocks, cursor = [], seg["address"]
            end = seg["address"] + seg["total_size"]
            for addr in sorted(a for a in self.live if seg["address"] <= a < end):
                if addr > cursor:
                    blocks.append(_inactive(cursor, addr - cursor))
                b = self.live[addr]
                blocks.append({"address": addr, "state": "active_allocated", **copy.deepcopy(b)})
                cursor = addr + b["size"]
            if cursor < end:
                blocks.append(_inactive(cursor, end - cursor))
            segments.append(
                {
                    "device": self.device, "address": seg["address"], "total_size": seg["total_size"],
                    "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                    "active_size": 0, "requested_size": 0, "stream": 0,
                    "segment_type": "small" if seg["small"] else "large",
                    "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
                }
            )  # fmt: skip
        trace = copy.deepcopy(self.events)
        if keep_last is not None:
            trace = trace[-keep_last:] if keep_last else []
        traces: list[list[dict[str, Any]]] = [[] for _ in range(self.device)] + [trace]
        return {
            "segments": segments,
            "device_traces": traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False},
            "external_annotations": [],
        }


def _inactive(addr: int, size: int) -> dict[str, Any]:
    return {"address": addr, "size": size, "requested_size": 0, "state": "inactive", "frames": []}


MIB = 1024**2
ADAM_FRAMES = [
    {"filename": "/x/site-packages/torch/optim/adamw.py", "line": 90, "name": "_init_group"},
    {"filename": "/work/proj/profkit/workload.py", "line": 133, "name": "_optimizer_step"},
]


def transformer_step(layers: int = 4, mode: str = "train", steps: int = 1) -> SnapshotBuilder:
    """Weights before recording, then steps of: activations piling up per layer in the
    forward, freed in the backward while gradients appear, then AdamW state and update."""
    b = SnapshotBuilder()
    b.recording = False
    weights = [b.alloc(24 * MIB, frames(30, "__init__")) for _ in range(layers)]
    weights.append(b.alloc(40 * MIB, frames(150, "__init__")))
    adam: list[int] = []
    b.start_recording()
    for _ in range(steps):
        saved = []
        for layer in range(layers):
            saved.append(b.alloc(8 * MIB, frames(104, "forward")))  # attention scores
            saved.append(b.alloc(3 * MIB, frames(41, "forward")))  # swiglu
            tmp = b.alloc(300 * 1024, frames(29, "forward"))  # rmsnorm temporaries
            b.free(tmp)
            del layer
        logits = b.alloc(30 * MIB, frames(140, "forward"))
        if mode == "forward":
            b.free(logits)
            for addr in reversed(saved):
                b.free(addr)
            b.mark("forward")
            continue
        b.mark("forward")
        grads = []
        for addr in reversed(saved):
            grads.append(b.alloc(6 * MIB, []))  # autograd thread: no Python stack
            b.free(addr)
        b.free(logits)
        b.mark("backward")
        if not adam:
            adam = [b.alloc(24 * MIB, ADAM_FRAMES) for _ in range(2 * layers)]
        for g in grads:
            b.free(g)
        b.mark("optimizer")
    del weights
    return b
