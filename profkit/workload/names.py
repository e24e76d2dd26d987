"""The names the workload gives its ranges: one definition every reader and table imports.

Phases are the top-level ranges of a training step; the attention ranges are the CS336
handout's, nested inside the naive attention (users search their traces for these).
"""

from __future__ import annotations

FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
PHASES = (FORWARD, BACKWARD, OPTIMIZER)
"""The phases of one training step, in the order they run."""

ATTENTION = "scaled dot product attention"
SCORES = "computing attention scores"
SOFTMAX = "computing softmax"
FINAL = "final matmul"
ATTENTION_RANGES = (ATTENTION, SCORES, SOFTMAX, FINAL)
"""The naive attention's range and its three sub-ranges, outermost first."""
