"""Every attention backend as one causal varlen `forward(q, k, v, cu_seqlens, max_seqlen)`.

Each kernel has its own signature (flash-attn 2 and 3, torch's `varlen_attn` in two call forms,
the private aten op before torch 2.10); the adapters here make them one call over `(T, H, D)`
tensors, causal within the segments of `cu_seqlens`. They are plain functions, tested on the CPU
with fake kernels. The CPU reference masks a dense attention by segment instead, FlexAttention
runs a block mask built from the segments; both check the varlen contract a real kernel would
rely on. Torch is imported inside the functions only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from packer.errors import UsageError
from packer.verify.memory import block_queries, budget_bytes

Forward = Callable  # (q, k, v, cu_seqlens int32, max_seqlen int) -> (T, H, D)


def varlen_call_form(fn: Callable) -> str:
    """How torch's `varlen_attn` asks for causal masking: 'window_size' (2.11+) or 'is_causal'
    (2.10), read from its signature."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise UsageError("cannot read the signature of torch's varlen_attn") from None
    if "window_size" in params:
        return "window_size"
    if "is_causal" in params:
        return "is_causal"
    raise UsageError(
        "torch's varlen_attn takes neither window_size= nor is_causal=; this torch "
        "version is not supported by --backend torch-varlen"
    )


def varlen_causal_kwargs(form: str) -> dict:
    """Keyword arguments that make `varlen_attn` causal in the given call form."""
    if form == "window_size":
        return {"window_size": (-1, 0)}  # no limit to the left, nothing to the right
    if form == "is_causal":
        return {"is_causal": True}
    raise ValueError(f"unknown varlen call form {form!r}")


def make_varlen_forward(fn: Callable) -> tuple[Forward, str]:
    form = varlen_call_form(fn)
    kwargs = varlen_causal_kwargs(form)

    def forward(q, k, v, cu, max_seqlen):
        return fn(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), **kwargs)

    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return forward, f"torch.nn.attention.varlen.varlen_attn(q, k, v, cu, cu, max, max, {shown})"


def make_aten_flash_forward(op: Callable) -> tuple[Forward, str]:
    """Torch before 2.10: the private `aten._flash_attention_forward` (output is item 0)."""

    def forward(q, k, v, cu, max_seqlen):
        return op(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), 0.0, True, False)[0]

    return forward, "torch.ops.aten._flash_attention_forward(..., dropout_p=0.0, is_causal=True)"


def make_flash_attn_forward(fn: Callable) -> tuple[Forward, str]:
    def forward(q, k, v, cu, max_seqlen):
        return fn(
            q,
            k,
            v,
            cu,
            cu,
            int(max_seqlen),
            int(max_seqlen),
            dropout_p=0.0,
            softmax_scale=None,
            causal=True,
        )

    return forward, "flash_attn.flash_attn_varlen_func(..., dropout_p=0.0, causal=True)"


def make_flash_attn3_forward(fn: Callable) -> tuple[Forward, str]:
    """flash-attn 3 (`flash_attn_interface`, hopper/): its varlen call has no `dropout_p` (the
    8th and 9th positions are `seqused_q/k`), so everything after `max_seqlen_k` goes by
    keyword; some versions return (out, softmax_lse), others out alone."""

    def forward(q, k, v, cu, max_seqlen):
        out = fn(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), softmax_scale=None, causal=True)
        return out[0] if isinstance(out, tuple) else out

    return forward, "flash_attn_interface.flash_attn_varlen_func(..., causal=True)"


def segment_ids(cu, length: int):
    """Document id of every token position, from cu_seqlens (a torch tensor)."""
    import torch

    positions = torch.arange(length, device=cu.device, dtype=cu.dtype)
    return torch.searchsorted(cu[1:].contiguous(), positions, right=True)


def block_causal_mask(cu, length: int):
    """Boolean (T, T) mask: True where query i may attend key j (same segment, j <= i)."""
    import torch

    doc = segment_ids(cu, length)
    causal = torch.ones(length, length, dtype=torch.bool, device=cu.device).tril()
    return (doc[:, None] == doc[None, :]) & causal


