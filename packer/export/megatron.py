"""Megatron-LM's `IndexedDataset`: `.bin` tokens and an `.idx` index (MMIDIDX, version 1).

Layout as megatron/core/datasets/indexed_dataset.py writes and reads it: a 9-byte header, the
version (<Q 1), the dtype code (<B), the sequence and document counts (<Q each), then the
sequence lengths (int32), their byte pointers (int64) and the document indices (int64, starting
at 0, one end per document). Each packer sample is one sequence and each packed row one
document, so the rows survive in `document_indices`. The tokens take Megatron's own dtype
choice (`DType.optimal_dtype`: uint16 below a vocabulary of 65500, else int32); the labels go
to a second dataset beside it (`labels.bin/.idx`, int32, -100 on what carries no loss), with
the same sequences and documents.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import xxhash

from packer.export.rows import RowBatch

HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}
NOTES = (
    "sample_index and sample_offset (provenance) are not carried",
    "each row is one document, each sample one sequence",
)


def optimal_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


class MegatronWriter:
    """`input_ids.bin/.idx` and `labels.bin/.idx`; the indices are written at the end."""

    def __init__(self, tmp: Path, vocab_size: int):
        self.tmp = tmp
        self.dtype = optimal_dtype(vocab_size)
        self.vocab_size = vocab_size
        self._tokens = open(tmp / "input_ids.bin", "wb")  # noqa: SIM115  closed in finish
        self._labels = open(tmp / "labels.bin", "wb")  # noqa: SIM115  closed in finish
        self._lengths: list[np.ndarray] = []
        self._hash = {"input_ids.bin": xxhash.xxh3_128(), "labels.bin": xxhash.xxh3_128()}
        self._docs: list[np.ndarray] = []
        self._samples = 0

    def start_shard(self, number: int) -> None:
        pass

    def write(self, batch: RowBatch) -> None:
        for fh, name, data in (
            (self._tokens, "input_ids.bin", batch.ids.astype(self.dtype)),
            (self._labels, "labels.bin", batch.labels.astype(np.int32, copy=False)),
        ):
            fh.write(data)
            self._hash[name].update(data)
        self._lengths.append(batch.seq_lens.astype(np.int32))
        self._docs.append(self._samples + batch.seq_off[1:])
        self._samples += int(batch.seq_off[-1])

    def finish(self) -> dict:
        self._tokens.close()
        self._labels.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        docs = np.concatenate([np.zeros(1, np.int64), *self._docs]).astype(np.int64)
        write_index(self.tmp / "input_ids.idx", self.dtype, lengths, docs)
        write_index(self.tmp / "labels.idx", np.dtype(np.int32), lengths, docs)
        self.digests = {name: h.hexdigest() for name, h in self._hash.items()}
        return {"dtype": self.dtype.name, "vocab_size": self.vocab_size}


def write_index(path: Path, dtype: np.dtype, lengths: np.ndarray, docs: np.ndarray) -> None:
    pointers = np.zeros(lengths.size, dtype=np.int64)
    if lengths.size:
        np.cumsum(lengths[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    with open(path, "wb") as fh:
        fh.write(HEADER)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", DTYPE_CODES[dtype]))
        fh.write(struct.pack("<Q", lengths.size))
        fh.write(struct.pack("<Q", docs.size))
        fh.write(lengths.astype(np.int32).tobytes())
        fh.write(pointers.tobytes())
        fh.write(docs.tobytes())
