"""Plans: which samples go into which row, computed from lengths alone.

A plan is CSR: `order` lists sample indices row by row and `row_starts` cuts it into rows. Every
strategy only has to produce that, and the gather step is one pass over it. The kernels live in
`packer.planning.kernels`; this module picks one, validates input and handles windows.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from packer import arguments as A
from packer.errors import UsageError
from packer.planning import kernels as algorithms
from packer.planning.choices import STRATEGIES


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


def martello_toth_bound(counts: np.ndarray, max_len: int) -> int:
    """Martello–Toth L2 lower bound on rows, from the length histogram `counts[0..L]`.

    For every a in 0..L/2: samples longer than L - a need a row each; samples in (L/2, L - a]
    also need a row each (no two share one) and leave room that only samples of a..L/2 can use;
    what of those does not fit there needs ceil(rest / L) more rows. Never below ceil(tokens/L)
    and never below the number of samples longer than L/2. O(L).
    """
    counts = np.asarray(counts, np.int64)
    L = int(max_len)
    if counts.sum() == 0:
        return 0
    sizes = np.arange(L + 1, dtype=np.int64)
    n_ge = np.cumsum(counts[::-1])[::-1]  # n_ge[v]: samples of length >= v
    t_ge = np.cumsum((counts * sizes)[::-1])[::-1]  # t_ge[v]: their tokens
    n_ge = np.append(n_ge, 0)
    t_ge = np.append(t_ge, 0)
    half = L // 2 + 1  # lengths >= half are longer than L/2
    a = np.arange(0, L // 2 + 1, dtype=np.int64)
    big = n_ge[L - a + 1]  # longer than L - a
    mid_n = n_ge[half] - big  # in (L/2, L - a]
    mid_t = t_ge[half] - t_ge[L - a + 1]
    small_t = t_ge[np.maximum(a, 1)] - t_ge[half]  # in [a, L/2]
    spill = small_t - (mid_n * L - mid_t)
    extra = np.where(spill > 0, -(-spill // L), 0)
    return int((big + mid_n + extra).max())


def best_bound(lengths, max_len: int) -> int:
    """The larger of ceil(tokens / L) and the Martello–Toth L2 bound."""
    lengths = np.asarray(lengths)
    counts, _ = algorithms.length_histogram(_as_int_array(lengths), int(max_len))
    return max(
        lower_bound(int((counts * np.arange(counts.size)).sum()), max_len),
        martello_toth_bound(counts, max_len),
    )


def _as_int_array(lengths) -> np.ndarray:
    try:
        lengths = np.asarray(lengths)
    except (ValueError, TypeError) as exc:  # ragged nesting, objects numpy cannot hold
        raise UsageError(f"lengths must be a 1-d array of integers ({exc})") from None
    if lengths.ndim != 1:
        raise UsageError(f"lengths must be a 1-d array, got shape {lengths.shape}")
    if lengths.size and lengths.dtype.kind not in "iu":
        raise UsageError(f"lengths must be integers, got dtype {lengths.dtype}")
    if lengths.dtype not in (np.int32, np.int64):
        lengths = lengths.astype(np.int64)
    return np.ascontiguousarray(lengths)


def _bad_length(lengths: np.ndarray, index: int, max_len: int) -> UsageError:
    return UsageError(
        f"sample {index} has length {int(lengths[index])}; plan() needs lengths in 1..{max_len}"
    )


def _plan_decreasing(kernel, lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    counts, bad = algorithms.length_histogram(lengths, max_len)
    if bad >= 0:
        raise _bad_length(lengths, bad, max_len)
    groups, n_groups, events, ev_start, ev_end, num_rows = kernel(counts, max_len)
    row_starts = algorithms.row_starts_from_groups(groups, n_groups, num_rows)
    order = algorithms.scatter_events(lengths, events, ev_start, ev_end, row_starts, max_len)
    return order, row_starts


def plan_arrays(
    lengths: np.ndarray, max_len: int, strategy: str, rng_seed
) -> tuple[np.ndarray, np.ndarray]:
    """(order, row_starts) of one strategy over all of `lengths` (already int32/int64)."""
    if strategy == "bfd":
        return _plan_decreasing(algorithms.best_fit_groups, lengths, max_len)
    if strategy == "ffd":
        return _plan_decreasing(algorithms.first_fit_groups, lengths, max_len)
    if strategy == "histogram":
        return _plan_decreasing(algorithms.worst_fit_groups, lengths, max_len)
    bad = algorithms.first_bad_length(lengths, max_len)
    if bad >= 0:
        raise _bad_length(lengths, bad, max_len)
    if strategy == "nf":
        return np.arange(lengths.size, dtype=np.int64), algorithms.next_fit(lengths, max_len)
    # ff-shuffle
    visit = np.random.default_rng(rng_seed).permutation(lengths.size).astype(np.int64)
    bin_of, num_rows = algorithms.first_fit_in_order(lengths, visit, max_len)
    return algorithms.plan_from_bins(bin_of, num_rows)


def _plan_windows(
    lengths: np.ndarray, max_len: int, strategy: str, seed: int, window: int
) -> tuple[np.ndarray, np.ndarray]:
    """Plan each run of `window` consecutive samples on its own, on all cores, then join."""
    n = lengths.size
    bounds = list(range(0, n, window)) + [n]
    spans = list(zip(bounds[:-1], bounds[1:]))

    def one(w: int):
        a, b = spans[w]
        order, row_starts = plan_arrays(lengths[a:b], max_len, strategy, [seed, w])
        return order + a if a else order, row_starts

    workers = min(len(spans), os.cpu_count() or 1)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(one, range(len(spans)), chunksize=max(1, len(spans) // 64)))
    else:
        parts = [one(w) for w in range(len(spans))]
    order = np.concatenate([p[0] for p in parts])
    starts = [parts[0][1]]
    base = parts[0][1][-1]
    for _, rs in parts[1:]:
        starts.append(rs[1:] + base)
        base += rs[-1]
    return order, np.concatenate(starts)


def plan(
    lengths, max_len: int, strategy: str = "bfd", seed: int = 0, window: int | None = None
) -> Plan:
    """Plan rows of at most `max_len` tokens for samples of the given lengths.

    Lengths must already be in 1..max_len: over-length samples are resolved before planning
    (see `packer.planning.overlength`), so that no strategy can silently drop or cut anything. With
    `window`, each run of `window` consecutive samples is packed on its own (bounded memory,
    parallel), at some cost in rows. The result depends only on the arguments.
    """
    max_len = A.integer(max_len, "max_len", minimum=1)
    A.choice(strategy, "strategy", STRATEGIES)
    seed = A.integer(seed, "seed", minimum=0)
    window = A.integer(window, "window", minimum=1, none=True)
    lengths = _as_int_array(lengths)
    if lengths.size == 0:
        return Plan(order=np.zeros(0, np.int64), row_starts=np.zeros(1, np.int64))
    if window is None or window >= lengths.size:
        order, row_starts = plan_arrays(lengths, max_len, strategy, seed)
    else:
        order, row_starts = _plan_windows(lengths, max_len, strategy, seed, window)
    return Plan(order=order, row_starts=row_starts)
