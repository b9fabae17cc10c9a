"""`cp_shard`: one context-parallel rank's share of a collated batch, with its attention kwargs.

Context parallelism (CP) splits every sample of a THD batch (the `flatten` layout of
`collate_packed`) into `2 x cp_size` equal chunks; rank r holds chunks r and `2 x cp_size - 1 - r`
of each (`packer.planning.cp.zigzag_index`), so that causal attention costs every rank the same.
The attention kernels then want boundary arrays in their own conventions, read from their
sources (docs/context-parallel.md names the versions):

- Transformer Engine's `DotProductAttention.forward(q, k, v, **shard["te_kwargs"])` with
  `qkv_format="thd"`: `cu_seqlens_q/kv` the **global** cumulative real lengths,
  `cu_seqlens_q/kv_padded` the **global** padded boundaries, `max_seqlen_q/kv` the longest
  padded sample; TE divides them by `cp_size` itself.
- ring-flash-attn's `zigzag_ring_flash_attn_varlen_func(q, k, v, **shard["ring_flash_attn_kwargs"])`:
  `cu_seqlens` the **local** boundaries (the padded ones over `cp_size`) and `max_seqlen` the
  longest padded sample over `cp_size`.

Labels are shifted here, before the split: a rank holds two chunks per sample and the target of
a chunk's last token is the first token of a chunk on another rank, so no rank could shift its
own labels. `labels` (and `shift_labels`, the same tensor, the name transformers' loss takes
without shifting again) is the target of every local token: -100 on padding and on each sample's
last token, so the rank-local losses summed over ranks are the unsplit batch's loss.
"""

from __future__ import annotations

import numpy as np
import torch

from packer.contract.names import IGNORE_INDEX
from packer.planning.cp import zigzag_index


def _boundaries(batch: dict, cp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's (real, padded) cumulative lengths, int32, after checking that it splits."""
    ids = batch.get("input_ids")
    flat = "cu_seqlens_padded" in batch or "cu_seq_lens_q" in batch
    if ids is None or ids.dim() != 2 or ids.shape[0] != 1 or not flat:
        raise ValueError(
            "batch: cp_shard takes a batch collated with mode='flatten' "
            "(input_ids [1, T] with cu_seqlens_padded or cu_seq_lens_q)"
        )
    if "cu_seqlens_padded" in batch:
        padded, real = batch["cu_seqlens_padded"], batch["cu_seqlens"]
    else:  # a plain output: real and padded boundaries coincide
        padded = real = batch["cu_seq_lens_q"]
    padded = padded.to(torch.int32)
    real = real.to(torch.int32)
    total = batch["input_ids"].shape[1]
    if int(padded[-1]) != total:
        raise ValueError(
            f"batch: cu_seqlens_padded ends at {int(padded[-1])}, the batch has {total} tokens"
        )
    mult = 2 * cp_size
    seg = torch.diff(padded)
    bad = torch.nonzero(seg % mult).flatten()
    if len(bad):
        k = int(bad[0])
        hint = "" if "cu_seqlens_padded" in batch else "; pack with --cp-size"
        raise ValueError(
            f"cp_size: sample {k} of the batch has {int(seg[k])} tokens, not a multiple of "
            f"2 x cp_size = {mult}, so it cannot be split into {mult} chunks{hint}"
        )
    return real, padded


def shifted_labels(labels: torch.Tensor) -> torch.Tensor:
    """Each position's target: the next position's label, -100 after the last (shape kept).

    packer's labels are unshifted with -100 at every sample's first token, so the target of a
    sample's last real token (the padding or the next sample's first label) is -100.
    """
    out = torch.full_like(labels, IGNORE_INDEX)
    out[..., :-1] = labels[..., 1:]
    return out


def cp_shard(batch: dict, cp_rank: int, cp_size: int, device=None) -> dict:
    """CP rank `cp_rank`'s zigzag share of a `collate_packed(rows, "flatten")` batch.

    Returns `input_ids`, `labels` (shifted: see the module docstring), `shift_labels` (the same
    tensor), `position_ids`, each `[1, T / cp_size]` int64; `index` (the batch positions held, in
    order); `num_loss_tokens` (the whole batch's, the same on every CP rank: normalise by it, not
    by a sum over CP ranks) and `local_loss_tokens` (this rank's targets); `te_kwargs` for
    Transformer Engine's THD attention and `ring_flash_attn_kwargs` for
    `zigzag_ring_flash_attn_varlen_func`. Every sample's length in the batch (its padded length
    for a CP output) must be a multiple of `2 x cp_size`; anything else is refused naming
    `cp_size`.

    Every tensor of the result, the kernels' boundary tensors included (TE and ring-flash-attn
    read them on the GPU), is on `device`: by default the batch's (its `input_ids`'), so a
    batch moved to the GPU before the split gives a shard all on the GPU; pass
    `device="cuda"` to split a CPU batch straight onto the GPU.
    """
    if not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"cp_size must be a positive integer, got {cp_size!r}")
    if not isinstance(cp_rank, int) or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, {cp_size}), got {cp_rank!r}")
    real, padded = _boundaries(batch, cp_size)
    here = batch["input_ids"].device
    device = here if device is None else torch.device(device)
    index_np = zigzag_index(padded.cpu().numpy().astype(np.int64), cp_rank, cp_size)
    index = torch.from_numpy(index_np).to(here)  # the gathers run where the batch is
    targets = shifted_labels(batch["labels"])[:, index]
    seg = torch.diff(padded)
    max_padded = int(seg.max()) if len(seg) else 0
    local = int((targets != IGNORE_INDEX).sum())
    targets, real, padded = targets.to(device), real.to(device), padded.to(device)
    return {
        "input_ids": batch["input_ids"][:, index].to(device),
        "labels": targets,
        "shift_labels": targets,
        "position_ids": batch["position_ids"][:, index].to(device),
        "index": index.to(device),
        "num_loss_tokens": int(batch["num_loss_tokens"]),
        "local_loss_tokens": local,
        "te_kwargs": {
            "qkv_format": "thd",
            "attn_mask_type": "padding_causal",
            "cu_seqlens_q": real,
            "cu_seqlens_kv": real,
            "cu_seqlens_q_padded": padded,
            "cu_seqlens_kv_padded": padded,
            "max_seqlen_q": max_padded,
            "max_seqlen_kv": max_padded,
        },
        "ring_flash_attn_kwargs": {
            "cu_seqlens": padded // cp_size,
            "max_seqlen": max_padded // cp_size,
            "causal": True,
        },
    }
