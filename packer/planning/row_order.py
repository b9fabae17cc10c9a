"""The order rows are written in: the planner's, or a seeded permutation of it.

The decreasing strategies fill rows from the longest sample down, so their plans list the rows
with the longest samples first: a trainer that reads the rows in order (a sequential sampler,
MDS with `shuffle=False`, Megatron's index without its own shuffle) would get a length
curriculum nobody asked for. With `row_order="shuffle"` (the default) the rows of a plan are
written in a permutation drawn from numpy's PCG64, seeded from `seed` and a key that says which
plan it is, so the same seed gives the same bytes on every platform and engine.

Only the order of whole rows changes: every row holds the same segments, in the same order,
as the plan made it. What a "plan" is per engine (the one global plan; each block's full rows
and each tail group's rows in a block run; each window of a streamed `pack_dataset`) and how
the block run orders its shards: docs/format.md, "Row order".
"""

from __future__ import annotations

import numpy as np

from packer.planning.strategies import Plan

# keeps the row permutations' random numbers apart from those of ff-shuffle's plans, which
# are seeded from the same `seed`
ROW_STREAM = 0x726F77  # "row"
# the key of each kind of plan a run permutes
WHOLE, BLOCK, TAIL_GROUP, SHARDS, WINDOW = range(5)
_STEP = 1 << 16  # rows copied per step: bounds the temporary index arrays


def row_permutation(num_rows: int, seed: int, *key: int) -> np.ndarray:
    """A permutation of 0..num_rows-1 (int64) that depends only on (seed, key)."""
    seq = np.random.SeedSequence([int(seed), ROW_STREAM, *map(int, key)])
    return np.random.Generator(np.random.PCG64(seq)).permutation(int(num_rows)).astype(np.int64)


def reorder_rows(pl: Plan, perm: np.ndarray) -> Plan:
    """The plan whose row i is row `perm[i]` of `pl` (its segments in the same order)."""
    perm = np.asarray(perm, np.int64)
    counts = np.diff(pl.row_starts)[perm]
    starts = np.zeros(perm.size + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    order = np.empty_like(pl.order)
    for a in range(0, perm.size, _STEP):
        b = min(a + _STEP, perm.size)
        lo, hi = starts[a], starts[b]
        # where each segment of new rows a..b comes from: its old row's start, plus its place
        src = np.repeat(pl.row_starts[perm[a:b]] - starts[a:b], counts[a:b])
        src += np.arange(lo, hi, dtype=np.int64)
        order[lo:hi] = pl.order[src]
    return Plan(order=order, row_starts=starts)


def order_rows(pl: Plan, row_order: str, seed: int, *key: int) -> Plan:
    """`pl` with its rows in the configured order: as planned, or permuted by (seed, key)."""
    if row_order == "plan" or pl.num_rows < 2:
        return pl
    return reorder_rows(pl, row_permutation(pl.num_rows, seed, *key))


def order_plan_rows(pl: Plan, row_order: str, seed: int, window: int | None = None) -> Plan:
    """The rows of a one-plan run (`plan(..., window=)` of `pl.order.size` items) in
    `row_order`: the whole plan permuted; with `window` (and more than one window), each
    window's rows permuted within the window, as a streamed `pack_dataset` can order them,
    so that both give the same rows in the same order."""
    n = pl.order.size
    if row_order == "plan" or window is None or window >= n:
        return order_rows(pl, row_order, seed, WHOLE)
    # a window's items are consecutive, so are its rows: a row's window is its first item's
    first = pl.order[pl.row_starts[:-1]] // window
    bounds = np.flatnonzero(np.diff(first)) + 1
    starts = np.concatenate([[0], bounds, [pl.num_rows]]).astype(np.int64)
    perm = np.empty(pl.num_rows, np.int64)
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        perm[a:b] = a + row_permutation(b - a, seed, WINDOW, int(first[a]))
    return reorder_rows(pl, perm)


def order_shards(entries: list, row_order: str, seed: int) -> list:
    """A block run's shards in the order its manifest lists them (which readers follow): the
    blocks' and tail groups' shards mixed by a permutation of (seed), or as written."""
    if row_order == "plan" or len(entries) < 2:
        return list(entries)
    return [entries[i] for i in row_permutation(len(entries), seed, SHARDS).tolist()]
