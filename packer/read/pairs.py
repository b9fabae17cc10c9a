"""Preference pairs: read rows of prompt, chosen and rejected token ids (TRL's tokenized DPO
form), check every row, and lay each pair out as two samples, prompt + chosen and prompt +
rejected, with the prompt labelled -100.

The files are read by the format readers of `packer.read.formats` and checked with the same
value checks as samples (`packer.read.validate`), so a bad row is named by file and line or row
with the same words; the pair's own problems are a missing side and an empty completion (or
prompt). `pair_samples` builds the flat token and label arrays of the kept pairs in one
vectorized gather, the prompt copied once per side, so the shards are written by the gather
kernel of every other run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.contract.names import IGNORE_INDEX
from packer.errors import InputError
from packer.planning.overlength import Segments
from packer.planning.pairs import PairLengths
from packer.read.assemble import new_source
from packer.read.files import detect_format, expand_inputs
from packer.read.formats import READERS
from packer.read.reasons import REASON_CODE, REASONS
from packer.read.samples import Rejects, Samples, SourceFile
from packer.read.validate import _Column, _describe_values, _flatten, _value_problems

_C = REASON_CODE
PARTS = ("prompt", "chosen", "rejected")


@dataclass
class Pairs:
    """The valid pairs read, as three flat columns (values int32, lengths int64) side by side."""

    values: tuple[np.ndarray, np.ndarray, np.ndarray]  # prompt, chosen, rejected
    lengths: tuple[np.ndarray, np.ndarray, np.ndarray]
    index: np.ndarray  # int64: the global input row of each pair
    sources: list[SourceFile]
    rejects: Rejects | None

    @property
    def num_pairs(self) -> int:
        return int(self.index.size)

    def locate(self, position: int) -> str:
        """Where pair `position` (of those read) is in the input."""
        index = int(self.index[position])
        starts = [s.first_index for s in self.sources]
        src = self.sources[int(np.searchsorted(starts, index, side="right")) - 1]
        return src.locate(index - src.first_index)


def _codes(columns: list[_Column], names: list[str], parse: np.ndarray) -> np.ndarray:
    """One reason code per row, the most basic problem of a row winning."""
    n = columns[0].lengths.size
    codes = np.zeros(n, np.uint8)
    for col in columns:
        rows, c = _value_problems(col, allow_ignore=False)
        codes[rows] = np.where(codes[rows] == 0, c, codes[rows])
    for col in columns:
        codes[col.row_of(col.null_values)] = _C["not_integer_list"]
    for col in columns:
        codes[(col.lengths == 0) & ~col.is_null] = _C["empty"]
    for col in columns:
        codes[col.is_null] = _C["missing_side"]
    np.copyto(codes, parse, where=parse != 0)
    return codes


def _message(row: int, code: int, columns: list[_Column], names: list[str], raw_messages) -> str:
    """The one-line problem of a bad row."""
    if row in raw_messages:
        return raw_messages[row]
    reason = REASONS[code - 1]
    for part, col, name in zip(PARTS, columns, names):
        if reason == "missing_side" and col.is_null[row]:
            return f"no '{name}' in this pair: a pair needs a prompt, a chosen and a rejected side"
        if reason == "empty" and col.lengths[row] == 0 and not col.is_null[row]:
            if part == "prompt":
                return (
                    f"empty prompt: '{name}' is [] (the first token of each completion would "
                    "have nothing to be predicted from)"
                )
            return f"empty {part} completion: '{name}' is []"
    for col, name in zip(columns, names):
        text = _describe_values(col, row, name, False)
        if text:
            return text
    return reason.replace("_", " ")


def _read_file(
    path: Path, names: list[str], first: int, on_error: str, rejects: Rejects | None
) -> tuple[SourceFile, list[np.ndarray], list[np.ndarray], np.ndarray]:
    """One file's valid pairs: (source, values per part, lengths per part, kept rows)."""
    fmt, _ = detect_format(path)
    raw = READERS[fmt](path, names)
    src = new_source(path, fmt, raw.table.num_rows, first, raw.lines)
    table = raw.table
    n = table.num_rows
    for name in names:
        if name not in table.column_names:
            raise InputError(f"no '{name}' column: a pair needs all of {names}", where=str(path))
    columns = [_flatten(table.column(name)) for name in names]
    parse = raw.parse_codes if raw.parse_codes is not None else np.zeros(n, np.uint8)
    for col, name in zip(columns, names):
        if n and (col.is_null | (parse != 0)).all() and not parse.all():
            raise InputError(f"no pair has '{name}': a pair needs all of {names}", where=str(path))
    codes = _codes(columns, names, parse)
    bad = np.flatnonzero(codes)
    keep = codes == 0
    if bad.size:
        if on_error != "skip":
            row = int(bad[0])
            message = _message(row, int(codes[row]), columns, names, raw.messages)
            raise InputError(message, where=src.locate(row))
        messages = [_message(r, int(codes[r]), columns, names, raw.messages) for r in bad.tolist()]
        if rejects is not None:
            rejects.add(src, bad, codes[bad], messages)
        src.rejected = int(bad.size)
    values = [col.values[np.repeat(keep, col.lengths)].astype(np.int32) for col in columns]
    lengths = [col.lengths[keep] for col in columns]
    src.has_labels = False
    return src, values, lengths, first + np.flatnonzero(keep)


