"""A batch sampler for several ranks: the same number of equal-sized batches on every rank.

Uneven numbers of batches across ranks hang data-parallel runs (a rank that finishes early never
joins the next collective). Here every epoch is planned globally, then split:

1. Rows are shuffled with a generator seeded by `(seed, epoch)` (or kept in order), so the plan
   is a pure function of (lengths, batch_size, num_replicas, seed, epoch, drop_last).
2. The order is cut into steps of `batch_size * num_replicas` rows. When the rows do not fill the
   last step: `drop_last=True` drops the remainder (every row at most once, some rows unseen this
   epoch); `drop_last=False` (default) fills it by repeating rows from the start of the shuffled
   order (every row at least once, a few twice; repeated rows count twice in the loss).
3. Within a step, rows are sorted by tokens and dealt to ranks in snake order (0..W-1, W-1..0,
   ...), so every rank gets exactly `batch_size` rows and the token loads of any two ranks differ
   by at most (longest - shortest row of the step).

Every rank computes the same plan and takes its own slice: no communication.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch.distributed
import torch.utils.data


def plan_batches(
    lengths: Sequence[int] | np.ndarray,
    batch_size: int,
    num_replicas: int = 1,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    balance: bool = True,
) -> np.ndarray:
    """Row indices of every batch of an epoch, int64 `[steps, num_replicas, batch_size]`.

    `plan[s, r]` is the batch rank r trains on at step s. See the module doc for the rules.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    lengths = np.asarray(lengths, np.int64)
    n = len(lengths)
    per_step = batch_size * num_replicas
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(n)
    else:
        order = np.arange(n, dtype=np.int64)
    if drop_last or n == 0:
        steps = n // per_step
        order = order[: steps * per_step]
    else:
        steps = -(-n // per_step)
        fill = steps * per_step - n
        order = np.concatenate([order, order[np.arange(fill) % n]])
    chunks = order.reshape(steps, per_step)
    if balance:
        by_tokens = np.argsort(-lengths[chunks], axis=1, kind="stable")
        chunks = np.take_along_axis(chunks, by_tokens, axis=1)
    # deal round j of W rows to ranks 0..W-1, reversed on odd rounds (snake)
    rounds = chunks.reshape(steps, batch_size, num_replicas).copy()
    rounds[:, 1::2, :] = rounds[:, 1::2, ::-1]
    return np.ascontiguousarray(rounds.transpose(0, 2, 1))


def _dist_default(value: int | None, getter) -> int:
    if value is not None:
        return value
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return getter()
    return 0 if getter is torch.distributed.get_rank else 1


class PackedBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of `batch_size` row indices for one rank; pass as DataLoader `batch_sampler=`.

    `dataset` is a `PackedDataset` (its `lengths` are used to balance tokens) or a sequence of
    row lengths. `num_replicas` and `rank` default to torch.distributed's world size and rank
    (1 and 0 when it is not initialised). Call `set_epoch(epoch)` before each epoch: the order is
    deterministic for (seed, epoch), and `len()` is the same on every rank.
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
        balance: bool = True,
    ):
        self.lengths = np.asarray(getattr(dataset, "lengths", dataset), np.int64)
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
        return plan_batches(
            self.lengths,
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
