"""The in-memory form of a token dataset: flat values plus offsets, no per-sample objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

IGNORE_INDEX = -100
INT32_MAX = np.iinfo(np.int32).max


@dataclass
class SourceFile:
    """One input file and the slice of global sample indices it contributed."""

    path: Path
    format: str  # "jsonl", "parquet" or "arrow"
    num_samples: int
    first_index: int
    size: int
    fingerprint: str
    has_labels: bool
    # For JSONL: 1-based line number of every sample, filled only when an error needs it.
    _lines: np.ndarray | None = field(default=None, repr=False)

    def locate(self, row: int) -> str:
        """Human location of a row of this file: a line for JSONL, a 0-based row otherwise."""
        if self.format == "jsonl":
            return f"{self.path}: line {line_of_row(self.path, row)}"
        return f"{self.path}: row {row}"


def line_of_row(path: Path, row: int) -> int:
    """1-based line of the `row`-th non-blank line of a (possibly compressed) JSONL file."""
    from packer.readers import open_text  # local import: readers imports this module

    seen = -1
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                seen += 1
                if seen == row:
                    return lineno
    return -1


@dataclass
class Samples:
    """Samples as CSR: sample i is `tokens[offsets[i]:offsets[i+1]]`.

    `labels`, when present, shares `offsets` with `tokens`. Keeping the dataset as two or three
    flat arrays is what lets the planning and gather kernels run without Python objects.
    """

    tokens: np.ndarray  # int32[total]
    offsets: np.ndarray  # int64[n + 1]
    labels: np.ndarray | None  # int32[total] or None
    sources: list[SourceFile]

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def source_of(self, index: int) -> tuple[SourceFile, int]:
        """The file a global sample index came from, and its row inside that file."""
        starts = [s.first_index for s in self.sources]
        pos = int(np.searchsorted(starts, index, side="right")) - 1
        src = self.sources[pos]
        return src, index - src.first_index

    def locate(self, index: int) -> str:
        src, row = self.source_of(index)
        return src.locate(row)
