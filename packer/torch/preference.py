"""Preference losses on packed pairs: per-segment log-probabilities grouped by pair.

A `pack --pairs` row holds whole pairs, prompt + chosen then prompt + rejected, adjacent. From
a packed batch's logits, `segment_logps` sums each segment's target log-probabilities (the
completion's: the prompt is labelled -100) and counts them; `pair_logps` groups them into
chosen and rejected per pair. A DPO loss is then a few lines on `[P]` tensors, the same numbers
a padded batch gives, without the padding:

    batch = collate_pairs(rows)                      # rows of PackedDataset(pairs output)
    logits = policy(**model_inputs(batch)).logits
    policy_lp = pair_logps(logits, batch)
    with torch.no_grad():
        ref_lp = pair_logps(reference(**model_inputs(batch)).logits, batch)
    loss = dpo_loss(policy_lp, ref_lp, beta=0.1).mean()

A reward model scores each segment at its last real token (`last_token_scores`) and takes
the Bradley-Terry loss of the two scores of each pair (`reward_loss`).

Segments are numbered in batch order (row by row, segment by segment); each row's stored
padding belongs to no segment. A segment's pair and side come from the shards' `pair_index`
and `pair_side` (or from `sample_index`, which is `2 x pair_index + pair_side`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from packer.contract.names import IGNORE_INDEX
from packer.torch.collate import collate_packed

LOSS_TYPES = ("sigmoid", "ipo", "hinge")


def _pairs_of(row: dict) -> tuple[np.ndarray, np.ndarray]:
    """(pair index, side) of each real segment of a row."""
    if "pair_index" in row and "pair_side" in row:
        return np.asarray(row["pair_index"], np.int64), np.asarray(row["pair_side"], np.int64)
    sample = np.asarray(row["sample_index"], np.int64)
    return sample // 2, sample % 2


def collate_pairs(rows: Sequence[dict], mode: str = "flatten", **kwargs) -> dict:
    """`collate_packed` for rows of a pairs output, plus what the preference losses need.

    Adds `segment_ids` (int64, the shape of `input_ids`: the segment of each position in batch
    order, -1 on padding), `pair_index` and `pair_side` (int64 `[S]`, per segment). Raises
    `ValueError` when a pair is not whole and adjacent (chosen then rejected) in its row.
    """
    batch = collate_packed(rows, mode, **kwargs)
    pair_parts, side_parts = [], []
    seg_ids = torch.full(batch["input_ids"].shape, -1, dtype=torch.int64)
    first = 0
    for i, row in enumerate(rows):
        pair, side = _pairs_of(row)
        if pair.size % 2 or (side[0::2] != 0).any() or (side[1::2] != 1).any():
            raise ValueError(
                f"row {i} of the batch does not hold whole pairs, chosen then rejected"
            )
        if (pair[0::2] != pair[1::2]).any():
            raise ValueError(f"row {i} of the batch has a pair whose sides are not adjacent")
        cu = np.asarray(row["cu_seqlens"], np.int64)[: pair.size + 1]
        ids = np.repeat(np.arange(first, first + pair.size), np.diff(cu))
        if mode == "flatten":
            start = int((seg_ids[0] >= 0).sum())
            seg_ids[0, start : start + ids.size] = torch.from_numpy(ids)
        else:
            seg_ids[i, : ids.size] = torch.from_numpy(ids)
        first += pair.size
        pair_parts.append(pair)
        side_parts.append(side)
    batch["segment_ids"] = seg_ids
    batch["pair_index"] = torch.from_numpy(np.concatenate(pair_parts))
    batch["pair_side"] = torch.from_numpy(np.concatenate(side_parts))
    return batch


def segment_logps(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each segment's targets, their count), fp32 `[S]` each.

    `logits` `[B, T, V]` at position t predict `labels[t + 1]` (the stored, unshifted labels);
    a target belongs to the segment of its own position. The first label of every segment is
    -100, so no target crosses a segment or row boundary.
    """
    labels = batch["labels"].to(logits.device)
    segments = batch["segment_ids"].to(logits.device)
    vocab = logits.shape[-1]
    targets = labels[:, 1:]
    nll = F.cross_entropy(
        logits[:, :-1].float().reshape(-1, vocab),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    counted = (targets != IGNORE_INDEX).reshape(-1)
    seg = segments[:, 1:].reshape(-1)
    keep = counted & (seg >= 0)
    n = int(batch["pair_index"].numel())
    logps = torch.zeros(n, dtype=torch.float32, device=logits.device)
    logps = logps.index_add(0, seg[keep], -nll[keep])
    counts = torch.zeros(n, dtype=torch.float32, device=logits.device)
    counts = counts.index_add(0, seg[keep], torch.ones_like(nll[keep]))
    return logps, counts


@dataclass
class PairLogps:
    """Per pair, in batch order: summed log-probabilities and target counts of both sides."""

    chosen: torch.Tensor  # [P]
    rejected: torch.Tensor  # [P]
    chosen_tokens: torch.Tensor  # [P]
    rejected_tokens: torch.Tensor  # [P]
    pair_index: torch.Tensor  # [P] int64: the pairs' input rows


def pair_logps(logits: torch.Tensor, batch: dict) -> PairLogps:
    """`segment_logps` grouped by pair (a batch from `collate_pairs`)."""
    logps, counts = segment_logps(logits, batch)
    return PairLogps(
        logps[0::2], logps[1::2], counts[0::2], counts[1::2], batch["pair_index"][0::2]
    )


def dpo_loss(
    policy: PairLogps,
    reference: PairLogps | None = None,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The DPO loss of each pair, `[P]` (take `.mean()`, or `.sum()` over a step).

    `reference=None` is the reference-free variant (reference log-probabilities 0). Loss types,
    as TRL defines them: `sigmoid` (DPO; `label_smoothing` gives the conservative variant),
    `hinge` (SLiC), `ipo` (IPO, on the log-probabilities averaged per target token).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r} (choose from {', '.join(LOSS_TYPES)})")
    chosen, rejected = policy.chosen, policy.rejected
    ref_chosen = reference.chosen if reference is not None else torch.zeros_like(chosen)
    ref_rejected = reference.rejected if reference is not None else torch.zeros_like(rejected)
    if loss_type == "ipo":
        chosen, rejected = chosen / policy.chosen_tokens, rejected / policy.rejected_tokens
        if reference is not None:
            ref_chosen = ref_chosen / reference.chosen_tokens
            ref_rejected = ref_rejected / reference.rejected_tokens
    logits = (chosen - rejected) - (ref_chosen.to(chosen) - ref_rejected.to(rejected))
    if loss_type == "sigmoid":
        return (
            -F.logsigmoid(beta * logits) * (1 - label_smoothing)
            - F.logsigmoid(-beta * logits) * label_smoothing
        )
    if loss_type == "hinge":
        return torch.relu(1 - beta * logits)
    return (logits - 1 / (2 * beta)) ** 2


def last_token_scores(scores: torch.Tensor, batch: dict) -> torch.Tensor:
    """Each segment's score at its last real token, `[S]`: `scores` `[B, T]` (or `[B, T, 1]`),
    e.g. a reward head on a packed batch's hidden states. As a padded reward model pools the
    last non-padding token of each sequence, with no padding to skip."""
    if scores.dim() == 3:
        scores = scores.squeeze(-1)
    segments = batch["segment_ids"].to(scores.device)
    flat_seg = segments.reshape(-1)
    positions = torch.arange(flat_seg.numel(), device=scores.device)
    n = int(batch["pair_index"].numel())
    last = torch.full((n,), -1, dtype=torch.int64, device=scores.device)
    real = flat_seg >= 0
    last = last.scatter_reduce(0, flat_seg[real], positions[real], reduce="amax")
    return scores.reshape(-1)[last]


def reward_loss(segment_scores: torch.Tensor, margin: torch.Tensor | None = None) -> torch.Tensor:
    """The Bradley-Terry loss of each pair, `[P]`: -log sigmoid(chosen - rejected [- margin]),
    from the `[S]` scores of `last_token_scores` (chosen and rejected alternate)."""
    diff = segment_scores[0::2] - segment_scores[1::2]
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff)
