"""Context (and sequence) parallelism: the padded length of every segment, and its cost.

With CP over packed rows (Transformer Engine's THD format, zigzag varlen ring flash-attention)
every sample splits into `2 x cp_size` equal chunks, rank r holding chunks r and
`2 x cp_size - 1 - r`, so each sample's length in the row must be a multiple of `2 x cp_size`.
With sequence parallelism, tensor-parallel ranks split each CP rank's tokens again, so
Megatron-Bridge asks for `lcm(2 x cp_size, cp_size x tp_size)`, even at cp_size 1; without
sequence parallelism tp_size changes nothing. packer pads each segment at its end, and the
planner packs the padded lengths.
"""

from __future__ import annotations

import numpy as np

from packer.planning.multiple import cp_multiple


def pad_to_multiple(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """Each length rounded up to a multiple of `multiple` (unchanged when it is 1)."""
    lengths = np.asarray(lengths, np.int64)
    if multiple == 1:
        return lengths
    return -(-lengths // multiple) * multiple


def padded_lengths(lengths: np.ndarray, cp_size: int) -> np.ndarray:
    """Each length rounded up to a multiple of `2 x cp_size` (unchanged when cp_size is 1)."""
    return pad_to_multiple(lengths, cp_multiple(cp_size))


def cp_cost(lengths: np.ndarray, max_len: int, cp_size: int, multiple: int | None = None) -> dict:
    """The padding CP adds to these segment lengths, before any packing: tokens, padded tokens,
    the pad share, and the lower bound on rows with and without it. `multiple` defaults to
    `2 x cp_size` (pass `cp_multiple(...)` under sequence parallelism)."""
    # imported here: the strategies load numba, and packer.torch imports this module's zigzag_index
    from packer.planning.strategies import lower_bound

    mult = cp_multiple(cp_size) if multiple is None else int(multiple)
    lengths = np.asarray(lengths, np.int64)
    padded = pad_to_multiple(lengths, mult)
    tokens, padded_tokens = int(lengths.sum()), int(padded.sum())
    return {
        "cp_size": int(cp_size),
        "multiple": mult,
        "tokens": tokens,
        "padded_tokens": padded_tokens,
        "cp_pad_tokens": padded_tokens - tokens,
        "cp_pad_share": round((padded_tokens - tokens) / padded_tokens, 6)
        if padded_tokens
        else 0.0,
        "lower_bound": lower_bound(tokens, max_len),
        "lower_bound_padded": lower_bound(padded_tokens, max_len),
    }


def zigzag_index(
    cu_seqlens_padded: np.ndarray, cp_rank: int, cp_size: int, second_chunk: int | None = None
) -> np.ndarray:
    """The row positions that CP rank `cp_rank` holds, in the order it holds them.

    Each segment `[cu[k], cu[k + 1])` splits into `2 x cp_size` equal chunks; the rank takes chunk
    `cp_rank`, then chunk `2 x cp_size - 1 - cp_rank`, segment after segment (the load-balanced
    "zigzag" split of Transformer Engine's THD format and zigzag varlen ring flash-attention).
    Every segment's length must be a multiple of `2 x cp_size`. `second_chunk` takes another
    second chunk instead: a wrong layout, for verify's negative control.
    """
    cu = np.asarray(cu_seqlens_padded, np.int64)
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(
            f"cp_rank must be in [0, cp_size), got cp_rank={cp_rank}, cp_size={cp_size}"
        )
    seg = np.diff(cu)
    mult = 2 * cp_size
    if len(seg) and (np.any(seg < 0) or np.any(seg % mult)):
        bad = int(np.flatnonzero((seg < 0) | (seg % mult != 0))[0])
        raise ValueError(
            f"cu_seqlens_padded: segment {bad} has length {int(seg[bad])}, "
            f"not a multiple of 2 x cp_size = {mult}"
        )
    chunk = seg // mult
    first = cu[:-1] + cp_rank * chunk
    other = mult - 1 - cp_rank if second_chunk is None else second_chunk
    if not 0 <= other < mult:
        raise ValueError(f"second_chunk must be in [0, {mult}), got {second_chunk}")
    second = cu[:-1] + other * chunk
    starts = np.stack([first, second], axis=1).ravel()
    sizes = np.repeat(chunk, 2)
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    # one arange per chunk, without a Python loop: offsets within chunks plus chunk starts
    ends = np.cumsum(sizes)
    base = np.repeat(starts - (ends - sizes), sizes)
    return base + np.arange(total, dtype=np.int64)
