"""A batch sampler for several ranks: the same number of equal-sized batches on every rank.

Uneven numbers of batches across ranks hang data-parallel runs (a rank that finishes early never
joins the next collective), and uneven compute makes every step wait for its slowest rank. Every
epoch is planned globally by `packer.planning.balance.plan_batches` (numpy only, so `packer plan` can
model the same plans without torch), then split:

1. Rows are shuffled with a generator seeded by `(seed, epoch)` (or kept in order) and cut into
   steps of `batch_size * num_replicas` rows. When the rows do not fill the last step:
   `drop_last=True` drops the remainder (every row at most once, some rows unseen this epoch);
   `drop_last=False` (default) fills it by repeating rows from the start of the shuffled order
   (every row at least once, a few twice; repeated rows count twice in the loss).
2. `balance="attention"` (default) regroups those rows into steps of similar modeled compute,
   `tokens + Σ l² / (12 · hidden_size)` over each row's samples, deals each step largest first
   to the least-loaded rank and shuffles the step order; `balance="tokens"` sorts each step by
   tokens and deals it in snake order. See docs/balance.md.

Every rank computes the same plan and takes its own slice: no communication.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch.distributed
import torch.utils.data

from packer.planning.balance import DEFAULT_HIDDEN_SIZE, balance_inputs, plan_batches, plan_epoch

__all__ = ["PackedBatchSampler", "plan_batches"]


def _dist_default(value: int | None, getter) -> int:
    if value is not None:
        return value
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return getter()
    return 0 if getter is torch.distributed.get_rank else 1


class PackedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of `batch_size` row indices for one rank; pass as DataLoader `batch_sampler=`.

    `dataset` is a `PackedDataset`, per-row sequences of segment lengths, or (for
    `balance="tokens"`) a sequence of row lengths. `num_replicas` and `rank` default to
    torch.distributed's world size and rank (1 and 0 when it is not initialised). Call
    `set_epoch(epoch)` before each epoch: the order is deterministic for (seed, epoch), and
    `len()` is the same on every rank. `balance`: "attention" (default, compute by
    `hidden_size`, or `cost(segment_lengths) -> float` per row), "tokens" (or True), False.
    """

    def __init__(
        self,
        dataset,
        batch_size: int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        balance: str | bool = "attention",
        hidden_size: int = DEFAULT_HIDDEN_SIZE,
        cost: Callable[[np.ndarray], float] | None = None,
    ):
        self.lengths, self.costs = balance_inputs(dataset, balance, hidden_size, cost)
        self.batch_size = batch_size
        self.num_replicas = _dist_default(num_replicas, torch.distributed.get_world_size)
        self.rank = _dist_default(rank, torch.distributed.get_rank)
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is not in [0, {self.num_replicas})")
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.balance = balance
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def plan(self) -> np.ndarray:
        """This epoch's plan for all ranks, `[steps, num_replicas, batch_size]`."""
        return plan_epoch(
            self.lengths,
            self.costs,
            self.batch_size,
            self.num_replicas,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            balance=self.balance,
        )

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.plan()[:, self.rank]:
            yield batch.tolist()

    def __len__(self) -> int:
        n, per_step = len(self.lengths), self.batch_size * self.num_replicas
        return n // per_step if self.drop_last else -(-n // per_step)
