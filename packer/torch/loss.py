"""Loss normalisation: one mean over every loss token of an optimizer step.

Packed rows hold different numbers of loss tokens, so averaging per micro-batch means (or per
rank means) weights tokens unequally. The per-token mean of one optimizer step is

    loss_step = (sum over micro-batches k and ranks r of S_kr) / N

where S_kr is the summed token cross-entropy of micro-batch k on rank r (`sum_token_loss`) and
N the loss tokens of the whole step (`step_loss_tokens`: `num_loss_tokens` summed over the
step's micro-batches and all-reduced over ranks). On each rank, backpropagate
`S_kr * world_size / N` for every micro-batch: DDP/FSDP average gradients over ranks, which
divides the world_size back out. With a transformers model, `model(**inputs,
num_items_in_batch=N).loss` is `S_kr / N`.

Per-sample averaging (each sample's mean loss counts once, however long the sample): collate
with `collate_packed(rows, loss_weighting="sample")` and backpropagate
`sum_token_loss(logits, labels, loss_weights=batch["loss_weights"]) / N`, N the step's `num_items_in_batch`
(`step_loss_tokens(batches, key="num_items_in_batch")`: the samples with a loss token). With
`loss_weighting="token"` the same two calls give the per-token mean above.

`num_loss_tokens` counts labels != -100. The first label of every row is -100 (the first label
of every sample is), so it equals the number of targets after the model's shift.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from packer.contract.names import IGNORE_INDEX


def sum_token_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    *,
    loss_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy summed over every target of a batch, with the causal shift; each target
    weighted by `loss_weights` (the batch's, from `collate_packed(..., loss_weighting=...)`,
    aligned with `labels`) when given.

    `logits` `[B, T, V]` at position t predict `labels[:, t + 1]` (labels unshifted, as stored).
    In a flattened batch the shift also crosses row boundaries; that is safe because the first
    label of every row is -100.
    """
    vocab = logits.shape[-1]
    shifted = logits[..., :-1, :].float().reshape(-1, vocab)
    targets = labels[..., 1:].reshape(-1).to(shifted.device)
    if loss_weights is None:
        return F.cross_entropy(shifted, targets, ignore_index=ignore_index, reduction="sum")
    ce = F.cross_entropy(shifted, targets, ignore_index=ignore_index, reduction="none")
    weights = loss_weights[..., 1:].reshape(-1).to(device=ce.device, dtype=ce.dtype)
    return (ce * weights).sum()


def step_loss_tokens(
    batches: Iterable[dict],
    *,
    all_reduce: bool | None = None,
    device: torch.device | str | None = None,
    key: str = "num_loss_tokens",
) -> int:
    """Loss tokens of one optimizer step: `num_loss_tokens` of its micro-batches, all ranks
    (`key="num_items_in_batch"`: the divisor of a `loss_weighting` batch instead).

    `all_reduce=None` sums over ranks when `torch.distributed` is initialised; `device` is where
    the all-reduce tensor lives (the rank's GPU with NCCL).
    """
    total = sum(int(b[key]) for b in batches)
    dist = torch.distributed
    if all_reduce is None:
        all_reduce = dist.is_available() and dist.is_initialized()
    if all_reduce:
        t = torch.tensor(total, dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        total = int(t.item())
    return total
