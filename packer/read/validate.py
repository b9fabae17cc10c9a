"""Validate: one reason code per row, then the valid rows as flat int32 arrays.

Validation gives every row a reason code (0 = valid, see `packer.read.reasons`) with
whole-array numpy operations, so valid data never goes through per-sample Python; data that is
all valid takes one faster pass (`packer.read.flatten`). `on_error="error"` stops at the first
bad row and names it; `on_error="skip"` drops the bad rows and records each one in `Rejects`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from packer.arguments import missing_column, named
from packer.contract.names import IGNORE_INDEX
from packer.errors import InputError
from packer.read.flatten import fast_flatten
from packer.read.formats import RawTable
from packer.read.reasons import INT32_MAX, REASON_CODE, REASONS
from packer.read.samples import Rejects, SourceFile

_C = REASON_CODE


@dataclass
class _Column:
    """A list<int> column as flat numpy: values, per-row lengths and ends, nulls."""

    values: np.ndarray
    lengths: np.ndarray
    is_null: np.ndarray  # row is null
    null_values: np.ndarray  # positions in `values` of null entries inside lists

    @cached_property
    def ends(self) -> np.ndarray:
        return np.cumsum(self.lengths)

    def row_of(self, positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.ends, positions, side="right")

    def span(self, row: int) -> tuple[int, int]:
        end = int(self.ends[row])
        return end - int(self.lengths[row]), end


def _flatten(column: pa.ChunkedArray) -> _Column:
    """Flat values of a list column, without per-row Python objects."""
    values, lengths, nulls, null_values = [], [], [], []
    base = 0
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy()
        child = chunk.values.slice(offsets[0], offsets[-1] - offsets[0])
        if child.null_count:
            null_values.append(
                np.flatnonzero(child.is_null().to_numpy(zero_copy_only=False)) + base
            )
            child = child.fill_null(0)
        values.append(child.to_numpy(zero_copy_only=False))
        lengths.append(np.diff(offsets).astype(np.int64))
        nulls.append(chunk.is_null().to_numpy(zero_copy_only=False))
        base += len(child)
    if not values:
        return _Column(
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0, np.int64)
        )
    return _Column(
        np.concatenate(values),
        np.concatenate(lengths),
        np.concatenate(nulls),
        np.concatenate(null_values) if null_values else np.zeros(0, np.int64),
    )


def _value_problems(col: _Column, allow_ignore: bool) -> tuple[np.ndarray, np.ndarray]:
    """(rows, codes) of rows holding an id out of range; the first bad value of a row decides."""
    values = col.values
    none = np.zeros(0, np.int64), np.zeros(0, np.uint8)
    if values.size == 0:
        return none
    signed = values.dtype.kind == "i"
    wide = values.dtype.itemsize > 4 or values.dtype.kind == "u"
    if values.min() >= 0 and (not wide or values.max() <= INT32_MAX):
        return none  # the common case: two reductions, no temporary arrays
    negative = values < 0 if signed else np.zeros(values.shape, bool)
    if allow_ignore and signed:
        negative &= values != IGNORE_INDEX
    big = values > INT32_MAX if wide else np.zeros(values.shape, bool)
    pos = np.flatnonzero(negative | big)
    if pos.size == 0:
        return none
    rows = col.row_of(pos)
    rows, first = np.unique(rows, return_index=True)
    codes = np.where(big[pos[first]], _C["id_out_of_range"], _C["negative_id"]).astype(np.uint8)
    return rows, codes


@dataclass
class _Checked:
    """One file after validation: per-row codes and the flat arrays."""

    codes: np.ndarray  # uint8 per row, 0 = valid
    ids: _Column
    labels: _Column | None
    messages: dict[int, str]
    input_column: str
    labels_column: str | None

    def message(self, row: int) -> str:
        """The one-line problem of a rejected row (computed for bad rows only)."""
        if row in self.messages:
            return self.messages[row]
        code = REASONS[int(self.codes[row]) - 1]
        name, lab = self.input_column, self.labels_column
        if code == "missing_input_ids":
            return f"no '{name}' in this sample"
        if code == "empty":
            return f"empty sample: '{name}' is []"
        if code == "missing_labels" and named(lab):
            # worded alike on every engine (a Ray task does not know the CLI's flag names)
            return f"no '{lab}' in this sample (a labels column that is named must be in every one)"
        if code == "missing_labels":
            return f"no '{lab}' in this sample, though other samples have them"
        if code == "labels_length":
            return (
                f"'{lab}' has {int(self.labels.lengths[row])} entries but '{name}' has "
                f"{int(self.ids.lengths[row])}"
            )
        for col_name, col, allow in ((name, self.ids, False), (lab, self.labels, True)):
            if col is None:
                continue
            text = _describe_values(col, row, col_name, allow)
            if text:
                return text
        return code.replace("_", " ")


def _describe_values(col: _Column, row: int, name: str, allow_ignore: bool) -> str | None:
    start, end = col.span(row)
    nulls = col.null_values[(col.null_values >= start) & (col.null_values < end)]
    if nulls.size:
        return f"'{name}'[{int(nulls[0]) - start}] is null, not an integer"
    for k, v in enumerate(col.values[start:end].tolist()):
        if v > INT32_MAX:
            return f"'{name}'[{k}] = {v} does not fit a 32-bit token id"
        if v < 0 and not (allow_ignore and v == IGNORE_INDEX):
            what = "negative label other than -100" if allow_ignore else "negative token id"
            return f"'{name}'[{k}] = {v} is a {what}"
    return None


def _check_table(
    raw: RawTable, where: str, input_column: str, labels_column: str | None
) -> _Checked:
    table = raw.table
    # the inputs' columns were checked before reading (packer.read.columns) where they could be
    if input_column not in table.column_names:
        raise missing_column("input_column", input_column, None, where)
    if labels_column and named(labels_column) and labels_column not in table.column_names:
        raise missing_column("labels_column", labels_column, None, where)
    n = table.num_rows
    ids = _flatten(table.column(input_column))
    parse = raw.parse_codes if raw.parse_codes is not None else np.zeros(n, np.uint8)
    if n and ids.is_null.all() and not parse.any():
        raise InputError(f"no sample has '{input_column}'", where=where)

    codes = np.zeros(n, np.uint8)
    labels = None
    if labels_column and labels_column in table.column_names:
        labels = _flatten(table.column(labels_column))
        if (labels.is_null | (parse != 0)).all() and not named(labels_column):
            labels = None  # JSONL without the key at all
    # Assign from the lowest priority up, so the most basic problem of a row is the one named.
    if labels is not None:
        rows, c = _value_problems(labels, allow_ignore=True)
        codes[rows] = c
        codes[labels.row_of(labels.null_values)] = _C["not_integer_list"]
        codes[(labels.lengths != ids.lengths) & ~labels.is_null] = _C["labels_length"]
        codes[labels.is_null] = _C["missing_labels"]
    rows, c = _value_problems(ids, allow_ignore=False)
    codes[rows] = c
    codes[ids.row_of(ids.null_values)] = _C["not_integer_list"]
    codes[ids.lengths == 0] = _C["empty"]
    codes[ids.is_null] = _C["missing_input_ids"]
    np.copyto(codes, parse, where=parse != 0)
    return _Checked(codes, ids, labels, raw.messages, input_column, labels_column)


def validate(
    raw: RawTable,
    src: SourceFile,
    row_base: int,
    input_column: str,
    labels_column: str | None,
    on_error: str,
    rejects: Rejects | None,
    chunked: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, bool]:
    """Validate rows `row_base...` of `src` held in `raw`: (tokens, lengths, labels, kept, labels?).

    `kept` (rows within `raw`) is None when every row is valid. Used per file by the in-memory
    reader and per record batch by the streaming reader, with the same codes and messages.
    With `chunked`, valid int32 data comes back as lists of views of the Arrow chunks.
    """
    fast = (
        fast_flatten(raw.table, input_column, labels_column, zero_copy=chunked)
        if raw.parse_codes is None
        else None
    )
    if fast is not None and (fast[2] is not None or not (labels_column and named(labels_column))):
        # every row valid: one compiled pass, no per-row codes needed
        tokens, lengths, lab = fast
        return tokens, lengths, lab, None, lab is not None
    checked = _check_table(raw, str(src.path), input_column, labels_column)
    ids, labels = checked.ids, checked.labels
    kept = None
    bad = np.flatnonzero(checked.codes)
    if bad.size:
        if on_error != "skip":
            first = int(bad[0])
            raise InputError(checked.message(first), where=src.locate(row_base + first))
        if rejects is not None:
            rejects.add(
                src, bad + row_base, checked.codes[bad], [checked.message(r) for r in bad.tolist()]
            )
        src.rejected += int(bad.size)
        keep = checked.codes == 0
        kept = np.flatnonzero(keep)
        values = ids.values[np.repeat(keep, ids.lengths)]
        label_values = labels.values[np.repeat(keep, labels.lengths)] if labels else None
        lengths = ids.lengths[keep]
    else:
        values, lengths = ids.values, ids.lengths
        label_values = labels.values if labels else None
    tokens = values.astype(np.int32, copy=False)
    lab = label_values.astype(np.int32, copy=False) if label_values is not None else None
    return tokens, lengths, lab, kept, labels is not None
