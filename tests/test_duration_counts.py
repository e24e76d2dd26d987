"""Duration counts: the statistics of counted durations are those of the durations, and the
counts of parts add up to the counts of the whole, so a job's statistics do not depend on
how its activities were split into files.

Their sums are exact integers; the statistics of one key per activity add floats, which
are exact while a group's summed squared deviations stay below 2^53 ns² (a thousand
kernels of up to a millisecond): there the two agree to the bit, beyond it to the float's
last digits."""

from __future__ import annotations

import numpy as np
import pandas as pd

from profkit.analysis.duration_counts import DURATION_BITS, added, counted
from profkit.analysis.kernel_stats import _stats


def _keys(rng: np.random.Generator, size: int, longest_ns: int = 10**6) -> np.ndarray:
    """Sorted ``group << 40 | duration`` keys, durations from 1 ns up, half of them repeats."""
    group = rng.integers(0, 6, size)
    duration = rng.integers(0, 10 ** int(rng.integers(1, np.log10(longest_ns) + 1)), size)
    duration[: size // 2] = duration[size // 2 : size // 2 * 2]  # repeats, as runs have
    return np.sort((group << DURATION_BITS) | duration)


def test_counted_statistics_are_the_durations() -> None:
    """Every figure of every group, to the bit, against the statistics of the sorted keys
    (one per activity), over many random sets, and for none."""
    rng = np.random.default_rng(7)
    for _ in range(100):
        keys = _keys(rng, int(rng.integers(1, 400)))
        pd.testing.assert_frame_equal(counted(keys).stats(), _stats(keys), check_exact=True)
    empty = np.zeros(0, np.int64)
    pd.testing.assert_frame_equal(counted(empty).stats(), _stats(empty), check_exact=True)
    for _ in range(20):  # kernels of up to 100 ms: float sums round
        keys = _keys(rng, 400, longest_ns=10**8)
        pd.testing.assert_frame_equal(counted(keys).stats(), _stats(keys), rtol=1e-12)


def test_parts_add_up_to_the_whole() -> None:
    """Keys split into parts any way, counted apart and added: the counts of all of them,
    and the same statistics; a regrouping adds groups up as regrouping every key would."""
    rng = np.random.default_rng(11)
    for _ in range(50):
        keys = _keys(rng, 300)
        cuts = np.sort(rng.integers(0, len(keys), 3))
        parts = [counted(np.sort(p)) for p in np.split(rng.permutation(keys), cuts)]
        whole = counted(keys)
        together = added(parts)
        assert np.array_equal(together.keys, whole.keys)
        assert np.array_equal(together.counts, whole.counts)
        assert together.counts.sum() == len(keys)
        halves = whole.regrouped(lambda g: g // 2)
        regrouped = np.sort(((keys >> DURATION_BITS) // 2 << DURATION_BITS) | (keys & (2**40 - 1)))
        pd.testing.assert_frame_equal(halves.stats(), _stats(regrouped), check_exact=True)
