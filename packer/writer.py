"""Shard writer: packed buffers to Arrow IPC stream files, hashed while they are written.

The stream format is what `datasets.Dataset.from_file` memory-maps, and what
`load_dataset("arrow", ...)` reads.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer import workers
from packer.gather import Buffers

SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),
    ("labels", pa.list_(pa.int32())),
    ("position_ids", pa.list_(pa.int32())),
    ("cu_seqlens", pa.list_(pa.int32())),
    ("sample_index", pa.list_(pa.int64())),
    ("sample_offset", pa.list_(pa.int32())),
    ("num_loss_tokens", pa.int32()),
])


class _HashingFile:
    """A write-only file that hashes what passes through, so shards are never read back.

    With `overlap`, the sha256 of each large buffer runs on a helper thread while the same
    bytes are written (both release the GIL); updates stay in order, so the digest is the same.
    """

    _BIG = 1 << 20  # smaller writes (IPC metadata, padding) are hashed inline

    def __init__(self, path: Path, overlap: bool = False):
        self._fh = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.sha256 = hashlib.sha256()
        self.bytes = 0
        self.closed = False
        self._pool = ThreadPoolExecutor(max_workers=1) if overlap else None
        self._last: Future | None = None

    def write(self, data) -> int:
        view = memoryview(data)
        if self._pool is not None and view.nbytes >= self._BIG:
            # `view` keeps the Arrow buffer alive until the hash has read it
            self._last = self._pool.submit(self.sha256.update, view)
        else:
            if self._last is not None:
                self._last.result()
                self._last = None
            self.sha256.update(view)
        self._fh.write(view)
        self.bytes += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if not self.closed:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._last = None
            self._fh.close()
            self.closed = True


def _list(offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


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
            pa.array(buf.loss[:rows]),
        ],
        schema=SCHEMA,
    )


def write_shard(path: Path, batch: pa.RecordBatch, overlap: bool | None = None) -> dict:
    """Write one shard; return its manifest entry (without the name).

    overlap: hash on a helper thread while writing [default: when more than one worker].
    """
    if overlap is None:
        overlap = workers.current() > 1
    sink = _HashingFile(path, overlap)
    try:
        with pa.ipc.new_stream(sink, SCHEMA) as writer:
            writer.write_batch(batch)
    finally:
        sink.close()
    return {"bytes": sink.bytes, "sha256": sink.sha256.hexdigest()}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()
