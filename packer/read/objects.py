"""Python objects and Arrow tables to validated `Samples`: what `pack_dataset` is given.

Token lists, tuples, numpy arrays (one per sample, or one 2-d array), dict rows, `pyarrow`
tables and any iterable of them become `RawTable`s (the token column, the labels column when
present, and the samples that are not integer lists), then `Samples` through the readers' own
`validate`: the same codes and messages as the CLI, with `sample N` in place of a file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.arguments import missing_column, named
from packer.config import PackConfig
from packer.errors import InputError, UsageError, option
from packer.read.assemble import assemble_offsets, chunked_samples
from packer.read.formats import RawTable, _line_problem, _list_of_int
from packer.read.reasons import REASON_CODE
from packer.read.samples import Rejects, Samples, SourceFile
from packer.read.validate import validate

READ_CHUNK = 10_000  # samples of an iterable converted to Arrow at a time


# --------------------------------------------------------------------------------------------
# Where a sample is: "sample N" instead of a file and line


class _InMemorySource(SourceFile):
    """The data given to `pack_dataset`: rows are named by their global sample index."""

    def position(self, row: int) -> tuple[str, int]:
        return "sample", self.first_index + int(row)

    def locate(self, row: int) -> str:
        return f"sample {self.first_index + int(row)}"


def _source(num_samples: int, first_index: int = 0) -> _InMemorySource:
    return _InMemorySource(
        path=Path("input"),
        format="memory",
        num_samples=num_samples,
        first_index=first_index,
        size=0,
        fingerprint="",
        has_labels=False,
    )


# --------------------------------------------------------------------------------------------
# Inputs to one Arrow table of the token (and label) column


def check_columns(table: pa.Table, input_column: str, labels_column: str | None) -> pa.Table:
    """The token and label columns of `table`; absent or mistyped columns are one clear error."""
    if input_column not in table.column_names:
        raise missing_column("input_column", input_column, table.column_names, "the input")
    if labels_column and named(labels_column) and labels_column not in table.column_names:
        raise missing_column("labels_column", labels_column, table.column_names, "the input")
    keep = [input_column]
    if labels_column and labels_column in table.column_names:
        keep.append(labels_column)
    for name in keep:
        type_ = table.schema.field(name).type
        if pa.types.is_null(type_) or (
            (pa.types.is_list(type_) or pa.types.is_large_list(type_))
            and pa.types.is_null(type_.value_type)
        ):
            # only nulls and empty lists: let validation name the first such sample
            table = table.set_column(
                table.column_names.index(name), name, table.column(name).cast(pa.list_(pa.int64()))
            )
        elif not _list_of_int(type_):
            raise InputError(
                f"column '{name}' has type {type_}, expected a list of integers", where="input"
            )
    return table.select(keep)


def _plain(value):
    """A sample's value as JSON-able Python (numpy scalars and arrays included)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _problem(value, name: str) -> tuple[str, str] | None:
    """(reason, message) of one sample's value, in the JSONL reader's words (error path only)."""
    if value is None:
        return None  # a null: validation says "no 'input_ids' in this sample"
    if isinstance(value, np.ndarray) and value.ndim != 1:
        return (
            "not_integer_list",
            f"'{name}' must be a 1-d list of integers, got shape {value.shape}",
        )
    if isinstance(value, (str, bytes)):
        return (
            "not_integer_list",
            f"'{name}' must be a list of integers, got {type(value).__name__}",
        )
    text = json.dumps({name: _plain(value)}, default=repr)
    return _line_problem(text, [name])


def _int_column(values, name: str) -> tuple[pa.Array, np.ndarray | None, dict[int, str]]:
    """A list<int> Arrow array of the samples, plus per-sample reason codes and messages for
    those that are not integer lists (nulls in the array; the codes are None when all are)."""
    values = list(values) if not isinstance(values, (list, tuple)) else values
    n = len(values)
    if n and all(
        isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu" for v in values
    ):
        flat = np.concatenate(values)
        if flat.dtype.kind in "iu":  # int64 mixed with uint64 would have become float64
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(np.fromiter((v.size for v in values), np.int64, n), out=offsets[1:])
            return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat)), None, {}
    try:
        # inferred, not cast: an explicit int type would silently truncate 2.5 to 2
        array = pa.array(values)
        type_ = array.type
        if pa.types.is_null(type_) or (
            (pa.types.is_list(type_) or pa.types.is_large_list(type_))
            and pa.types.is_null(type_.value_type)
        ):
            return array.cast(pa.list_(pa.int64())), None, {}
        if _list_of_int(type_):
            return array, None, {}
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        pass
    # Some sample is not a list of integers: name each such sample, keep the others.
    codes = np.zeros(n, np.uint8)
    messages = {}
    clean = list(values)
    for i, value in enumerate(values):
        problem = _problem(value, name)
        if problem:
            codes[i] = REASON_CODE[problem[0]]
            messages[i] = problem[1]
            clean[i] = None
    try:
        array = pa.array([_plain(v) for v in clean], pa.list_(pa.int64()))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
        raise InputError(f"'{name}' cannot be read as lists of integers ({exc})") from None
    return array, codes, messages


