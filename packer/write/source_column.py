"""The provenance column of a mixture's shards: `sample_source`, the source of every segment.

A mixture reads its sources' files in order, so source s holds the global sample indices
[bounds[s], bounds[s + 1]): the column is read off `sample_index` as it is written, and the
gather kernel stays the one every shard uses.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa

from packer.contract.schema import SOURCE_COLUMN
from packer.write.gather import Buffers
from packer.write.shards import ShardFiles


def with_source_column(files: ShardFiles, bounds: np.ndarray) -> ShardFiles:
    """`files` whose record batches carry `sample_source` as their last column; `bounds`
    (int64, sources + 1 entries) are the first global sample index of every source."""
    schema = files.schema.append(pa.field(SOURCE_COLUMN, pa.list_(pa.int32())))
    inner = files.batch
    starts = np.asarray(bounds[1:-1], np.int64)

    def batch(buf: Buffers, rows: int, tokens: int, cu_entries: int) -> pa.RecordBatch:
        base = inner(buf, rows, tokens, cu_entries)
        segs = int(buf.sample_row_offsets[rows])
        source = np.searchsorted(starts, buf.sample[:segs], side="right").astype(np.int32)
        offsets = pa.array(buf.sample_row_offsets[: rows + 1])
        column = pa.ListArray.from_arrays(offsets, pa.array(source))
        return pa.RecordBatch.from_arrays([*base.columns, column], schema=schema)

    return replace(files, schema=schema, batch=batch)
