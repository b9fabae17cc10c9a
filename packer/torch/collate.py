"""`collate_packed`: packed rows to the tensors a trainer feeds the model.

Two layouts:

- `flatten`: the rows of a batch are concatenated into one `[1, T]` sequence (stored padding
  dropped). Returns `input_ids`, `labels`, `position_ids` and the varlen flash-attention kwargs
  transformers accepts: `cu_seq_lens_q`, `cu_seq_lens_k` (int32, `[0, ..., T]`) and
  `max_length_q`, `max_length_k` (Python ints). Works with transformers' flash path (explicit
  cu_seq_lens) and its sdpa/eager paths (packing detected from `position_ids` when no
  `attention_mask` is passed).
- `pad`: `[B, L]` tensors, L the longest row (rounded up to `pad_to_multiple_of`). Padding is
  `pad_id` in `input_ids`, -100 in `labels`, and one final segment per row: its `position_ids`
  restart at 0 (or continue the row's stored padding segment), so padding is never part of a
  sample. `cu_seqlens` is `[B, S + 1]` int32 per-row boundaries ending at L; rows with fewer
  segments repeat L (empty segments). On sdpa/eager, transformers isolates each row's samples
  from `position_ids`; its flash path does NOT isolate `[B > 1, L]` batches without a mask, so
  use `flatten` with flash attention.

Both add `num_loss_tokens` (the labels that count in this batch, the sum of the rows' column)
and `seq_idx` (int32, the shape of `input_ids`): the sample each token belongs to, numbered
from 0 through the batch in `flatten` (as transformers' `DataCollatorWithFlattening(
return_seq_idx=True)` numbers it) and through each row in `pad` (the padding segment has its
own number). Mamba2 and short-convolution layers keep packed samples apart only through it (the
CUDA kernels of mamba_ssm and causal_conv1d read it); Gated DeltaNet layers read
`cu_seq_lens_q` (flash-linear-attention). Attention layers ignore it.

`loss_weighting="token"` or `"sample"` adds `loss_weights` (float32, the shape of `labels`: the
weight of the target at each label position, 0 where the label is -100) and
`num_items_in_batch`: "token" weighs every loss token 1 and divides by the loss tokens (one mean
over the batch's tokens, what a plain mean over the unpacked samples' concatenated tokens
gives); "sample" weighs sample i's loss tokens 1 / n_i and divides by the samples that have a
loss token (the mean over samples of each sample's mean loss). `sum_token_loss(logits, labels,
loss_weights=batch["loss_weights"]) / batch["num_items_in_batch"]` is that loss.

Rows of a CP output (`pack --cp-size N`, which carry `cu_seqlens_padded`) collate with
`flatten` only: every sample keeps its CP padding, so the batch is the THD layout that
`cp_shard` splits across CP ranks. `cu_seq_lens_q/k` and `max_length_q/k` are then the padded
boundaries (a varlen kernel without CP sees each sample followed by its padding, which no real
token attends to under causal attention), and the batch adds `cu_seqlens` (the cumulative real
lengths) and `cu_seqlens_padded` (the same tensor as `cu_seq_lens_q`), both int32.
`model_inputs(batch)` drops it (and other non-model keys) and adds `use_cache=False`: with a
cache (the default of most configs, `LlamaConfig` included) transformers skips its detection
of packed samples in `position_ids`, and the samples of a row silently attend to each other.
Label convention (from the shards): unshifted, the model shifts; the first label of every
sample is -100, so after the shift no position predicts a token of another sample or row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from packer.contract.names import IGNORE_INDEX

MODES = ("flatten", "pad")
# keys a transformers causal LM accepts; everything else a collated batch holds is metadata
MODEL_KEYS = (
    "input_ids",
    "labels",
    "position_ids",
    "attention_mask",
    "cu_seq_lens_q",
    "cu_seq_lens_k",
    "max_length_q",
    "max_length_k",
    "seq_idx",
)
LOSS_WEIGHTINGS = ("token", "sample")


def _real_segments(row: dict) -> int:
    """Segments of real samples in a row; a stored padding segment is the one beyond them."""
    if "sample_index" in row:
        return len(row["sample_index"])
    return len(row["cu_seqlens"]) - 1


def _flatten(rows: Sequence[dict]) -> dict:
    cp = "cu_seqlens_padded" in rows[0]
    ids, labels, pos, cu, real = [], [], [], [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    seq_idx = []
    total = total_real = samples = 0
    for row in rows:
        segs = _real_segments(row)
        row_cu = np.asarray(row["cu_seqlens"], np.int64)
        # a CP row's segments lie at its padded boundaries; its real lengths are `cu_seqlens`
        row_bounds = np.asarray(row["cu_seqlens_padded"], np.int64) if cp else row_cu
        n = int(row_bounds[segs])  # drops stored padding, if any
        ids.append(row["input_ids"][:n])
        labels.append(row["labels"][:n])
        pos.append(row["position_ids"][:n])
        cu.append(row_bounds[1 : segs + 1] + total)
        real.append(row_cu[1 : segs + 1] + total_real)
        seq_idx.append(
            np.repeat(np.arange(samples, samples + segs), np.diff(row_bounds[: segs + 1]))
        )
        samples += segs
        total += n
        total_real += int(row_cu[segs])
    cu_seqlens = torch.from_numpy(np.concatenate(cu).astype(np.int32))
    max_length = int(torch.diff(cu_seqlens).max()) if len(cu_seqlens) > 1 else 0
    batch = {
        "input_ids": torch.from_numpy(np.concatenate(ids).astype(np.int64))[None],
        "labels": torch.from_numpy(np.concatenate(labels).astype(np.int64))[None],
        "position_ids": torch.from_numpy(np.concatenate(pos).astype(np.int64))[None],
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_length,
        "max_length_k": max_length,
        "seq_idx": torch.from_numpy(np.concatenate(seq_idx).astype(np.int32))[None],
    }
    if cp:
        batch["cu_seqlens"] = torch.from_numpy(np.concatenate(real).astype(np.int32))
        batch["cu_seqlens_padded"] = cu_seqlens
    return batch


def _pad(rows: Sequence[dict], pad_id: int, pad_to_multiple_of: int | None) -> dict:
    b = len(rows)
    length = max(len(r["input_ids"]) for r in rows)
    if pad_to_multiple_of:
        length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
    ids = np.full((b, length), pad_id, np.int64)
    labels = np.full((b, length), IGNORE_INDEX, np.int64)
    pos = np.zeros((b, length), np.int64)
    row_cus = []
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = row["input_ids"]
        labels[i, :n] = row["labels"]
        pos[i, :n] = row["position_ids"]
        cu = np.asarray(row["cu_seqlens"], np.int64)
        if n < length:
            has_pad_segment = len(cu) - 1 > _real_segments(row)
            # extend the row's stored padding segment, or open a new one at position 0
            first = int(row["position_ids"][n - 1]) + 1 if has_pad_segment and n else 0
            pos[i, n:] = np.arange(first, first + length - n)
            cu = np.append(cu[:-1], length) if has_pad_segment else np.append(cu, length)
        row_cus.append(cu)
    width = max(len(c) for c in row_cus)
    cu_seqlens = np.full((b, width), length, np.int32)
    seq_idx = np.zeros((b, length), np.int32)
    for i, cu in enumerate(row_cus):
        cu_seqlens[i, : len(cu)] = cu
        seq_idx[i] = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(pos),
        "cu_seqlens": torch.from_numpy(cu_seqlens),
        "seq_idx": torch.from_numpy(seq_idx),
    }


def collate_packed(
    rows: Sequence[dict],
    mode: str = "flatten",
    *,
    pad_id: int = 0,
    pad_to_multiple_of: int | None = None,
    loss_weighting: str | None = None,
) -> dict:
    """Collate rows of a `PackedDataset` (or dicts with the same columns, such as the rows
    `streaming.StreamingDataset` reads from a `packer export --to mds`) into one batch.

    `mode="flatten"` returns `[1, T]` tensors plus `cu_seq_lens_q/k` and `max_length_q/k`;
    `mode="pad"` returns `[B, L]` tensors plus per-row `cu_seqlens` `[B, S + 1]`. Both return
    `num_loss_tokens` (int) and `seq_idx`. Token tensors are int64; `cu_seq*` and `seq_idx`
    tensors are int32. `loss_weighting="token"|"sample"` adds `loss_weights` and
    `num_items_in_batch` (module docstring). Use `functools.partial(collate_packed,
    mode="pad")` as a DataLoader `collate_fn`.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
    if loss_weighting is not None and loss_weighting not in LOSS_WEIGHTINGS:
        raise ValueError(
            f"loss_weighting: unknown {loss_weighting!r} (choose from "
            f"{', '.join(LOSS_WEIGHTINGS)}, or None)"
        )
    if not rows:
        raise ValueError("cannot collate an empty batch")
    missing = [k for k in ("input_ids", "labels", "position_ids", "cu_seqlens") if k not in rows[0]]
    if missing:
        raise KeyError(
            f"packed rows lack {', '.join(missing)}; with a Hugging Face Trainer, set "
            "remove_unused_columns=False so the collator sees every column"
        )
    cp_rows = ["cu_seqlens_padded" in r for r in rows]
    if any(cp_rows) and not all(cp_rows):
        raise ValueError(
            "rows: some come from a CP output (with cu_seqlens_padded) and some do not; "
            "collate rows of one output"
        )
    if mode == "pad" and cp_rows[0]:
        raise ValueError(
            "mode: rows of a CP output (with cu_seqlens_padded) collate with mode='flatten', "
            "the THD layout that context parallelism splits"
        )
    if mode == "pad" and pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}")
    batch = _flatten(rows) if mode == "flatten" else _pad(rows, pad_id, pad_to_multiple_of)
    batch["num_loss_tokens"] = sum(_loss_tokens(r) for r in rows)
    if loss_weighting is not None:
        batch["loss_weights"], batch["num_items_in_batch"] = _loss_weights(
            batch["labels"], batch["seq_idx"], loss_weighting
        )
    return batch


