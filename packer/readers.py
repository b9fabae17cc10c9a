"""Readers: turn JSONL, Parquet and Arrow files into validated flat token arrays.

Each format has one small function that returns an Arrow table holding the token column and,
when present, the labels column. Everything after that (type checks, id ranges, empty samples,
label lengths, flattening to numpy) is shared, so adding a format touches one function.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from packer.errors import InputError
from packer.samples import IGNORE_INDEX, INT32_MAX, Samples, SourceFile

_SUFFIXES = {
    ".jsonl": ("jsonl", None),
    ".ndjson": ("jsonl", None),
    ".jsonl.gz": ("jsonl", "gzip"),
    ".ndjson.gz": ("jsonl", "gzip"),
    ".jsonl.zst": ("jsonl", "zstd"),
    ".ndjson.zst": ("jsonl", "zstd"),
    ".parquet": ("parquet", None),
    ".arrow": ("arrow", None),
    ".feather": ("arrow", None),
    ".ipc": ("arrow", None),
}
_GLOB_CHARS = set("*?[")


def detect_format(path: Path) -> tuple[str, str | None]:
    """(format, compression) from the file name; raises for names packer cannot read."""
    name = path.name.lower()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return _SUFFIXES[suffix]
    known = ", ".join(sorted(_SUFFIXES))
    raise InputError(f"unknown file type (expected one of {known})", where=str(path))


def _is_data_file(path: Path) -> bool:
    try:
        detect_format(path)
    except InputError:
        return False
    return not path.name.startswith(".")


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Files named by the inputs: plain files, directories (recursive) and globs, each sorted."""
    files: list[Path] = []
    for item in inputs:
        text = str(item)
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_data_file(p))
            if not found:
                raise InputError("directory holds no .jsonl, .parquet or .arrow files", where=text)
            files.extend(found)
        elif _GLOB_CHARS & set(text) and not path.exists():
            found = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
            if not found:
                raise InputError("no file matches this pattern", where=text)
            files.extend(found)
        elif path.is_file():
            detect_format(path)
            files.append(path)
        elif path.exists():
            raise InputError("not a regular file", where=text)
        else:
            raise InputError("no such file or directory", where=text)
    if not files:
        raise InputError("no input files given")
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key in seen:
            raise InputError("the same file is named twice in the inputs", where=str(f))
        seen.add(key)
        unique.append(f)
    return unique


def open_text(path: Path) -> io.TextIOBase:
    """A text stream over a JSONL file, decompressing .gz and .zst transparently."""
    _, compression = detect_format(path)
    return io.TextIOWrapper(pa.input_stream(str(path), compression=compression), encoding="utf-8")


