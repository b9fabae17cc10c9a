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
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import xxhash

from packer.errors import option
from packer.export.rows import RowBatch

HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}
NOTES = (
    "sample_index and sample_offset (provenance) are not carried",
    "each row is one document, each sample one sequence",
)


def optimal_dtype(vocab_size: int) -> np.dtype:
    """megatron-core's `DType.optimal_dtype`, which its `tools/preprocess_data.py` applies to
    the tokenizer's vocabulary size: datasets of different dtypes do not merge."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def dtype_warning(largest: int) -> str:
    """Why an export without a vocabulary size may not merge with Megatron's own data."""
    dtype = optimal_dtype(largest).name
    return (
        f"no {option('vocab_size', '--vocab-size')}: the token dtype ({dtype}) follows the "
        f"largest id ({largest - 1}); Megatron's tools pick it from the tokenizer's vocabulary "
        "size (uint16 below 65500, else int32), and datasets of different dtypes do not merge"
    )


CHUNK = 1 << 22  # index entries per read while the index is assembled (32 MiB of pointers)


class MegatronWriter:
    """`input_ids.bin/.idx` and `labels.bin/.idx`. The index's sequence lengths and document
    ends go to two scratch files as rows arrive and are assembled into the indices at the end,
    a chunk at a time: memory stays that of one batch however many samples there are."""

    def __init__(self, tmp: Path, vocab_size: int, sized: bool = True):
        self.tmp = tmp
        self.dtype = optimal_dtype(vocab_size)
        self.vocab_size = vocab_size
        # `sized`: the vocabulary size is the user's, not the largest id + 1
        self.warnings = () if sized else (dtype_warning(vocab_size),)
        self._tokens = open(tmp / "input_ids.bin", "wb")  # noqa: SIM115  closed in finish
        self._labels = open(tmp / "labels.bin", "wb")  # noqa: SIM115  closed in finish
        self._hash = {"input_ids.bin": xxhash.xxh3_128(), "labels.bin": xxhash.xxh3_128()}
        self._lengths_path, self._docs_path = tmp / ".lengths.scratch", tmp / ".docs.scratch"
        self._lengths = open(self._lengths_path, "wb")  # noqa: SIM115  closed in finish
        self._docs = open(self._docs_path, "wb")  # noqa: SIM115  closed in finish
        self._docs.write(np.zeros(1, np.int64).tobytes())
        self._samples = self._doc_count = 0

    PARALLEL = False  # one stream of rows, in order

    def shard(self, number: int) -> MegatronWriter:
        """The writer itself: every packer shard goes to the same two files."""
        return self

    def close(self) -> None:
        pass

    def write(self, batch: RowBatch) -> None:
        for fh, name, data in (
            (self._tokens, "input_ids.bin", batch.ids.astype(self.dtype)),
            (self._labels, "labels.bin", batch.labels.astype(np.int32, copy=False)),
        ):
            fh.write(data)
            self._hash[name].update(data)
        self._lengths.write(batch.seq_lens.astype(np.int32).tobytes())
        self._docs.write((self._samples + batch.seq_off[1:]).astype(np.int64).tobytes())
        self._samples += int(batch.seq_off[-1])
        self._doc_count += batch.rows

    def finish(self) -> dict:
        for fh in (self._tokens, self._labels, self._lengths, self._docs):
            fh.close()
        counts = (self._samples, self._doc_count + 1)
        for name, dtype in (("input_ids.idx", self.dtype), ("labels.idx", np.dtype(np.int32))):
            write_index(self.tmp / name, dtype, self._lengths_path, self._docs_path, *counts)
        self._lengths_path.unlink()
        self._docs_path.unlink()
        self.digests = {name: h.hexdigest() for name, h in self._hash.items()}
        return {"dtype": self.dtype.name, "vocab_size": self.vocab_size}


def write_index(
    path: Path, dtype: np.dtype, lengths_path: Path, docs_path: Path, sequences: int, docs: int
) -> None:
    """The MMIDIDX index from the scratch files of sequence lengths (int32) and document ends
    (int64): header, lengths, byte pointers (a running sum of lengths x itemsize), documents."""
    with open(path, "wb") as fh:
        fh.write(HEADER)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", DTYPE_CODES[dtype]))
        fh.write(struct.pack("<Q", sequences))
        fh.write(struct.pack("<Q", docs))
        for chunk in _chunks(lengths_path, np.int32):
            fh.write(chunk.tobytes())
        pointer = 0
        for chunk in _chunks(lengths_path, np.int32):
            sizes = chunk.astype(np.int64) * dtype.itemsize
            ends = np.cumsum(sizes) + pointer
            fh.write((ends - sizes).tobytes())
            pointer = int(ends[-1])
        for chunk in _chunks(docs_path, np.int64):
            fh.write(chunk.tobytes())


def _chunks(path: Path, dtype) -> Iterator[np.ndarray]:
    with open(path, "rb") as fh:
        while data := fh.read(CHUNK * np.dtype(dtype).itemsize):
            yield np.frombuffer(data, dtype=dtype)