def _loss_weights(labels: torch.Tensor, seq_idx: torch.Tensor, kind: str):
    """(weights, divisor): 1 per loss token and the loss tokens ("token"), or 1 / n_i per loss
    token of sample i and the samples with a loss token ("sample")."""
    counts = labels != IGNORE_INDEX
    if kind == "token":
        return counts.float(), int(counts.sum())
    # a sample is a segment of one row: number them through the batch
    per_row = seq_idx.amax(dim=1).long() + 1
    segment = (seq_idx.long() + (per_row.cumsum(0) - per_row)[:, None]).reshape(-1)
    n = torch.bincount(segment, weights=counts.reshape(-1).double())
    weights = torch.where(counts.reshape(-1), 1.0 / n.clamp(min=1)[segment], 0.0)
    return weights.reshape(labels.shape).float(), int((n > 0).sum())


def _loss_tokens(row: dict) -> int:
    """The row's `num_loss_tokens` column, or its count of counting labels where a reader does
    not carry the column (an MDS export read with streaming's StreamingDataset)."""
    if "num_loss_tokens" in row:
        return int(row["num_loss_tokens"])
    segs = _real_segments(row)
    bounds = row["cu_seqlens_padded"] if "cu_seqlens_padded" in row else row["cu_seqlens"]
    return int(np.count_nonzero(np.asarray(row["labels"][: int(bounds[segs])]) != IGNORE_INDEX))