def check_varlen_call(q, cu, max_seqlen) -> None:
    """The varlen kernels' contract, enforced by the masked references that stand in for them
    on a CPU: int32 `cu_seqlens` from 0 to the token count, and `max_seqlen` the longest
    segment. flash-attn refuses int64 offsets and reads past a segment longer than
    `max_seqlen` silently, so a caller that gets these wrong must fail here, not on a GPU."""
    import torch

    n = q.shape[0]
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.device != q.device:
        raise ValueError(f"cu_seqlens must be 1-D int32 on {q.device}, got {cu.dtype} {cu.device}")
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != n or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must rise from 0 to {n}, got {cu.tolist()}")
    longest = int((cu[1:] - cu[:-1]).max())
    if max_seqlen != longest:
        raise ValueError(f"max_seqlen is {max_seqlen} but the longest segment has {longest} tokens")


def causal_sdpa(q, k, v, budget: int, cu=None):
    """Causal SDPA over (T, H, D) tensors, within the segments of `cu` (None: one sequence).

    A row whose scores fit a share of `budget` (or any row off the CPU, where SDPA's fused
    kernels hold no T x T scores) runs in one call, under the dense block-diagonal mask; a
    longer one in query blocks (`memory.block_queries`), each over the keys from its first
    query's segment start to its last query, so no call holds more than its share. The calls
    take 4-D (1, H, T, D) tensors: on the CPU that runs torch's fused flash kernel, 3-4x faster
    than the unfused math SDPA takes 3-D ones to (which the block sizes still allow for)."""
    import torch
    import torch.nn.functional as F

    n, heads = q.shape[0], q.shape[1]
    qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))
    if q.device.type != "cpu" or block_queries(n, 0, heads, budget) >= n:
        if cu is None:
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)[0].transpose(0, 1)
        mask = block_causal_mask(cu, n)
        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)[0].transpose(0, 1)
    positions = torch.arange(n)
    first = None if cu is None else cu.long()[segment_ids(cu, n)]  # each query's first key
    out = torch.empty_like(qt)
    s = 0
    while s < n:
        lo = 0 if first is None else int(first[s])
        e = s + block_queries(n - s, s - lo, heads, budget)
        keys = positions[None, lo:e]
        mask = keys <= positions[s:e, None]
        if first is not None:
            mask &= keys >= first[s:e, None]
        out[:, :, s:e] = F.scaled_dot_product_attention(
            qt[:, :, s:e], kt[:, :, lo:e], vt[:, :, lo:e], attn_mask=mask
        )
        s = e
    return out[0].transpose(0, 1)


def make_cpu_forward(budget: int | None = None) -> tuple[Forward, str]:
    """The CPU reference: SDPA under the block-diagonal causal mask, in query blocks that fit
    `budget` (default: `--memory-budget`'s default)."""
    budget = budget_bytes(budget)

    def forward(q, k, v, cu, max_seqlen):
        check_varlen_call(q, cu, max_seqlen)
        return causal_sdpa(q, k, v, budget, cu)

    return forward, "scaled_dot_product_attention(attn_mask=block-diagonal causal)"


FLEX_BLOCK = 128  # FlexAttention's default sparse block size (queries and keys)
FLEX_BUCKETS = 24  # power-of-two lengths 128 .. 2^30: each may compile once


def bucket_length(n: int) -> int:
    """The length compiled FlexAttention runs a row of n tokens at: the next power of two from
    FLEX_BLOCK, so a run of rows up to L compiles at most log2(L / 128) + 1 times."""
    return max(FLEX_BLOCK, 1 << max(int(n) - 1, 0).bit_length())