def fingerprint(path: Path) -> str:
    """A cheap content fingerprint: sha256 over the size and up to three 1 MiB blocks.

    Hashing whole multi-GB inputs would cost more than packing them; the sampled blocks catch
    truncated, regenerated or swapped files, which is what a manifest reader needs to notice.
    """
    size = path.stat().st_size
    block = 1 << 20
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        for start in sorted({0, max(0, size // 2 - block // 2), max(0, size - block)}):
            fh.seek(start)
            digest.update(fh.read(block))
    return "sha256-sampled:" + digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Per-format table readers


def _json_schema(columns: list[str]) -> pa.Schema:
    return pa.schema([(c, pa.list_(pa.int64())) for c in columns])


def _read_jsonl(path: Path, columns: list[str]) -> pa.Table:
    _, compression = detect_format(path)
    try:
        return pa_json.read_json(
            pa.input_stream(str(path), compression=compression),
            read_options=pa_json.ReadOptions(block_size=16 << 20),
            parse_options=pa_json.ParseOptions(
                explicit_schema=_json_schema(columns), unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError) as exc:
        # The fast parser says little about where; re-read line by line to name the line.
        raise _diagnose_jsonl(path, columns, str(exc)) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc}", where=str(path)) from None


def _diagnose_jsonl(path: Path, columns: list[str], arrow_message: str) -> InputError:
    try:
        with open_text(path) as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                problem = jsonl_line_problem(line, columns)
                if problem:
                    return InputError(problem, where=f"{path}: line {lineno}")
    except UnicodeDecodeError as exc:
        return InputError(f"not UTF-8 text ({exc.reason})", where=str(path))
    except OSError as exc:
        return InputError(f"cannot read: {exc}", where=str(path))
    return InputError(f"cannot parse JSONL: {arrow_message}", where=str(path))


def jsonl_line_problem(line: str, columns: list[str]) -> str | None:
    """What is wrong with one JSONL line for the given list-of-int columns, or None."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"malformed JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    for name in columns:
        value = obj.get(name)
        if value is None:
            continue  # absent columns are reported after reading, with the rest of the file
        if not isinstance(value, list):
            return f"'{name}' must be a list of integers, got {type(value).__name__}"
        for pos, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int):
                return f"'{name}'[{pos}] is {v!r}, not an integer"
            if not -(2**63) <= v < 2**63:
                return f"'{name}'[{pos}] = {v} does not fit a 32-bit token id"
    return None


def _list_of_int(type_: pa.DataType) -> bool:
    return (
        pa.types.is_list(type_) or pa.types.is_large_list(type_)
    ) and pa.types.is_integer(type_.value_type)


def _select(table: pa.Table, path: Path, columns: list[str]) -> pa.Table:
    """Keep the wanted columns that exist; a present column must be a list of integers."""
    keep = {}
    for name in columns:
        if name not in table.column_names:
            continue
        type_ = table.schema.field(name).type
        if not _list_of_int(type_):
            raise InputError(f"column '{name}' has type {type_}, expected a list of integers",
                             where=str(path))
        keep[name] = table.column(name)
    return pa.table(keep) if keep else pa.table({"__rows__": pa.nulls(table.num_rows)})


def _read_parquet(path: Path, columns: list[str]) -> pa.Table:
    try:
        schema = pq.read_schema(path)
        present = [c for c in columns if c in schema.names]
        table = pq.read_table(path, columns=present, memory_map=True)
        if not present:
            table = pa.table({"__rows__": pa.nulls(pq.ParquetFile(path).metadata.num_rows)})
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read Parquet: {exc}", where=str(path)) from None
    return _select(table, path, columns)


def _read_arrow(path: Path, columns: list[str]) -> pa.Table:
    try:
        source = pa.memory_map(str(path))
        try:
            table = pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            table = pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read Arrow IPC: {exc}", where=str(path)) from None
    return _select(table, path, columns)


READERS: dict[str, Callable[[Path, list[str]], pa.Table]] = {
    "jsonl": _read_jsonl,
    "parquet": _read_parquet,
    "arrow": _read_arrow,
}


# --------------------------------------------------------------------------------------------
# Shared validation and flattening


def _flatten(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, lengths, is_null) of a list column, without per-row Python objects."""
    values, lengths, nulls = [], [], []
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy()
        child = chunk.values.slice(offsets[0], offsets[-1] - offsets[0])
        if child.null_count:
            raise ValueError("null inside list")
        values.append(child.to_numpy(zero_copy_only=False))
        lengths.append(np.diff(offsets).astype(np.int64))
        nulls.append(chunk.is_null().to_numpy(zero_copy_only=False))
    if not values:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool)
    return np.concatenate(values), np.concatenate(lengths), np.concatenate(nulls)


def _first_row(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _row_of_value(lengths: np.ndarray, value_pos: int) -> int:
    return int(np.searchsorted(np.cumsum(lengths), value_pos, side="right"))


def _check_ids(
    values: np.ndarray, lengths: np.ndarray, name: str, allow_ignore: bool
) -> tuple[int, str] | None:
    """(row, problem) for the first out-of-range value, or None."""
    if values.size == 0:
        return None
    bad = values < 0
    if allow_ignore:
        bad &= values != IGNORE_INDEX
    if values.dtype.itemsize > 4 or values.dtype.kind == "u":
        too_big = values > INT32_MAX
    else:
        too_big = np.zeros(values.shape, bool)
    if not bad.any() and not too_big.any():
        return None
    pos_bad = _first_row(bad) if bad.any() else values.size
    pos_big = _first_row(too_big) if too_big.any() else values.size
    pos = min(pos_bad, pos_big)
    row = _row_of_value(lengths, pos)
    within = pos - int(np.sum(lengths[:row]))
    v = int(values[pos])
    if pos == pos_big:
        return row, f"'{name}'[{within}] = {v} does not fit a 32-bit token id"
    what = "negative token id" if not allow_ignore else "negative label other than -100"
    return row, f"'{name}'[{within}] = {v} is a {what}"


def _table_to_arrays(
    table: pa.Table, src: SourceFile, input_column: str, labels_column: str | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Validated (tokens int32, lengths int64, labels int32 | None) of one file."""
    where = str(src.path)
    if input_column not in table.column_names:
        raise InputError(f"no '{input_column}' column", where=where)
    try:
        ids, lengths, nulls = _flatten(table.column(input_column))
    except ValueError:
        raise InputError(f"'{input_column}' holds null token ids", where=where) from None
    if nulls.any():
        raise InputError(f"no '{input_column}' in this sample", where=src.locate(_first_row(nulls)))
    empty = lengths == 0
    if empty.any():
        raise InputError(f"empty sample: '{input_column}' is []", where=src.locate(_first_row(empty)))
    problem = _check_ids(ids, lengths, input_column, allow_ignore=False)
    if problem:
        raise InputError(problem[1], where=src.locate(problem[0]))

    labels = None
    if labels_column and labels_column in table.column_names:
        try:
            lab, lab_lengths, lab_nulls = _flatten(table.column(labels_column))
        except ValueError:
            raise InputError(f"'{labels_column}' holds null labels", where=where) from None
        if lab_nulls.all():
            lab = None  # JSONL without the key at all
        elif lab_nulls.any():
            raise InputError(f"no '{labels_column}' in this sample, though other samples have them",
                             where=src.locate(_first_row(lab_nulls)))
        if lab is not None:
            wrong = lab_lengths != lengths
            if wrong.any():
                r = _first_row(wrong)
                raise InputError(
                    f"'{labels_column}' has {lab_lengths[r]} entries but '{input_column}' has "
                    f"{lengths[r]}", where=src.locate(r))
            problem = _check_ids(lab, lengths, labels_column, allow_ignore=True)
            if problem:
                raise InputError(problem[1], where=src.locate(problem[0]))
            labels = lab.astype(np.int32, copy=False)
    return ids.astype(np.int32, copy=False), lengths, labels


def read_file(
    path: Path, input_column: str = "input_ids", labels_column: str | None = "labels",
    first_index: int = 0,
) -> tuple[SourceFile, np.ndarray, np.ndarray, np.ndarray | None]:
    fmt, _ = detect_format(path)
    columns = [input_column] + ([labels_column] if labels_column else [])
    table = READERS[fmt](path, columns)
    src = SourceFile(
        path=path, format=fmt, num_samples=table.num_rows, first_index=first_index,
        size=path.stat().st_size, fingerprint=fingerprint(path), has_labels=False,
    )
    ids, lengths, labels = _table_to_arrays(table, src, input_column, labels_column)
    src.has_labels = labels is not None
    return src, ids, lengths, labels


def read_samples(
    inputs: Iterable[str | Path],
    input_column: str = "input_ids",
    labels_column: str | None = "labels",
    require_labels: bool = False,
    progress: Callable[[Path], None] | None = None,
) -> Samples:
    """Read and validate every input file into one `Samples` (files in the given, sorted order)."""
    paths = expand_inputs(inputs)
    sources: list[SourceFile] = []
    ids_parts, len_parts, lab_parts = [], [], []
    first = 0
    for path in paths:
        src, ids, lengths, labels = read_file(path, input_column, labels_column, first)
        if sources and src.has_labels != sources[0].has_labels:
            with_, without = (src, sources[0]) if src.has_labels else (sources[0], src)
            raise InputError(
                f"mixed schemas: {with_.path} has a '{labels_column}' column and "
                f"{without.path} does not")
        if require_labels and not src.has_labels:
            raise InputError(f"no '{labels_column}' column", where=str(path))
        sources.append(src)
        ids_parts.append(ids)
        len_parts.append(lengths)
        lab_parts.append(labels)
        first += src.num_samples
        if progress:
            progress(path)
    if first == 0:
        raise InputError("the dataset is empty: the inputs hold no samples")
    offsets = np.zeros(first + 1, np.int64)
    np.cumsum(np.concatenate(len_parts), out=offsets[1:])
    tokens = np.concatenate(ids_parts) if len(ids_parts) > 1 else ids_parts[0]
    labels = None
    if sources[0].has_labels:
        labels = np.concatenate(lab_parts) if len(lab_parts) > 1 else lab_parts[0]
    return Samples(tokens=tokens, offsets=offsets, labels=labels, sources=sources)
