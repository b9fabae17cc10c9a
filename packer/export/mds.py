"""MosaicML streaming's MDS: `shard.NNNNN.mds` files and an `index.json`, one packed row per
sample, as `StreamingDataset` reads them.

The bytes follow streaming/base/format/mds/writer.py and encodings.py: a shard is the sample
count (uint32), the sample offsets (uint32, count + 1, from the shard's start), the writer's
config as JSON, then the samples; a sample is the byte sizes of its variable-size columns
(uint32 each) followed by the columns in sorted name order. `ndarray:DTYPE` columns have a fixed
dtype and a dynamic shape: one byte `ndim << 2 | shape dtype code`, the shape, the values. A
shard is closed before it would pass `size_limit` bytes; each file's hashes are recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xxhash

from packer.export.kernels import put_bytes, put_shapes
from packer.export.rows import RowBatch

# column -> (encoding, numpy dtype); the writer stores them in sorted name order
COLUMNS = {
    "cu_seqlens": ("ndarray:int32", np.int32),
    "input_ids": ("ndarray:uint32", np.uint32),
    "labels": ("ndarray:int32", np.int32),
    "position_ids": ("ndarray:int32", np.int32),
    "sample_index": ("ndarray:int64", np.int64),
    "sample_offset": ("ndarray:int32", np.int32),
}
# the hash streaming's StreamingDataset(validate_hash=...) checks; xxh64 costs a tenth of sha1
HASHES = ["xxh64"]
DEFAULT_SIZE_LIMIT = 1 << 26  # MDSWriter's default
NOTES = ("a --pad tail is not kept: rows hold their samples only",)


def row_columns(batch: RowBatch) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each column of the batch's rows, in sorted name order, as (values in the column's dtype,
    row offsets into them)."""
    rows, per_row = batch.rows, batch.samples_per_row
    cu = np.empty(int(batch.seq_off[-1]) + rows, dtype=np.int32)
    sample_rows = np.repeat(np.arange(rows), per_row)
    cu[np.arange(sample_rows.size) + sample_rows] = batch.seq_starts()  # where samples start
    cu[batch.seq_off[1:] + np.arange(rows)] = batch.row_lens  # and each row's end
    cu_off = batch.seq_off + np.arange(rows + 1)
    positions = np.arange(batch.ids.size, dtype=np.int64) - np.repeat(
        batch.token_starts(), batch.seq_lens
    )
    values = {
        "cu_seqlens": (cu, cu_off),
        "input_ids": (np.ascontiguousarray(batch.ids).view(np.uint32), batch.off),
        "labels": (batch.labels, batch.off),
        "position_ids": (positions.astype(np.int32), batch.off),
        "sample_index": (batch.sample_index, batch.seq_off),
        "sample_offset": (batch.sample_offset, batch.seq_off),
    }
    return [
        (np.ascontiguousarray(values[n][0], dtype=COLUMNS[n][1]), values[n][1])
        for n in sorted(COLUMNS)
    ]


def _prefix_sizes(counts: np.ndarray) -> np.ndarray:
    """Bytes of each row's shape prefix: one code byte and the length in 1, 2, 4 or 8 bytes."""
    width = np.where(counts < 1 << 8, 1, np.where(counts < 1 << 16, 2, 4))
    return 1 + np.where(counts < 1 << 32, width, 8)


def encode_samples(batch: RowBatch) -> tuple[np.ndarray, np.ndarray]:
    """The MDS bytes of every row of the batch, back to back, and each row's sample size.

    A sample is the byte sizes of its columns (uint32 each), then each column in sorted name
    order: its shape prefix and its values, as streaming's `MDSWriter.encode_sample` writes."""
    columns = row_columns(batch)
    counts = [np.diff(off).astype(np.int64) for _, off in columns]
    prefixes = [_prefix_sizes(n) for n in counts]
    parts = np.stack(
        [p + n * v.itemsize for (v, _), n, p in zip(columns, counts, prefixes, strict=True)],
        axis=1,
    ).astype(np.int64)  # rows x columns
    head = 4 * len(columns)
    sizes = head + parts.sum(axis=1)
    starts = np.cumsum(sizes) - sizes
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    header = np.ascontiguousarray(parts, dtype=np.uint32).view(np.uint8).reshape(-1)
    put_bytes(header, np.arange(0, header.size + 1, head, dtype=np.int64), out, starts)
    at = starts + head
    for c, ((values, off), n, prefix) in enumerate(zip(columns, counts, prefixes, strict=True)):
        put_shapes(n, out, at)
        raw = values.view(np.uint8).reshape(-1)
        put_bytes(raw, off.astype(np.int64) * values.itemsize, out, at + prefix)
        at = at + parts[:, c]
    return out, sizes


