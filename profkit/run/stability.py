"""When a timing is a finding: enough steps, and steps that agree with each other.

On a busy machine the same config can take 69 ms one step and 900 ms the next; a mean of
such steps, or a speed-up between two of them, says nothing about the code. A config whose
step times spread more than :data:`UNSTABLE_CV` (sample std over mean), or that has fewer
than :data:`MIN_STABLE_STEPS` timed steps, is *unstable*: tables mark it and the report
does not state its speed-ups as findings.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

UNSTABLE_CV = 0.10
MIN_STABLE_STEPS = 3


def coefficient_of_variation(times: Sequence[float]) -> float | None:
    """Sample std over mean of ``times`` (None for fewer than two, or a zero mean)."""
    if len(times) < 2 or not statistics.fmean(times):
        return None
    return statistics.stdev(times) / statistics.fmean(times)


def unstable(times: Sequence[float]) -> bool:
    """Whether timings are too few (< 3) or spread too much (CV > 10%) to be a finding."""
    cv = coefficient_of_variation(times)
    return len(times) < MIN_STABLE_STEPS or (cv is not None and cv > UNSTABLE_CV)
