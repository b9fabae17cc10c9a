"""Samples: the in-memory form of a token dataset, flat values plus offsets, no per-sample objects.

`SourceFile` is one input file, `Rejects` what `--on-error skip` left out, and `Chunks` the
contiguous int32 arrays that hold the values of the chunked form (read by the gather kernel).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packer.read.reasons import REASONS


@dataclass
class SourceFile:
    """One input file and the slice of global sample indices it contributed."""

    path: Path
    format: str  # "jsonl", "parquet" or "arrow"
    num_samples: int  # rows in the file, rejected ones included
    first_index: int
    size: int
    fingerprint: str
    has_labels: bool
    rejected: int = 0
    # For JSONL: 1-based line number of every sample, filled only when an error needs it.
    _lines: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def from_manifest(cls, entry: dict, **extra):
        """An input as a packer manifest records it (the file itself may be gone)."""
        return cls(
            path=Path(entry["path"]),
            format=entry["format"],
            num_samples=int(entry["samples"]),
            first_index=int(entry["first_index"]),
            size=int(entry["bytes"]),
            fingerprint=entry["fingerprint"],
            has_labels=bool(entry.get("has_labels")),
            rejected=int(entry.get("rejected", 0)),
            **extra,
        )

    def position(self, row: int) -> tuple[str, int]:
        """("line", 1-based line) for JSONL, ("row", 0-based row) for Parquet and Arrow."""
        if self.format != "jsonl":
            return "row", int(row)
        if self._lines is None:
            from packer.read.formats import jsonl_line_numbers  # only when an error needs it

            self._lines = jsonl_line_numbers(self.path)
        return "line", int(self._lines[row]) if 0 <= row < len(self._lines) else -1

    def locate(self, row: int) -> str:
        """Human location of a row of this file: a line for JSONL, a 0-based row otherwise."""
        kind, n = self.position(row)
        return f"{self.path}: {kind} {n}"


@dataclass
class Rejects:
    """Samples left out by `--on-error skip`: one record per sample plus counts per reason."""

    records: list[dict] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.records)

    def add(
        self, src: SourceFile, rows: np.ndarray, codes: np.ndarray, messages: list[str]
    ) -> None:
        """Record rejected `rows` of `src` (per-rejected-sample work only)."""
        for row, code, message in zip(rows.tolist(), codes.tolist(), messages):
            kind, n = src.position(row)
            self.records.append(
                {
                    "file": str(src.path),
                    kind: n,
                    "sample_index": src.first_index + row,
                    "reason": REASONS[code - 1],
                    "message": message,
                }
            )
        for code, count in enumerate(np.bincount(codes, minlength=len(REASONS) + 1).tolist()):
            if code and count:
                name = REASONS[code - 1]
                self.counts[name] = self.counts.get(name, 0) + count

    def jsonl_lines(self) -> Iterator[str]:
        import json

        for record in self.records:
            yield json.dumps(record, sort_keys=True) + "\n"


@dataclass
class Samples:
    """Samples as CSR: sample i is `tokens[offsets[i]:offsets[i+1]]`.

    `labels`, when present, shares `offsets` with `tokens`. Keeping the dataset as two or three
    flat arrays is what lets the planning and gather kernels run without Python objects.

    With `--on-error skip` some input samples are left out; `index` then maps each kept sample
    to its global index in the input (rejected samples keep their index, so the numbering always
    follows the input), and `rejects` says what was left out and why.
    """

    tokens: np.ndarray  # int32[total]
    offsets: np.ndarray  # int64[n + 1]
    labels: np.ndarray | None  # int32[total] or None
    sources: list[SourceFile]
    index: np.ndarray | None = None  # int64[n]: global index of each kept sample; None = 0..n-1
    rejects: Rejects | None = None
    # Chunked form (`read_samples(..., chunked=True)`, used by `pack`): the values stay in the
    # input's Arrow chunks, uncopied; `tokens` and `labels` are then None and global position p
    # is in chunk k = searchsorted(chunk_starts, p, "right") - 1. See `packer.write.gather`.
    token_chunks: list | None = None
    label_chunks: list | None = None
    chunk_starts: np.ndarray | None = None  # int64[k + 1]

    @property
    def has_labels(self) -> bool:
        return self.labels is not None or self.label_chunks is not None

    @property
    def num_samples(self) -> int:
        """Samples held (rejected ones excluded)."""
        return len(self.offsets) - 1

    @property
    def num_input_samples(self) -> int:
        """Samples in the input files, rejected ones included."""
        return sum(s.num_samples for s in self.sources)

    @property
    def num_rejected(self) -> int:
        return self.rejects.total if self.rejects else 0

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def labels_at(self, positions: np.ndarray) -> np.ndarray:
        """The labels at global token positions, wherever the values live."""
        if self.labels is not None:
            return np.asarray(self.labels[positions], np.int32)
        chunk = np.searchsorted(self.chunk_starts, positions, side="right") - 1
        out = np.empty(positions.size, np.int32)
        for c in np.unique(chunk).tolist():
            sel = chunk == c
            out[sel] = self.label_chunks[c][positions[sel] - self.chunk_starts[c]]
        return out

    def global_index(self, position: int) -> int:
        """Global (input) index of the sample held at `position`."""
        return int(self.index[position]) if self.index is not None else int(position)

    def source_of(self, index: int) -> tuple[SourceFile, int]:
        """The file a global sample index came from, and its row inside that file."""
        starts = [s.first_index for s in self.sources]
        pos = int(np.searchsorted(starts, index, side="right")) - 1
        src = self.sources[pos]
        return src, index - src.first_index

    def locate(self, position: int) -> str:
        """Where the sample held at `position` is in the input."""
        src, row = self.source_of(self.global_index(position))
        return src.locate(row)


class Chunks(list):
    """int32 arrays that the gather kernel reads, with their addresses (`addresses`).

    A list of the arrays themselves, so they live as long as the addresses are used.
    """

    addresses: np.ndarray


def as_chunks(arrays) -> Chunks:
    """The chunks that `gather_rows` reads from: contiguous int32 arrays, left where they are."""
    chunks = Chunks()
    for a in arrays:
        if a.dtype != np.int32 or a.ndim != 1 or not (a.flags.c_contiguous or a.size == 0):
            raise TypeError(f"gather chunks must be contiguous int32 arrays, got {a.dtype}")
        chunks.append(a)
    chunks.addresses = np.array([a.ctypes.data for a in chunks], np.int64)
    return chunks
