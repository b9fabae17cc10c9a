"""Context parallelism: the padded length of every segment, and what that padding costs.

With CP over packed rows (Transformer Engine's THD format, zigzag varlen ring flash-attention)
every sample splits into `2 x cp_size` equal chunks, rank r holding chunks r and
`2 x cp_size - 1 - r`, so each sample's length in the row must be a multiple of `2 x cp_size`.
packer pads each segment at its end, and the planner packs the padded lengths.
"""

from __future__ import annotations

import numpy as np

from packer.planning.strategies import lower_bound


def cp_multiple(cp_size: int) -> int:
    """What every segment's padded length is a multiple of (1 when CP is off)."""
    return 2 * cp_size if cp_size > 1 else 1


def padded_lengths(lengths: np.ndarray, cp_size: int) -> np.ndarray:
    """Each length rounded up to a multiple of `2 x cp_size` (unchanged when cp_size is 1)."""
    mult = cp_multiple(cp_size)
    lengths = np.asarray(lengths, np.int64)
    if mult == 1:
        return lengths
    return -(-lengths // mult) * mult


def cp_cost(lengths: np.ndarray, max_len: int, cp_size: int) -> dict:
    """The padding CP adds to these segment lengths, before any packing: tokens, padded tokens,
    the pad share, and the lower bound on rows with and without it."""
    lengths = np.asarray(lengths, np.int64)
    padded = padded_lengths(lengths, cp_size)
    tokens, padded_tokens = int(lengths.sum()), int(padded.sum())
    return {
        "cp_size": int(cp_size),
        "multiple": cp_multiple(cp_size),
        "tokens": tokens,
        "padded_tokens": padded_tokens,
        "cp_pad_tokens": padded_tokens - tokens,
        "cp_pad_share": round((padded_tokens - tokens) / padded_tokens, 6)
        if padded_tokens
        else 0.0,
        "lower_bound": lower_bound(tokens, max_len),
        "lower_bound_padded": lower_bound(padded_tokens, max_len),
    }