def model_inputs(batch: dict) -> dict:
    """The keys of a collated batch that a transformers causal LM accepts, plus `use_cache=False`.

    transformers finds the packed samples in `position_ids` only when no cache is built; its
    `use_cache` defaults to `config.use_cache`, True for most checkpoints, so it is always
    switched off here (training never needs the cache).
    """
    inputs = {k: v for k, v in batch.items() if k in MODEL_KEYS}
    inputs["use_cache"] = False
    return inputs


def block_causal_mask(batch: dict, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A `[B, 1, T, T]` additive block-diagonal causal mask from the batch's segment boundaries.

    For attention paths that do not read `position_ids` or `cu_seq_lens` (or to make the
    boundaries explicit): position q may attend to k iff k <= q and both lie in the same
    segment. The mask is 0 there and the dtype's minimum elsewhere, in `dtype` (pass the
    model's, e.g. `torch.bfloat16`): eager attention adds the mask to the scores and sdpa
    accepts it too, so it isolates on both. A 4D mask is used by transformers as it is.
    `dtype=torch.bool` gives the boolean form (True = attend), which only sdpa reads right:
    eager adds it as 1 / 0 and masks nothing.
    """
    cu = batch["cu_seq_lens_q"][None] if "cu_seq_lens_q" in batch else batch["cu_seqlens"]
    length = batch["input_ids"].shape[-1]
    pos = torch.arange(length, device=cu.device)
    # segment id of each position: how many boundaries (after the leading 0) are <= it
    seg = torch.searchsorted(
        cu[:, 1:].contiguous(), pos.expand(cu.shape[0], -1).contiguous(), right=True
    )
    same = seg[:, :, None] == seg[:, None, :]
    mask = (same & (pos[None, :, None] >= pos[None, None, :]))[:, None]
    if dtype == torch.bool:
        return mask
    if not dtype.is_floating_point:
        raise ValueError(f"block_causal_mask needs a float dtype (or torch.bool), got {dtype}")
    zero = torch.zeros((), dtype=dtype, device=cu.device)
    return torch.where(mask, zero, torch.finfo(dtype).min)
