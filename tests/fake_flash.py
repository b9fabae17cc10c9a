"""A CPU stand-in for transformers' flash-attention path, registered through AttentionInterface.

It takes the same decisions as `modeling_flash_attention_utils._flash_attention_forward`, in
the same order: a 2D padding mask (what `flash_attention_mask` leaves of it: None when it is all
ones) unpads; otherwise explicit `cu_seq_lens_q/k` with `max_length_q/k` run varlen; otherwise
`position_ids` that restart (batch 1) are read as packed samples; otherwise one causal pass. The
attention itself is fp32 sdpa per segment (varlen's result), so any fp32 model can run it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

NAME = "packer_fake_varlen"  # no "flash" in it: transformers would import a kernel
calls: list[str] = []  # which branch each call took, newest last


def _segments(attention_mask, position_ids, cu_q, lengths, batch: int, seq: int):
    if attention_mask is not None:
        calls.append("unpad")
        return None  # padding: handled per row below
    if cu_q is not None and lengths:
        calls.append("varlen")
        return cu_q.tolist()
    if position_ids is not None and batch == 1 and seq > 1:
        starts = (position_ids[0] == 0).nonzero().flatten().tolist()
        if starts != [0]:
            calls.append("position_ids")
            return [*starts, seq]
    calls.append("causal")
    return [0, seq]


def fake_flash_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    sliding_window=None,
    softcap=None,
    **kwargs,
):
    """query/key/value [B, H, T, D] in, [B, T, H, D] out, like `flash_attention_forward`."""
    b, h, t, _ = query.shape
    groups = h // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    lengths = kwargs.get("max_length_q") is not None and kwargs.get("max_length_k") is not None
    cu = _segments(
        attention_mask, kwargs.get("position_ids"), kwargs.get("cu_seq_lens_q"), lengths, b, t
    )
    out = torch.zeros_like(query)
    for row in range(b):
        bounds = cu
        if bounds is None:  # unpad: the row's kept tokens are one sequence
            keep = attention_mask[row].bool()
            assert bool(keep.all()), "the fake handles all-kept masks only"
            bounds = [0, t]
        for a, e in zip(bounds, bounds[1:]):
            if e <= a:
                continue
            q, k, v = (x[row : row + 1, :, a:e].float() for x in (query, key, value))
            mask = torch.ones(e - a, e - a, dtype=torch.bool).tril()
            if sliding_window is not None:
                mask &= ~torch.ones_like(mask).tril(-sliding_window)
            out[row : row + 1, :, a:e] = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=scaling
            ).to(query.dtype)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the fake under NAME (attention and mask, as flash_attention_2 is); its name."""
    AttentionInterface.register(NAME, fake_flash_attention)
    AttentionMaskInterface.register(NAME, flash_attention_mask)
    return NAME
