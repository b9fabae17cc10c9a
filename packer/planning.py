"""Plans: which samples go into which row, computed from lengths alone.

A plan is CSR: `order` lists sample indices row by row and `row_starts` cuts it into rows. Every
strategy only has to produce that, and the gather step is one pass over it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from packer import algorithms
from packer.errors import UsageError

STRATEGIES = ("bfd",)


@dataclass(frozen=True)
class Plan:
    order: np.ndarray  # int64[N]: sample indices in row order
    row_starts: np.ndarray  # int64[num_rows + 1]: offsets into `order`

    @property
    def num_rows(self) -> int:
        return len(self.row_starts) - 1

    def row(self, r: int) -> np.ndarray:
        return self.order[self.row_starts[r] : self.row_starts[r + 1]]


def lower_bound(total_tokens: int, max_len: int) -> int:
    """No plan can use fewer rows than ceil(tokens / L)."""
    return -(-int(total_tokens) // int(max_len))


@njit(cache=True)
def _plan_from_bins(bin_of, num_rows):  # pragma: no cover - compiled
    """CSR plan from a row number per sample; samples keep their relative order within a row."""
    counts = np.zeros(num_rows + 1, np.int64)
    for i in range(bin_of.size):
        counts[bin_of[i] + 1] += 1
    row_starts = np.cumsum(counts)
    fill = row_starts[:-1].copy()
    order = np.empty(bin_of.size, np.int64)
    for i in range(bin_of.size):
        r = bin_of[i]
        order[fill[r]] = i
        fill[r] += 1
    return order, row_starts


def _check_lengths(lengths: np.ndarray, max_len: int) -> np.ndarray:
    if max_len < 1:
        raise UsageError(f"--max-len must be at least 1, got {max_len}")
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > max_len):
        bad = int(np.flatnonzero((lengths < 1) | (lengths > max_len))[0])
        raise UsageError(
            f"sample {bad} has length {int(lengths[bad])}; plan() needs lengths in 1..{max_len}")
    return lengths


def plan(lengths, max_len: int, strategy: str = "bfd", seed: int = 0, window: int | None = None) -> Plan:
    """Plan rows of at most `max_len` tokens for samples of the given lengths.

    Lengths must already be in 1..max_len: over-length samples are resolved before planning
    (see `packer.overlength`), so that no strategy can silently drop or cut anything.
    """
    lengths = _check_lengths(np.asarray(lengths), max_len)
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy '{strategy}' (choose from {', '.join(STRATEGIES)})")
    if window is not None:
        raise UsageError("--window is not supported yet")
    if lengths.size == 0:
        return Plan(order=np.zeros(0, np.int64), row_starts=np.zeros(1, np.int64))
    bin_of, num_rows = algorithms.best_fit_decreasing(lengths, max_len)
    order, row_starts = _plan_from_bins(bin_of, num_rows)
    return Plan(order=order, row_starts=row_starts)
