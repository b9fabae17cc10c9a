"""MosaicML streaming's MDS: `shard.NNNNN.mds` files and an `index.json`, one packed row per
sample, as `StreamingDataset` (and llm-foundry) read them.

The bytes follow streaming/base/format/mds/writer.py and encodings.py: a shard is the sample
count (uint32), the sample offsets (uint32, count + 1, from the shard's start), the writer's
config as JSON, then the samples; a sample is the byte sizes of its variable-size columns
(uint32 each) followed by the columns in sorted name order. `ndarray:DTYPE` columns have a fixed
dtype and a dynamic shape: one byte `ndim << 2 | shape dtype code`, the shape, the values. A
shard is closed before it would pass `size_limit` bytes; each file's hashes are recorded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import xxhash

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
HASHES = ["sha1", "xxh64"]
DEFAULT_SIZE_LIMIT = 1 << 26  # MDSWriter's default
NOTES = ("a --pad tail is not kept: rows hold their samples only",)


def _hasher(algorithm: str):
    if algorithm.startswith("xxh"):
        return getattr(xxhash, algorithm)()
    return hashlib.new(algorithm)


def _shape_prefix(n: int) -> bytes:
    """ndim (1) and shape dtype code in one byte, then the length in the smallest uint."""
    for code, dtype in enumerate((np.uint8, np.uint16, np.uint32, np.uint64)):
        if n < (1 << (8 << code)):
            return bytes([(1 << 2) | code]) + np.array([n], dtype).tobytes()
    raise ValueError(n)


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
    def __init__(self, tmp: Path, size_limit: int = DEFAULT_SIZE_LIMIT):
        self.tmp, self.size_limit = tmp, size_limit
        self.config = config(size_limit)
        self.config_data = json.dumps(self.config, sort_keys=True).encode("utf-8")
        self.shards: list[dict] = []
        self.digests: dict[str, str] = {}  # xxh3_128 of each shard, for packer's own manifest
        self._samples: list[bytes] = []
        self._size = 8 + len(self.config_data)

    def start_shard(self, number: int) -> None:
        pass  # MDS shards are cut by size, not by packer's shards

    def write(self, batch: RowBatch) -> None:
        starts = batch.seq_starts()
        positions = np.arange(batch.ids.size, dtype=np.int64) - np.repeat(
            batch.token_starts(), batch.seq_lens
        )
        for r in range(batch.rows):
            t = slice(int(batch.off[r]), int(batch.off[r + 1]))
            s = slice(int(batch.seq_off[r]), int(batch.seq_off[r + 1]))
            cu = np.append(starts[s], t.stop - t.start)
            values = {
                "cu_seqlens": cu,
                "input_ids": batch.ids[t],
                "labels": batch.labels[t],
                "position_ids": positions[t],
                "sample_index": batch.sample_index[s],
                "sample_offset": batch.sample_offset[s],
            }
            self._add(self._encode(values))

    def _encode(self, values: dict) -> bytes:
        parts = []
        for name in sorted(COLUMNS):
            array = np.ascontiguousarray(values[name], dtype=COLUMNS[name][1])
            parts.append(_shape_prefix(array.size) + array.tobytes())
        sizes = np.array([len(p) for p in parts], np.uint32).tobytes()
        return sizes + b"".join(parts)

    def _add(self, sample: bytes) -> None:
        size = len(sample) + 4
        if self._samples and self.size_limit < self._size + size:
            self._flush()
        self._samples.append(sample)
        self._size += size

    def _flush(self) -> None:
        """Write the shard part by part, hashing as it goes: no joined copy of it is made."""
        n = len(self._samples)
        sizes = np.array([0] + [len(s) for s in self._samples], np.int64)
        offsets = np.cumsum(sizes) + 4 + 4 * (n + 1) + len(self.config_data)
        head = [np.uint32(n).tobytes(), offsets.astype(np.uint32).tobytes(), self.config_data]
        digests = {a: _hasher(a) for a in (*HASHES, "xxh3_128")}
        name = f"shard.{len(self.shards):05d}.mds"
        total = 0
        with open(self.tmp / name, "wb") as fh:
            for part in (*head, *self._samples):
                fh.write(part)
                for digest in digests.values():
                    digest.update(part)
                total += len(part)
        raw = {
            "basename": name,
            "bytes": total,
            "hashes": {a: digests[a].hexdigest() for a in HASHES},
        }
        self.shards.append({"samples": n, "raw_data": raw, "zip_data": None, **self.config})
        self.digests[name] = digests["xxh3_128"].hexdigest()
        self._samples, self._size = [], 8 + len(self.config_data)

    def finish(self) -> dict:
        if self._samples:
            self._flush()
        index = {"version": 2, "shards": self.shards}
        (self.tmp / "index.json").write_text(json.dumps(index, sort_keys=True))
        return {"mds_shards": len(self.shards), "size_limit": self.size_limit}