def _check_keys(row: dict, input_column: str, labels_column: str | None) -> None:
    """Dict rows: the first one has the column options' keys (`packer.read.columns`)."""
    have = [str(k) for k in row]
    if input_column not in row:
        raise missing_column("input_column", input_column, have, "the first sample")
    if labels_column and named(labels_column) and labels_column not in row:
        raise missing_column("labels_column", labels_column, have, "the first sample")


def _unused_columns(data, labels, input_column: str, labels_column: str | None) -> None:
    """Column options name keys of dict rows: with token sequences, or `labels_column` with
    `labels=`, they would be ignored, so they are refused."""
    dict_rows = not isinstance(data, np.ndarray) and isinstance(data[0], dict)
    for name, value in (("input_column", input_column), ("labels_column", labels_column)):
        if not value or not named(value):
            continue
        if name == "labels_column" and labels is not None:
            raise UsageError(f"{option(name)} cannot be used with labels=, which gives the labels")
        if not dict_rows:
            raise UsageError(
                f"{option(name)} names a key of dict rows or a column of a table; token "
                "sequences have none"
            )


def lists_raw(data, labels, input_column: str, labels_column: str | None) -> RawTable:
    """Token sequences (lists, tuples, numpy arrays, a 2-d array or dict rows) as a RawTable."""
    if len(data):
        _unused_columns(data, labels, input_column, labels_column)
    if isinstance(data, np.ndarray) and data.ndim == 2 and data.dtype.kind in "iu":
        n, width = data.shape
        offsets = np.arange(n + 1, dtype=np.int64) * width
        ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(data.reshape(-1)))
        id_codes, id_messages = None, {}
    else:
        if len(data) and all(isinstance(row, dict) for row in data[:1]):
            rows = data
            _check_keys(rows[0], input_column, labels_column)
            data = [row.get(input_column) if isinstance(row, dict) else row for row in rows]
            if labels is None and labels_column:
                found = [row.get(labels_column) if isinstance(row, dict) else None for row in rows]
                labels = found if any(x is not None for x in found) else None
        ids, id_codes, id_messages = _int_column(data, input_column)
    columns = {input_column: ids}
    codes, messages = id_codes, id_messages
    if labels is not None:
        if isinstance(labels, np.ndarray) and labels.ndim == 2:
            labels = list(labels)
        if len(labels) != len(ids):
            raise UsageError(f"labels has {len(labels)} entries but there are {len(ids)} samples")
        lab, lab_codes, lab_messages = _int_column(labels, labels_column or "labels")
        columns[labels_column or "labels"] = lab
        if lab_codes is not None:
            codes = codes if codes is not None else np.zeros(len(ids), np.uint8)
            for i in np.flatnonzero(lab_codes & (codes == 0)).tolist():
                codes[i], messages[i] = lab_codes[i], lab_messages[i]
    return RawTable(pa.table(columns), parse_codes=codes, messages=messages)


# --------------------------------------------------------------------------------------------
# An iterable, a chunk at a time


def table_chunks(tables: Iterable[pa.Table], cfg: PackConfig) -> Iterator[RawTable]:
    """Arrow tables of an iterable's samples (a `datasets.IterableDataset`'s) as RawTables."""
    labels_column = cfg.labels_column or None
    for table in tables:
        yield RawTable(check_columns(table, cfg.input_column, labels_column))


def list_chunks(data, labels, cfg: PackConfig) -> Iterator[RawTable]:
    """An iterable's samples (and `labels`, parallel to them) as RawTables of up to
    `READ_CHUNK` rows."""
    labels_column = cfg.labels_column or None
    items = iter(data)
    label_items = iter(labels) if labels is not None else None
    while True:
        chunk = []
        for item in items:
            chunk.append(item)
            if len(chunk) == READ_CHUNK:
                break
        if not chunk:
            if label_items is not None and next(label_items, None) is not None:
                raise UsageError("labels has more entries than there are samples")
            return
        lab = None
        if label_items is not None:
            lab = [x for _, x in zip(chunk, label_items)]
            if len(lab) != len(chunk):
                raise UsageError("labels has fewer entries than there are samples")
        yield lists_raw(chunk, lab, cfg.input_column, labels_column)


# --------------------------------------------------------------------------------------------
# Validation


def table_samples(
    raw: RawTable, cfg: PackConfig, first_index: int = 0, global_index: bool = False
) -> tuple[Samples | None, int, Rejects | None]:
    """Validate one table of samples: (Samples or None when every one was rejected, rows, rejects).

    global_index: always fill `Samples.index` (a window of a stream starts at `first_index`).
    """
    n = raw.table.num_rows
    src = _source(n, first_index)
    rejects = Rejects() if cfg.on_error == "skip" else None
    labels_column = cfg.labels_column or None
    tokens, lengths, lab, kept, has_labels = validate(
        raw, src, 0, cfg.input_column, labels_column, cfg.on_error, rejects, chunked=True
    )
    src.has_labels = has_labels
    if not global_index:
        offsets, index = assemble_offsets(
            [lengths], [kept if kept is not None else (0, n)], n, rejects
        )
    else:
        if len(lengths) == 0:
            return None, n, rejects
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        index = first_index + (kept if kept is not None else np.arange(n, dtype=np.int64))
    samples = chunked_samples([tokens], [lab], offsets, [src], index, rejects)
    return samples, n, rejects
