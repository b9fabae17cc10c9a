"""Which rows train together: epoch plans for several ranks, balanced by tokens or by compute.

A packed row holds about L tokens, so balancing ranks by tokens is nearly free; its compute is
not its token count. Per layer, the linear parts cost about 24·d² FLOPs per token and causal
attention about 2·d·l² per sample of l tokens (the same ratio holds in forward and backward), so
in token units

    cost(row) = tokens + Σ l_i² / (12 · d)

over the row's segments l_i (d: the model's hidden size). A row holding one 32k-token document
costs 1.66x a row of 300 short samples at d = 4096, and every data-parallel step waits for its
slowest rank. `plan_batches(..., balance="attention")` groups rows of similar cost into the same
step and deals each step's rows to ranks largest first, then shuffles the step order.

Everything here is numpy only (no torch): `packer plan` uses it to model the efficiency, and
`packer.torch.PackedBatchSampler` to train. A plan is a pure function of (rows, batch_size,
num_replicas, seed, epoch, shuffle, drop_last, balance and the cost model), so every rank
computes the same plan without communication.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

DEFAULT_HIDDEN_SIZE = 4096
BALANCES = ("attention", "tokens")

# Rows whose costs are within this relative distance are interchangeable when steps are formed:
# the order inside such a band is drawn anew every epoch, so step compositions change between
# epochs at a modeled cost of at most about this fraction.
COST_BAND = 0.005


def row_segments(rows) -> tuple[np.ndarray, np.ndarray]:
    """`rows` as CSR: (offsets int64 [rows + 1], segment lengths int64).

    `rows` is an object with a `segment_lengths()` method returning that pair (a
    `PackedDataset`) or a sequence of per-row sequences of segment lengths.
    """
    if hasattr(rows, "segment_lengths"):
        offsets, lengths = rows.segment_lengths()
        return np.asarray(offsets, np.int64), np.asarray(lengths, np.int64)
    parts = [np.asarray(r, np.int64).reshape(-1) for r in rows]
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([p.size for p in parts], out=offsets[1:])
    lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return offsets, lengths


def row_tokens(offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Tokens of every row of a CSR (offsets, segment lengths), int64."""
    total = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=total[1:])
    return total[offsets[1:]] - total[offsets[:-1]]


def row_costs(
    offsets: np.ndarray,
    lengths: np.ndarray,
    hidden_size: int = DEFAULT_HIDDEN_SIZE,
    cost: Callable[[np.ndarray], float] | None = None,
) -> np.ndarray:
    """Modeled compute of every row in token units, float64: `tokens + Σ l² / (12·hidden_size)`.

    `cost`, when given, replaces the model: it is called with each row's segment lengths
    (int64 array) and returns that row's cost (any unit; only ratios matter).
    """
    offsets = np.asarray(offsets, np.int64)
    lengths = np.asarray(lengths, np.int64)
    if cost is not None:
        out = np.array(
            [float(cost(lengths[a:b])) for a, b in zip(offsets[:-1], offsets[1:])], np.float64
        )
        if not np.isfinite(out).all() or (out < 0).any():
            raise ValueError("cost must return a finite, non-negative number for every row")
        return out
    if hidden_size < 1:
        raise ValueError(f"hidden_size must be at least 1, got {hidden_size}")
    squares = np.zeros(lengths.size + 1, np.float64)
    np.cumsum(lengths.astype(np.float64) ** 2, out=squares[1:])
    attention = squares[offsets[1:]] - squares[offsets[:-1]]
    return row_tokens(offsets, lengths) + attention / (12.0 * hidden_size)


def _mode(balance) -> str:
    if balance is True:
        return "tokens"
    if balance is False or balance is None:
        return "none"
    if balance in BALANCES:
        return balance
    raise ValueError(f"balance must be 'attention', 'tokens', True or False, got {balance!r}")