def read_pairs(
    inputs: Iterable[str | Path],
    columns: tuple[str, str, str],
    on_error: str = "error",
    progress: Callable[[Path], None] | None = None,
) -> Pairs:
    """Read and check every pair file (in the given, sorted order): `columns` names the prompt,
    chosen and rejected columns. `on_error="skip"` leaves bad rows out and lists them in
    `Pairs.rejects`; their global indices stay reserved, as for samples."""
    names = list(columns)
    rejects = Rejects() if on_error == "skip" else None
    sources, values, lengths, index = [], [], [], []
    first = 0
    for path in expand_inputs(inputs):
        src, v, n, kept = _read_file(path, names, first, on_error, rejects)
        sources.append(src)
        values.append(v)
        lengths.append(n)
        index.append(kept)
        first += src.num_samples
        if progress:
            progress(path)
    if first == 0:
        raise InputError("the dataset is empty: the inputs hold no pairs")
    kept = np.concatenate(index).astype(np.int64)
    if kept.size == 0:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(rejects.counts.items()))
        raise InputError(f"the dataset is empty: all {first} pairs were rejected ({counts})")
    return Pairs(
        values=tuple(np.concatenate([v[k] for v in values]) for k in range(3)),
        lengths=tuple(np.concatenate([n[k] for n in lengths]) for k in range(3)),
        index=kept,
        sources=sources,
        rejects=rejects,
    )


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every position of the ranges [start, start + length), concatenated."""
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)


def pair_samples(pairs: Pairs, kept: PairLengths) -> tuple[Samples, Segments]:
    """The kept pairs as samples, segment 2k = prompt + chosen and 2k + 1 = prompt + rejected
    of the k-th kept pair, and their segments (`sample` = 2 x the pair's index + side)."""
    (pv, cv, rv), (pl, cl, rl) = pairs.values, pairs.lengths
    rows = kept.kept
    # where each part of each kept pair starts in the three columns laid end to end
    part_starts = [np.cumsum(n) - n for n in (pl, cl, rl)]
    base = np.array([0, pv.size, pv.size + cv.size], np.int64)
    prompt_start = base[0] + part_starts[0][rows] + kept.prompt_cut
    chosen_start = base[1] + part_starts[1][rows]
    rejected_start = base[2] + part_starts[2][rows]
    # four pieces per pair: prompt, chosen, prompt, rejected
    starts = np.stack([prompt_start, chosen_start, prompt_start, rejected_start], 1).ravel()
    lens = np.stack([kept.prompt, kept.chosen, kept.prompt, kept.rejected], 1).ravel()
    values = np.concatenate([pv, cv, rv])
    tokens = values[_ranges(starts, lens)]
    is_prompt = np.tile(np.array([True, False, True, False]), rows.size)
    labels = np.where(np.repeat(is_prompt, lens), IGNORE_INDEX, tokens).astype(np.int32)
    seg_len = lens.reshape(-1, 2).sum(1)
    offsets = np.zeros(seg_len.size + 1, np.int64)
    np.cumsum(seg_len, out=offsets[1:])
    samples = Samples(
        tokens=tokens, offsets=offsets, labels=labels, sources=pairs.sources, rejects=pairs.rejects
    )
    pair = pairs.index[rows]
    segs = Segments(
        sample=np.stack([2 * pair, 2 * pair + 1], 1).ravel(),
        start=offsets[:-1].copy(),
        length=seg_len,
        offset=np.zeros(seg_len.size, np.int32),
        dropped=kept.dropped,
        truncated=kept.truncated,
        split=0,
        tokens_removed=kept.tokens_removed,
    )
    return samples, segs
