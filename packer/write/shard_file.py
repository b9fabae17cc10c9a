"""Shard writer: packed buffers to Arrow IPC stream files, hashed while they are written.

The stream format is what `datasets.Dataset.from_file` memory-maps, and what
`load_dataset("arrow", ...)` reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from packer import hashing
from packer.contract.schema import SCHEMA
from packer.write.direct import DirectFile
from packer.write.gather import Buffers


class HashingFile:
    """A write-only file that hashes what passes through, so shards are never read back
    (`algorithm=None`: a file no manifest lists, not hashed). Arrow's IPC and Parquet writers
    take it as their sink; they do not close it."""

    def __init__(self, path: Path, algorithm: str | None, direct: bool = False):
        self._fh = DirectFile(path) if direct else open(path, "wb")  # noqa: SIM115 - closed in close()
        self.digest = hashing.new(algorithm) if algorithm else None
        self.bytes = 0
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data)
        if self.digest is not None:
            self.digest.update(view)
        self._fh.write(view)
        self.bytes += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._fh.close()

    @property
    def direct(self) -> bool:
        """Whether the bytes go around the page cache (a `DirectFile` that O_DIRECT took)."""
        return getattr(self._fh, "direct", False)

    def abort(self) -> None:
        """Close without finishing: a `DirectFile` drops what it still has staged."""
        if not self.closed:
            self.closed = True
            getattr(self._fh, "abort", self._fh.close)()


def arrow_array(values: np.ndarray) -> pa.Array:
    """A zero-copy Arrow view of a contiguous numpy array (`pa.array` would import pandas, a
    quarter of a second of a run's fixed cost)."""
    arrow_type = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def _list(offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    return pa.ListArray.from_arrays(arrow_array(offsets), arrow_array(values))


def shard_batch(buf: Buffers, rows: int, tokens: int, cu_entries: int) -> pa.RecordBatch:
    """The packed columns of one shard, as zero-copy views of the buffers."""
    segs = int(buf.sample_row_offsets[rows])
    row_offsets = buf.row_offsets[: rows + 1]
    return pa.RecordBatch.from_arrays(
        [
            _list(row_offsets, buf.ids[:tokens]),
            _list(row_offsets, buf.labels[:tokens]),
            _list(row_offsets, buf.pos[:tokens]),
            _list(buf.cu_offsets[: rows + 1], buf.cu[:cu_entries]),
            _list(buf.sample_row_offsets[: rows + 1], buf.sample[:segs]),
            _list(buf.sample_row_offsets[: rows + 1], buf.sample_offset[:segs]),
            arrow_array(buf.loss[:rows]),
        ],
        schema=SCHEMA,
    )


class ShardWriter:
    """One shard file: record batches appended in order, hashed as they are written."""

    def __init__(
        self,
        path: Path,
        algorithm: str | None = hashing.DEFAULT,
        schema: pa.Schema = SCHEMA,
        direct: bool = False,
    ):
        """direct: write around the page cache (`DirectFile`), for a file not read back soon."""
        self.path = path
        self.algorithm = algorithm
        self._sink = HashingFile(path, algorithm, direct)
        try:
            self._writer = pa.ipc.new_stream(self._sink, schema)
        except BaseException:
            self._sink.abort()
            raise
        self.rows = self.tokens = self.segments = self.loss_tokens = 0

    def add(self, batch: pa.RecordBatch, tokens: int, segments: int, loss_tokens: int) -> None:
        self._writer.write_batch(batch)
        self.rows += batch.num_rows
        self.tokens += tokens
        self.segments += segments
        self.loss_tokens += loss_tokens

    @property
    def bytes(self) -> int:
        """Bytes written to the file so far."""
        return self._sink.bytes

    @property
    def direct(self) -> bool:
        """Whether the file is written around the page cache (nothing of it to flush)."""
        return self._sink.direct

    def close(self) -> dict:
        """Finish the stream; return the shard's manifest entry."""
        try:
            self._writer.close()
        finally:
            self._sink.close()
        entry = {
            "file": self.path.name,
            "rows": self.rows,
            "tokens": self.tokens,
            "segments": self.segments,
            "loss_tokens": self.loss_tokens,
            "bytes": self._sink.bytes,
        }
        if self._sink.digest is not None:
            entry[self.algorithm] = self._sink.digest.hexdigest()
        return entry

    def abort(self) -> None:
        """Close the file after a failure; its directory is discarded by the caller."""
        self._sink.abort()
