"""The record batch of `pack_dataset`'s result: a shard's columns plus `seq_lengths`, the
segment lengths of each row that TRL's collators read."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packer.contract.schema import SCHEMA
from packer.write.gather import Buffers
from packer.write.shard_file import shard_batch

SCHEMA_WITH_LENGTHS = SCHEMA.append(pa.field("seq_lengths", pa.list_(pa.int32())))


def seq_lengths(view: Buffers, rows: int, cu_entries: int) -> pa.Array:
    """Each row's segment lengths (TRL's `seq_lengths`): cu_seqlens differences, padding
    included, so that they sum to the row's length."""
    cu = view.cu[:cu_entries]
    cu_offsets = view.cu_offsets[: rows + 1]
    diffs = np.diff(cu)
    keep = np.ones(diffs.size, bool)
    keep[cu_offsets[1:-1] - 1] = False  # the step from one row's end to the next row's 0
    offsets = (cu_offsets - np.arange(rows + 1, dtype=np.int32)).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(diffs[keep].astype(np.int32)))


def packed_batch(buf: Buffers, rows: int, tokens: int, cu_entries: int) -> pa.RecordBatch:
    """A shard's record batch of the filled buffers plus `seq_lengths`."""
    batch = shard_batch(buf, rows, tokens, cu_entries)
    return batch.append_column("seq_lengths", seq_lengths(buf, rows, cu_entries))