def document_block_mask(cu, length: int, device):
    """FlexAttention's BlockMask for causal attention within the segments of `cu` over
    `length` positions (positions past cu[-1] form one padding segment of their own), built
    block by block from the segment ids: (length / 128)^2 block flags, never a length^2 mask.

    Segment ids never decrease along a row, so key block j < query block i holds a visible
    pair exactly when j's last id equals i's first, and only visible pairs when j's first id
    equals i's last; the diagonal blocks are always partial (causal inside)."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    doc = segment_ids(cu.to(device), length)
    blocks = -(-length // FLEX_BLOCK)
    starts = torch.arange(blocks, device=doc.device) * FLEX_BLOCK
    first = doc[starts]
    last = doc[torch.clamp(starts + FLEX_BLOCK, max=length) - 1]
    below = torch.ones(blocks, blocks, dtype=torch.bool, device=doc.device).tril(-1)
    whole = (starts + FLEX_BLOCK <= length)[:, None]  # a last, short block is never full
    full = below & whole & (first[None, :] == last[:, None])  # [query block, key block]
    seen = (below & (last[None, :] == first[:, None])) | torch.eye(
        blocks, dtype=torch.bool, device=doc.device
    )
    partial = seen & ~full

    def ordered(flags):
        count = flags.sum(-1, dtype=torch.int32)
        index = torch.argsort(flags.to(torch.int8), dim=-1, descending=True, stable=True)
        return count[None, None], index.to(torch.int32)[None, None]

    def document_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    return BlockMask.from_kv_blocks(
        *ordered(partial),
        *ordered(full),
        BLOCK_SIZE=FLEX_BLOCK,
        mask_mod=document_causal,
        seq_lengths=(length, length),
    )


@functools.cache
def _compiled_flex():
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)  # one graph per bucket_length


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def make_flex_forward(
    device: str, compiled: bool, report: dict | None = None
) -> tuple[Forward, str]:
    """FlexAttention under the document mask of `cu_seqlens` (`document_block_mask`).

    Compiled (on a GPU), every row is padded to its `bucket_length`, so the kernel compiles
    once per bucket (dynamo's `recompile_limit`, 8 by default, is raised to the FLEX_BUCKETS
    there can be); a recompile past it raises instead of silently running unfused
    (`fail_on_recompile_limit_hit`), and `report` counts what ran: `compiled`,
    `compiles` (graphs dynamo built in these calls), the bucket `lengths` run, the `calls`."""
    import warnings

    import torch
    from torch.nn.attention.flex_attention import flex_attention

    report = {} if report is None else report
    report.update(compiled=compiled, compiles=0, lengths=[], calls=0)
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    limit = max(int(getattr(config, name)), FLEX_BUCKETS)
    patch = {name: limit}
    if hasattr(config, "fail_on_recompile_limit_hit"):  # torch 2.6+
        patch["fail_on_recompile_limit_hit"] = True
    if compiled:
        report["recompile_limit"] = limit

    def forward(q, k, v, cu, max_seqlen):
        check_varlen_call(q, cu, max_seqlen)
        n = q.shape[0]
        length = bucket_length(n) if compiled else n
        q4, k4, v4 = (_pad_rows(x, length).transpose(0, 1)[None] for x in (q, k, v))
        mask = document_block_mask(cu, length, q.device)
        report["calls"] += 1
        if compiled and length not in report["lengths"]:
            report["lengths"] = sorted([*report["lengths"], length])
        if not compiled:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # eager flex on CPU warns that it is unfused
                out = flex_attention(q4, k4, v4, block_mask=mask)
            return out[0].transpose(0, 1)
        before = _graphs()
        with config.patch(**patch):
            out = _compiled_flex()(q4, k4, v4, block_mask=mask)
        report["compiles"] += _graphs() - before
        return out[0, :, :n].transpose(0, 1)

    how = "compiled, rows padded to power-of-two buckets" if compiled else "eager"
    return forward, f"flex_attention(block_mask=document mask from cu_seqlens, {how})"


def _pad_rows(x, length: int):
    """x (T, H, D) with zero rows appended up to `length` (the padding segment)."""
    import torch

    if x.shape[0] == length:
        return x
    return torch.cat([x, x.new_zeros(length - x.shape[0], *x.shape[1:])])
