"""What happens to samples longer than the row length: drop, truncate, split or error.

The result is a list of *segments* (pieces of source samples, as start + length into the flat
token array), so that nothing is copied and every dropped, truncated or split sample is counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from packer.contract.names import POLICIES
from packer.errors import InputError, UsageError, option


@dataclass
class Segments:
    """Pieces of samples to pack. Unsplit samples are one segment each."""

    sample: np.ndarray  # int64: global index of the source sample
    start: np.ndarray  # int64: position of the first token in the flat token array
    length: np.ndarray  # int64
    offset: np.ndarray  # int32: position of the first token within its source sample
    dropped: int
    truncated: int
    split: int
    tokens_removed: int  # by drop and truncate

    @property
    def num_segments(self) -> int:
        return int(self.sample.size)


def resolve(
    lengths: np.ndarray,
    max_len: int,
    policy: str,
    *,
    starts: np.ndarray | None = None,
    locate: Callable[[int], str] | None = None,
    counted: str = "",
) -> Segments:
    """The segments of samples of these `lengths` under `policy`.

    Planning knows lengths only: `starts` places each sample in the flat token array (by default
    the samples lie end to end from 0) and `locate(i)` names sample i in an error message;
    `counted` says which samples the error's count covers where that is not all of them (a block).
    """
    if policy not in POLICIES:
        raise UsageError(
            f"unknown {option('overlength')} '{policy}' (choose from {', '.join(POLICIES)})"
        )
    if starts is None:
        starts = np.cumsum(lengths, dtype=np.int64) - lengths
    index = np.arange(lengths.size, dtype=np.int64)
    over = lengths > max_len
    n_over = int(over.sum())
    zero32 = np.zeros(lengths.size, np.int32)
    if n_over == 0:
        return Segments(index, starts, lengths, zero32, 0, 0, 0, 0)

    if policy == "error":
        first = int(np.flatnonzero(over)[0])
        where = locate or (lambda i: f"sample {i}")
        raise InputError(
            f"{n_over} sample(s){counted} are longer than {option('max_len')} {max_len} (longest "
            f"{int(lengths.max())} tokens, first at {where(first)}); choose what to do "
            f"with them with {option('overlength')} drop|truncate|split"
        )
    if policy == "drop":
        keep = ~over
        return Segments(
            index[keep],
            starts[keep],
            lengths[keep],
            zero32[keep],
            dropped=n_over,
            truncated=0,
            split=0,
            tokens_removed=int(lengths[over].sum()),
        )
    if policy == "truncate":
        cut = np.minimum(lengths, max_len)
        return Segments(
            index,
            starts,
            cut,
            zero32,
            dropped=0,
            truncated=n_over,
            split=0,
            tokens_removed=int((lengths - cut).sum()),
        )
    # split: consecutive pieces of max_len tokens, the last one shorter
    pieces = -(-lengths // max_len)
    sample = np.repeat(index, pieces)
    first_piece = np.cumsum(pieces) - pieces
    piece_no = np.arange(sample.size, dtype=np.int64) - np.repeat(first_piece, pieces)
    offset = piece_no * max_len
    length = np.minimum(lengths[sample] - offset, max_len)
    return Segments(
        sample,
        starts[sample] + offset,
        length,
        offset.astype(np.int32),
        dropped=0,
        truncated=0,
        split=n_over,
        tokens_removed=0,
    )
