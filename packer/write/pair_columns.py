"""The record batch of a pair shard (`pack --pairs`): a shard's columns plus `pair_index` and
`pair_side`, both read off `sample_index` (a pair's segments are numbered `2 * pair + side`),
so the gather kernel is the one every shard uses."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from packer.contract.schema import PAIR_SCHEMA
from packer.write.gather import Buffers
from packer.write.shard_file import shard_batch


def pair_batch(buf: Buffers, rows: int, tokens: int, cu_entries: int) -> pa.RecordBatch:
    """A shard's record batch of the filled buffers plus the pair columns."""
    batch = shard_batch(buf, rows, tokens, cu_entries)
    segs = int(buf.sample_row_offsets[rows])
    offsets = pa.array(buf.sample_row_offsets[: rows + 1])
    sample = buf.sample[:segs]
    pair_index = pa.ListArray.from_arrays(offsets, pa.array(sample // 2))
    pair_side = pa.ListArray.from_arrays(offsets, pa.array((sample % 2).astype(np.int8)))
    return pa.RecordBatch.from_arrays([*batch.columns, pair_index, pair_side], schema=PAIR_SCHEMA)
