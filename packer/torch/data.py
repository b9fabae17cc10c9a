"""`PackedDataset`: a map-style dataset over the shards of a packer output, memory-mapped.

Shards are opened lazily with `pyarrow.memory_map`; a row is a dict of numpy views into the
mapped file, so reading a row copies nothing and the dataset is never loaded into memory.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch.utils.data

from packer.contract.manifest import has_leftovers, incomplete_output
from packer.contract.names import MANIFEST
from packer.contract.remote import local_copy
from packer.contract.schema import CP_COLUMNS, LIST_COLUMNS
from packer.storage import is_url


@dataclass
class _Batch:
    """Numpy views of one Arrow record batch: (offsets, values) per list column."""

    first_row: int
    lists: dict[str, tuple[np.ndarray, np.ndarray]]
    num_loss_tokens: np.ndarray


def _views(batch: pa.RecordBatch, first_row: int) -> _Batch:
    lists = {}
    # a CP output (`pack --cp-size`) also has `cu_seqlens_padded`, which CP training needs
    cp = [name for name in CP_COLUMNS if name in batch.schema.names]
    for name in (*LIST_COLUMNS, *cp):
        col = batch.column(name)
        # `offsets` honours the array's own slice offset and indexes into the whole `values`
        lists[name] = (
            col.offsets.to_numpy(zero_copy_only=True),
            col.values.to_numpy(zero_copy_only=True),
        )
    loss = batch.column("num_loss_tokens").to_numpy(zero_copy_only=True)
    return _Batch(first_row, lists, loss)


class PackedDataset(torch.utils.data.Dataset):
    """The rows of a packer output directory, in manifest order.

    `ds[i]` is a dict with every column of the output contract: the list columns as read-only
    numpy views (`input_ids`, `labels`, `position_ids`, `cu_seqlens` int32; `sample_index` int64;
    `sample_offset` int32) and `num_loss_tokens` as an int; rows of a CP output (`pack
    --cp-size`) add `cu_seqlens_padded` (int32). Safe to pass to DataLoader workers:
    the memory maps are reopened in each process.
    """

    def __init__(self, path: str | Path):
        # a URL (s3://...) is read from a local copy of the files its manifest lists
        self.path = local_copy(path) if is_url(path) else Path(path)
        manifest_path = self.path / MANIFEST
        if not manifest_path.is_file():
            if has_leftovers(self.path):  # as `local_copy` says of a store's prefix
                raise incomplete_output(str(self.path))
            raise FileNotFoundError(f"{manifest_path}: not a packer output (no {MANIFEST})")
        with open(manifest_path, encoding="utf-8") as fh:
            self.manifest = json.load(fh)
        shards = self.manifest["shards"]
        self.files = [self.path / s["file"] for s in shards]
        self._shard_start = np.cumsum([0] + [int(s["rows"]) for s in shards]).tolist()
        self._open: dict[int, list[_Batch]] = {}
        self._lengths: np.ndarray | None = None

    def __len__(self) -> int:
        return self._shard_start[-1]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_open"] = {}  # memory maps are per process
        return state

    def _shard(self, k: int) -> list[_Batch]:
        batches = self._open.get(k)
        if batches is None:
            source = pa.memory_map(str(self.files[k]), "r")
            batches, row = [], 0
            for batch in pa.ipc.open_stream(source):
                batches.append(_views(batch, row))
                row += batch.num_rows
            expected = self._shard_start[k + 1] - self._shard_start[k]
            if row != expected:
                raise ValueError(f"{self.files[k]}: {row} rows, manifest says {expected}")
            self._open[k] = batches
        return batches

    def _locate(self, i: int) -> tuple[_Batch, int]:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        k = bisect.bisect_right(self._shard_start, i) - 1
        batches = self._shard(k)
        local = i - self._shard_start[k]
        j = bisect.bisect_right([b.first_row for b in batches], local) - 1
        return batches[j], local - batches[j].first_row

    def __getitem__(self, i: int) -> dict:
        batch, r = self._locate(int(i))
        row = {}
        for name, (offsets, values) in batch.lists.items():
            row[name] = values[offsets[r] : offsets[r + 1]]
        row["num_loss_tokens"] = int(batch.num_loss_tokens[r])
        return row

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of real samples in every row (stored padding excluded), int64, one per row.

        Read from the offsets of the mapped shards (no token is touched); used by
        `PackedBatchSampler` to balance ranks by tokens.
        """
        if self._lengths is None:
            parts = []
            for k in range(len(self.files)):
                for b in self._shard(k):
                    cu_off, cu = b.lists["cu_seqlens"]
                    samp_off, _ = b.lists["sample_index"]
                    segments = np.diff(samp_off)
                    parts.append(cu[cu_off[:-1] + segments].astype(np.int64))
            self._lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._lengths

    def segment_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's segment lengths as CSR: (offsets int64 [rows + 1], lengths int64).

        Row i's samples (or pieces of split samples) have lengths `lengths[offsets[i]:offsets[i+1]]`
        (stored padding excluded). Read from the mapped `cu_seqlens`; used to balance compute.
        """
        counts, parts = [], []
        for k in range(len(self.files)):
            for b in self._shard(k):
                cu_off, cu = b.lists["cu_seqlens"]
                segments = np.diff(b.lists["sample_index"][0])
                first = np.repeat(cu_off[:-1], segments)
                within = np.arange(first.size) - np.repeat(np.cumsum(segments) - segments, segments)
                at = first + within
                parts.append((cu[at + 1] - cu[at]).astype(np.int64))
                counts.append(segments)
        offsets = np.zeros(len(self) + 1, np.int64)
        if counts:
            np.cumsum(np.concatenate(counts), out=offsets[1:])
        return offsets, np.concatenate(parts) if parts else np.zeros(0, np.int64)


def load_hf_dataset(path: str | Path):
    """The shards of a packer output as one memory-mapped `datasets.Dataset`, in manifest order.

    For trainers that insist on 🤗 datasets (TRL's SFTTrainer). Rows come back as Python lists;
    `collate_packed` accepts them as well as `PackedDataset` rows. Needs `datasets`.
    """
    from packer.pipelines.hf_datasets import output_dataset  # the one home of `datasets`

    return output_dataset(Path(path))