def _epoch_rows(n: int, per_step: int, rng, shuffle: bool, drop_last: bool) -> np.ndarray:
    """The rows of an epoch in visiting order, cut or filled to whole steps (the drop_last rules)."""
    order = rng.permutation(n) if shuffle else np.arange(n, dtype=np.int64)
    if drop_last or n == 0:
        return order[: n // per_step * per_step]
    steps = -(-n // per_step)
    fill = steps * per_step - n
    return np.concatenate([order, order[np.arange(fill) % n]])


def _deal_snake(chunks: np.ndarray, weights: np.ndarray | None, batch_size: int) -> np.ndarray:
    """Sort each step by weight (if any), deal rounds of W rows in snake order: [S, W, b]."""
    steps, per_step = chunks.shape
    if weights is not None:
        by_weight = np.argsort(-weights[chunks], axis=1, kind="stable")
        chunks = np.take_along_axis(chunks, by_weight, axis=1)
    rounds = chunks.reshape(steps, batch_size, per_step // batch_size).copy()
    rounds[:, 1::2, :] = rounds[:, 1::2, ::-1]
    return np.ascontiguousarray(rounds.transpose(0, 2, 1))


def _deal_greedy(chunks: np.ndarray, costs: np.ndarray, batch_size: int) -> np.ndarray:
    """Each step's rows largest first, each to the least-loaded rank with room: [S, W, b]."""
    steps, per_step = chunks.shape
    replicas = per_step // batch_size
    c = costs[chunks]
    by_cost = np.argsort(-c, axis=1, kind="stable")
    chunks = np.take_along_axis(chunks, by_cost, axis=1)
    if batch_size == 1:
        return chunks.reshape(steps, replicas, 1)
    c = np.take_along_axis(c, by_cost, axis=1)
    out = np.empty((steps, replicas, batch_size), np.int64)
    loads = np.zeros((steps, replicas))
    counts = np.zeros((steps, replicas), np.int64)
    every = np.arange(steps)
    for j in range(per_step):
        rank = np.where(counts < batch_size, loads, np.inf).argmin(axis=1)
        out[every, rank, counts[every, rank]] = chunks[:, j]
        loads[every, rank] += c[:, j]
        counts[every, rank] += 1
    return out


def _attention_plan(rows, costs, batch_size, replicas, rng, shuffle) -> np.ndarray:
    """Steps of rows of similar cost, dealt largest first, in a random step order."""
    per_step = batch_size * replicas
    c = costs[rows]
    if shuffle:
        # sort on log-cost bands of width COST_BAND with a random phase; `rows` is already in
        # random order, so the stable sort leaves each band's rows in a fresh order every epoch
        band = np.floor(np.log(np.maximum(c, 1e-300)) / np.log1p(COST_BAND) + rng.random())
        rows = rows[np.argsort(-band, kind="stable")]
    else:
        rows = rows[np.argsort(-c, kind="stable")]
    plan = _deal_greedy(rows.reshape(-1, per_step), costs, batch_size)
    if shuffle:
        plan = plan[rng.permutation(len(plan))]
        # no rank always takes the heaviest row of its step
        ranks = rng.permuted(np.tile(np.arange(replicas), (len(plan), 1)), axis=1)
        plan = np.take_along_axis(plan, ranks[:, :, None], axis=1)
    return np.ascontiguousarray(plan)


def slowest_rank_total(plan: np.ndarray, costs: np.ndarray) -> float:
    """Σ over steps of the largest per-rank cost: the modeled time of the epoch."""
    if plan.size == 0:
        return 0.0
    return float(costs[plan].sum(axis=2).max(axis=1).sum())


def efficiency(plan: np.ndarray, costs: np.ndarray) -> float:
    """Modeled data-parallel efficiency of a plan `[steps, W, b]`: (Σ cost / W) / Σ_steps max_rank.

    1.0 means no rank ever waits; 0.8 means a fifth of the ranks' time is spent waiting.
    """
    slowest = slowest_rank_total(plan, costs)
    if slowest == 0:
        return 1.0
    return float(costs[plan].sum()) / plan.shape[1] / slowest


def plan_epoch(
    lengths: np.ndarray,
    costs: np.ndarray | None,
    batch_size: int,
    num_replicas: int = 1,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    balance="attention",
) -> np.ndarray:
    """`plan_batches` on precomputed per-row tokens (`lengths`) and `costs` (attention only)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    mode = _mode(balance)
    lengths = np.asarray(lengths, np.int64)
    per_step = batch_size * num_replicas
    rng = np.random.default_rng([seed, epoch])
    rows = _epoch_rows(len(lengths), per_step, rng, shuffle, drop_last)
    chunks = rows.reshape(-1, per_step)
    by_tokens = _deal_snake(chunks, lengths if mode != "none" else None, batch_size)
    if mode != "attention":
        return by_tokens
    if costs is None:
        raise ValueError("balance='attention' needs the rows' costs")
    costs = np.asarray(costs, np.float64)
    if costs.shape != lengths.shape:
        raise ValueError(f"{costs.size} costs for {lengths.size} rows")
    plan = _attention_plan(rows, costs, batch_size, num_replicas, rng, shuffle)
    # same rows, other grouping: keep the tokens plan in the rare case (tiny epochs) it models
    # better, so that balancing by attention is never worse than by tokens
    if slowest_rank_total(by_tokens, costs) < slowest_rank_total(plan, costs) * (1 - 1e-9):
        return by_tokens
    return plan


def balance_inputs(
    rows,
    balance="attention",
    hidden_size: int = DEFAULT_HIDDEN_SIZE,
    cost: Callable[[np.ndarray], float] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(tokens per row, costs per row or None) of `rows` as `plan_batches` takes them."""
    mode = _mode(balance)
    if hasattr(rows, "segment_lengths") and mode != "attention" and hasattr(rows, "lengths"):
        return np.asarray(rows.lengths, np.int64), None  # no need to read the segments
    flat = not hasattr(rows, "segment_lengths") and (
        len(rows) == 0 or np.ndim(rows[0]) == 0  # a sequence of row lengths
    )
    if flat:
        if mode == "attention" and len(rows):
            raise ValueError(
                "balance='attention' needs each row's segment lengths: pass a PackedDataset or "
                "per-row sequences of segment lengths, or use balance='tokens'"
            )
        lengths = np.asarray(rows, np.int64).reshape(-1)
        return lengths, np.zeros(0) if mode == "attention" else None
    offsets, seg = row_segments(rows)
    costs = row_costs(offsets, seg, hidden_size, cost) if mode == "attention" else None
    return row_tokens(offsets, seg), costs


def plan_batches(
    rows,
    batch_size: int,
    num_replicas: int = 1,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    balance: str | bool = "attention",
    hidden_size: int = DEFAULT_HIDDEN_SIZE,
    cost: Callable[[np.ndarray], float] | None = None,
) -> np.ndarray:
    """Row indices of every batch of an epoch, int64 `[steps, num_replicas, batch_size]`.

    `plan[s, r]` is the batch rank r trains on at step s. `rows` is a `PackedDataset`, per-row
    sequences of segment lengths, or (for `balance="tokens"` or `False`) a sequence of row
    lengths.

    1. Rows are visited in a random order drawn from `(seed, epoch)` (or in order without
       `shuffle`) and cut into steps of `batch_size * num_replicas` rows. When they do not fill
       the last step, `drop_last=True` leaves the rest out (every row at most once) and
       `drop_last=False` repeats rows from the start of that order (every row at least once).
    2. `balance="attention"` (default) regroups these rows: sorted by `row_costs` (rows within
       0.5% of each other in a fresh random order every epoch), cut into steps of similar cost,
       each step's rows dealt largest first to the least-loaded rank, steps and ranks shuffled.
       `"tokens"` (or `True`) sorts each step by tokens and deals rounds of W rows in snake
       order, so the token loads of two ranks differ by at most the step's longest minus
       shortest row. `False` deals the step as drawn.
    """
    lengths, costs = balance_inputs(rows, balance, hidden_size, cost)
    return plan_epoch(
        lengths,
        costs,
        batch_size,
        num_replicas,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        drop_last=drop_last,
        balance=balance,
    )


def compare_balance(
    offsets: np.ndarray,
    lengths: np.ndarray,
    world_size: int,
    batch_size: int = 1,
    hidden_size: int = DEFAULT_HIDDEN_SIZE,
    seed: int = 0,
    epoch: int = 0,
) -> dict:
    """Modeled efficiency of one epoch balanced by tokens and by attention, on rows as CSR."""
    tokens = row_tokens(offsets, lengths)
    costs = row_costs(offsets, lengths, hidden_size)
    out = {}
    for mode in BALANCES:
        plan = plan_epoch(
            tokens, costs, batch_size, world_size, seed=seed, epoch=epoch, balance=mode
        )
        out[mode] = efficiency(plan, costs)
    return out