def config(size_limit: int) -> dict:
    names = sorted(COLUMNS)
    return {
        "version": 2,
        "format": "mds",
        "compression": None,
        "hashes": HASHES,
        "size_limit": size_limit,
        "column_names": names,
        "column_encodings": [COLUMNS[n][0] for n in names],
        "column_sizes": [None] * len(names),
    }


class MdsWriter:
    """`shard.NNNNN.mds` files cut by size as `MDSWriter` cuts them, then `index.json`."""

    def __init__(self, tmp: Path, size_limit: int = DEFAULT_SIZE_LIMIT):
        self.tmp, self.size_limit = tmp, size_limit
        self.config = config(size_limit)
        self.config_data = json.dumps(self.config, sort_keys=True).encode("utf-8")
        self.shards: list[dict] = []
        self.digests: dict[str, str] = {}  # xxh3_128 of each shard, for packer's own manifest
        self._chunks: list[np.ndarray] = []  # the pending shard's samples, in encoded runs
        self._sizes: list[np.ndarray] = []
        self._size = self._empty = 8 + len(self.config_data)

    PARALLEL = False  # one stream of rows, in order: shards are cut by size

    def shard(self, number: int) -> MdsWriter:
        """The writer itself: MDS shards are cut by size, not by packer's shards."""
        return self

    def close(self) -> None:
        pass

    def write(self, batch: RowBatch) -> None:
        """Encode the batch at once, then cut it where `MDSWriter` would close a shard: before
        a sample that would take the shard past `size_limit` (a shard holds at least one)."""
        if not batch.rows:
            return
        data, sizes = encode_samples(batch)
        ends = np.cumsum(sizes)  # where each sample ends in `data`
        grown = np.cumsum(sizes + 4)  # what each sample adds to a shard, its offset included
        first = 0
        while first < batch.rows:
            base = int(grown[first - 1]) if first else 0
            room = self.size_limit - self._size + base
            # samples [first, last) fit; none after one sample larger than the limit
            last = max(first, int(np.searchsorted(grown, room, side="right")))
            if last == first and not self._chunks:
                last = first + 1  # a sample larger than the limit gets a shard of its own
            if last > first:
                lo = int(ends[first - 1]) if first else 0
                self._chunks.append(data[lo : int(ends[last - 1])])
                self._sizes.append(sizes[first:last])
                self._size += int(grown[last - 1]) - base
            if last < batch.rows:
                self._flush()
            first = last

    def _flush(self) -> None:
        """Write the pending shard, hashing it as it goes: no joined copy of it is made."""
        sizes = np.concatenate(self._sizes)
        n = sizes.size
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        offsets += 4 + 4 * (n + 1) + len(self.config_data)
        head = [np.uint32(n).tobytes(), offsets.astype(np.uint32).tobytes(), self.config_data]
        digests = {a: getattr(xxhash, a)() for a in (*HASHES, "xxh3_128")}
        name = f"shard.{len(self.shards):05d}.mds"
        with open(self.tmp / name, "wb") as fh:
            for part in (*head, *self._chunks):
                fh.write(part)
                for digest in digests.values():
                    digest.update(part)
        raw = {
            "basename": name,
            "bytes": int(offsets[-1]),
            "hashes": {a: digests[a].hexdigest() for a in HASHES},
        }
        self.shards.append({"samples": n, "raw_data": raw, "zip_data": None, **self.config})
        self.digests[name] = digests["xxh3_128"].hexdigest()
        self._chunks, self._sizes, self._size = [], [], self._empty

    def finish(self) -> dict:
        if self._chunks:
            self._flush()
        index = {"version": 2, "shards": self.shards}
        (self.tmp / "index.json").write_text(json.dumps(index, sort_keys=True))
        return {"mds_shards": len(self.shards), "size_limit": self.size_limit}
