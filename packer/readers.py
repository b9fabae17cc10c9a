"""Readers: turn JSONL, Parquet and Arrow files into validated flat token arrays.

Each format has one small function that returns an Arrow table holding the token column and,
when present, the labels column. Everything after that (type checks, id ranges, empty samples,
label lengths, flattening to numpy) is shared, so adding a format touches one function.

Validation gives every row a reason code (0 = valid) with whole-array numpy operations, so valid
data never goes through per-sample Python. `on_error="error"` stops at the first bad row and
names it; `on_error="skip"` drops the bad rows and records each one in `Samples.rejects`.
Skipped rows still consume a global sample index, so `sample_index` in the output always points
at the sample's position in the input (file order, then row order).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from packer.errors import InputError
from packer.flatten import fast_flatten
from packer.own_outputs import (
    REPACK_HINT,
    PackedInputError,
    has_contract_schema,
    is_packer_output,
    is_work_dir,
    refuse,
)
from packer.progress import open_input
from packer.samples import (
    IGNORE_INDEX,
    INT32_MAX,
    REASON_CODE,
    REASONS,
    Rejects,
    Samples,
    SourceFile,
)

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


class InputFiles(list):
    """Input files already expanded and checked: expanding them again returns them as they are."""


def expand_inputs(
    inputs: Iterable[str | Path], skip: Path | None = None, skipped: list[Path] | None = None
) -> InputFiles:
    """Files named by the inputs: plain files, directories (recursive) and globs, each sorted.

    Packer's own outputs are never inputs: directories and globs leave out `skip` (the output
    being written), the hidden work directories of runs, and every directory holding a packer
    manifest (listed in `skipped`). A packer output, or a file with the packed-row columns,
    named as an INPUT is refused (`PackedInputError`): its rows are already packed.
    """
    if isinstance(inputs, InputFiles):
        return inputs
    excluded = _Excluded(skip)
    files: list[Path] = []
    for item in inputs:
        text = str(item)
        path = Path(text)
        if path.is_dir():
            if is_packer_output(path):
                raise refuse(path)
            found = excluded.walk(path, skipped)
            if not found:
                raise InputError("directory holds no .jsonl, .parquet or .arrow files", where=text)
            files.extend(found)
        elif _GLOB_CHARS & set(text) and not path.exists():
            matches = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
            found = [p for p in matches if not excluded.holds(p, skipped)]
            if matches and not found:
                raise PackedInputError(
                    f"every match is inside a packer output ({REPACK_HINT})", where=text
                )
            if not found:
                raise InputError("no file matches this pattern", where=text)
            files.extend(found)
        elif path.is_file():
            detect_format(path)
            if is_packer_output(path.parent):
                raise refuse(path, "a shard of one")
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
        if has_contract_schema(f, detect_format(f)[0]):
            raise refuse(f, "it has the packed-row columns cu_seqlens, position_ids, sample_index")
        unique.append(f)
    return InputFiles(unique)


class _Excluded:
    """Which directories an expansion leaves out; answers are cached per directory."""

    def __init__(self, skip: Path | None):
        self.skip = skip.resolve() if skip is not None else None
        self.cache: dict[Path, bool] = {}

    def __call__(self, directory: Path) -> bool:
        hit = self.cache.get(directory)
        if hit is None:
            hit = (
                is_work_dir(directory)
                or (self.skip is not None and directory.resolve() == self.skip)
                or is_packer_output(directory)
            )
            self.cache[directory] = hit
        return hit

    def _note(self, directory: Path, skipped: list[Path] | None) -> None:
        if skipped is not None and not is_work_dir(directory) and directory not in skipped:
            skipped.append(directory)

    def walk(self, top: Path, skipped: list[Path] | None) -> list[Path]:
        found = []
        for root, dirs, names in os.walk(top):
            base = Path(root)
            keep = []
            for d in sorted(dirs):
                if self(base / d):
                    self._note(base / d, skipped)
                else:
                    keep.append(d)
            dirs[:] = keep
            found.extend(p for p in (base / n for n in names) if p.is_file() and _is_data_file(p))
        return sorted(found)

    def holds(self, path: Path, skipped: list[Path] | None) -> bool:
        for parent in path.parents:
            if parent != Path(".") and self(parent):
                self._note(parent, skipped)
                return True
        return False


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


@dataclass
class RawTable:
    """What a format reader returns: the wanted columns, plus rows it could not parse at all.

    `parse_codes` (uint8 per row, see `REASONS`) and `messages` are set only for JSONL files that
    the fast reader rejected; those rows are null in `table` so the row numbering is kept.
    `lines` is the 1-based line number of every row when the reader already knows it.
    """

    table: pa.Table
    parse_codes: np.ndarray | None = None
    messages: dict[int, str] = field(default_factory=dict)
    lines: np.ndarray | None = None


def _json_schema(columns: list[str]) -> pa.Schema:
    return pa.schema([(c, pa.list_(pa.int64())) for c in columns])


_JSON_BLOCK = 16 << 20
_JSON_SPACE = b" \t\r"  # what arrow's JSON reader skips; a line of only these is blank
_LEAF_LINES = 16  # below this many lines, failing chunks are checked line by line in Python


def _read_jsonl(path: Path, columns: list[str]) -> RawTable:
    _, compression = detect_format(path)
    try:
        table = pa_json.read_json(
            open_input(path, compression),
            read_options=pa_json.ReadOptions(block_size=_JSON_BLOCK),
            parse_options=pa_json.ParseOptions(
                explicit_schema=_json_schema(columns), unexpected_field_behavior="ignore"
            ),
        )
        return RawTable(table)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        # The fast parser stops at the first bad line and says little about where; re-read by
        # chunks of lines to find every bad line and keep the good ones.
        return _read_jsonl_by_lines(path, columns)
    except OSError as exc:
        raise InputError(f"cannot read: {exc}", where=str(path)) from None


def _read_bytes(path: Path) -> bytes:
    _, compression = detect_format(path)
    try:
        with open_input(path, compression) as stream:
            return stream.read()
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read: {exc}", where=str(path)) from None


def _line_spans(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, 1-based line number) of every non-blank line; vectorized over the bytes."""
    buf = np.frombuffer(data, np.uint8)
    newlines = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], newlines + 1)).astype(np.int64)
    ends = np.concatenate((newlines, [buf.size])).astype(np.int64)
    numbers = np.arange(1, starts.size + 1, dtype=np.int64)
    nonempty = ends > starts
    # A line whose first byte is not JSON whitespace is not blank; only the rare others are
    # looked at one by one.
    first = buf[np.minimum(starts, max(buf.size - 1, 0))] if buf.size else np.zeros(0, np.uint8)
    maybe_blank = nonempty & np.isin(first, np.frombuffer(_JSON_SPACE, np.uint8))
    keep = nonempty.copy()
    for i in np.flatnonzero(maybe_blank).tolist():
        keep[i] = bool(data[starts[i] : ends[i]].strip(_JSON_SPACE))
    return starts[keep], ends[keep], numbers[keep]


def jsonl_line_numbers(path: Path) -> np.ndarray:
    """1-based line number of every sample (non-blank line) of a JSONL file."""
    return _line_spans(_read_bytes(path))[2]


def _read_jsonl_by_lines(path: Path, columns: list[str]) -> RawTable:
    return parse_jsonl_lines(_read_bytes(path), columns)


def parse_jsonl_lines(data: bytes, columns: list[str]) -> RawTable:
    """JSON lines parsed line by line where needed: every bad line found, good ones kept."""
    starts, ends, numbers = _line_spans(data)
    schema = _json_schema(columns)
    whole = pa.py_buffer(data)
    longest = int((ends - starts).max()) if starts.size else 0
    read_options = pa_json.ReadOptions(
        use_threads=False, block_size=max(_JSON_BLOCK, 2 * longest + 1024)
    )
    parse_options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    null_row = pa.table({c: pa.nulls(1, pa.list_(pa.int64())) for c in columns}, schema=schema)
    pieces: list[pa.Table] = []
    bad_rows: list[int] = []
    bad_codes: list[int] = []
    messages: dict[int, str] = {}

    def parse(i: int, j: int) -> pa.Table:
        """Lines i..j-1 (indices into the non-blank lines) as one table, or ArrowInvalid."""
        chunk = whole.slice(int(starts[i]), int(ends[j - 1] - starts[i]))
        table = pa_json.read_json(
            pa.BufferReader(chunk), read_options=read_options, parse_options=parse_options
        )
        if table.num_rows != j - i:  # e.g. two objects on one line
            raise pa.ArrowInvalid(f"{table.num_rows} JSON values on {j - i} line(s)")
        return table

    def bad(i: int, reason: str, message: str) -> None:
        bad_rows.append(i)
        bad_codes.append(REASON_CODE[reason])
        messages[i] = message
        pieces.append(null_row)  # keeps the row numbering; the row is rejected

    def good_run(i: int, j: int) -> None:
        if i == j:
            return
        try:
            pieces.append(parse(i, j))
            return
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            if j - i == 1:
                bad(i, "malformed_json", f"cannot parse this line ({exc})")
                return
        for k in range(i, j):
            good_run(k, k + 1)

    def leaf(i: int, j: int) -> None:
        run = i
        for k in range(i, j):
            problem = _line_problem(data[starts[k] : ends[k]], columns)
            if problem:
                good_run(run, k)
                bad(k, *problem)
                run = k + 1
        good_run(run, j)

    def solve(i: int, j: int) -> None:
        try:
            pieces.append(parse(i, j))
            return
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        if j - i <= _LEAF_LINES:
            leaf(i, j)
            return
        mid = (i + j) // 2
        solve(i, mid)
        solve(mid, j)

    n = int(starts.size)
    step = 1 << 14
    for i in range(0, n, step):
        solve(i, min(n, i + step))
    table = pa.concat_tables(pieces) if pieces else schema.empty_table()
    codes = np.zeros(table.num_rows, np.uint8)
    codes[np.asarray(bad_rows, np.int64)] = np.asarray(bad_codes, np.uint8)
    return RawTable(table, parse_codes=codes, messages=messages, lines=numbers)


def _line_problem(line: bytes | str, columns: list[str]) -> tuple[str, str] | None:
    """(reason, message) for what is wrong with one JSONL line, or None."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            return "malformed_json", f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return "malformed_json", f"malformed JSON ({exc.msg} at column {exc.colno})"
    except RecursionError:
        return "malformed_json", "malformed JSON (nested too deeply)"
    if not isinstance(obj, dict):
        return "malformed_json", f"expected a JSON object, got {type(obj).__name__}"
    for name in columns:
        value = obj.get(name)
        if value is None:
            continue  # absent columns are reported after reading, with the rest of the file
        if not isinstance(value, list):
            return "not_integer_list", (
                f"'{name}' must be a list of integers, got {type(value).__name__}"
            )
        for pos, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int):
                return "not_integer_list", f"'{name}'[{pos}] is {_short(v)}, not an integer"
            if not -(2**63) <= v < 2**63:
                if v < 0:
                    return "negative_id", f"'{name}'[{pos}] = {_short(v)} is a negative id"
                return "id_out_of_range", (
                    f"'{name}'[{pos}] = {_short(v)} does not fit a 32-bit token id"
                )
    return None


def _short(value) -> str:
    """A value as JSON text (null, true, 2.5, "abc"), cut to 40 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _list_of_int(type_: pa.DataType) -> bool:
    return (pa.types.is_list(type_) or pa.types.is_large_list(type_)) and pa.types.is_integer(
        type_.value_type
    )


def _select(table: pa.Table, path: Path, columns: list[str]) -> RawTable:
    """Keep the wanted columns that exist; a present column must be a list of integers."""
    keep = {}
    for name in columns:
        if name not in table.column_names:
            continue
        type_ = table.schema.field(name).type
        if not _list_of_int(type_):
            raise InputError(
                f"column '{name}' has type {type_}, expected a list of integers", where=str(path)
            )
        keep[name] = table.column(name)
    return RawTable(pa.table(keep) if keep else pa.table({"__rows__": pa.nulls(table.num_rows)}))


def _read_parquet(path: Path, columns: list[str]) -> RawTable:
    try:
        schema = pq.read_schema(path)
        present = [c for c in columns if c in schema.names]
        table = pq.read_table(path, columns=present, memory_map=True)
        if not present:
            table = pa.table({"__rows__": pa.nulls(pq.ParquetFile(path).metadata.num_rows)})
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read Parquet: {exc}", where=str(path)) from None
    return _select(table, path, columns)


def _read_arrow(path: Path, columns: list[str]) -> RawTable:
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


READERS: dict[str, Callable[[Path, list[str]], RawTable]] = {
    "jsonl": _read_jsonl,
    "parquet": _read_parquet,
    "arrow": _read_arrow,
}


# --------------------------------------------------------------------------------------------
# Shared validation and flattening: one reason code per row, whole-array operations only

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
    if input_column not in table.column_names:
        raise InputError(f"no '{input_column}' column", where=where)
    n = table.num_rows
    ids = _flatten(table.column(input_column))
    parse = raw.parse_codes if raw.parse_codes is not None else np.zeros(n, np.uint8)
    if n and ids.is_null.all() and not parse.any():
        raise InputError(f"no sample has '{input_column}'", where=where)

    codes = np.zeros(n, np.uint8)
    labels = None
    if labels_column and labels_column in table.column_names:
        labels = _flatten(table.column(labels_column))
        if (labels.is_null | (parse != 0)).all():
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


def read_file(
    path: Path,
    input_column: str = "input_ids",
    labels_column: str | None = "labels",
    first_index: int = 0,
    on_error: str = "error",
    rejects: Rejects | None = None,
    chunked: bool = False,
) -> tuple[SourceFile, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Read and validate one file: (source, tokens int32, lengths, labels int32 | None, kept).

    `kept` is None when every row is valid, else the rows (0-based, within the file) that were
    kept; with `on_error="error"` the first bad row raises `InputError` instead.
    """
    fmt, _ = detect_format(path)
    columns = [input_column] + ([labels_column] if labels_column else [])
    raw = READERS[fmt](path, columns)
    src = new_source(path, fmt, raw.table.num_rows, first_index, raw.lines)
    tokens, lengths, lab, kept, has_labels = validate(
        raw, src, 0, input_column, labels_column, on_error, rejects, chunked
    )
    src.has_labels = has_labels
    return src, tokens, lengths, lab, kept


def new_source(
    path: Path, fmt: str, num_samples: int, first_index: int, lines: np.ndarray | None = None
) -> SourceFile:
    return SourceFile(
        path=path,
        format=fmt,
        num_samples=num_samples,
        first_index=first_index,
        size=path.stat().st_size,
        fingerprint=fingerprint(path),
        has_labels=False,
        _lines=lines,
    )


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
    if fast is not None:  # every row valid: one compiled pass, no per-row codes needed
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


def read_samples(
    inputs: Iterable[str | Path],
    input_column: str = "input_ids",
    labels_column: str | None = "labels",
    require_labels: bool = False,
    progress: Callable[[Path], None] | None = None,
    on_error: str = "error",
    chunked: bool = False,
) -> Samples:
    """Read and validate every input file into one `Samples` (files in the given, sorted order).

    chunked: keep valid int32 values in the input's Arrow chunks instead of one flat copy
    (`Samples.token_chunks`; `tokens`/`labels` are None); `pack` reads this way.

    on_error: "error" raises `InputError` at the first bad sample; "skip" leaves bad samples out
    and lists them in `Samples.rejects` (their global indices stay reserved, see `Samples.index`).
    """
    if on_error not in ("error", "skip"):
        raise ValueError(f"on_error must be 'error' or 'skip', got {on_error!r}")
    paths = expand_inputs(inputs)
    sources: list[SourceFile] = []
    ids_parts, len_parts, lab_parts, index_parts = [], [], [], []
    rejects = Rejects() if on_error == "skip" else None
    first = 0
    for path in paths:
        src, ids, lengths, labels, kept = read_file(
            path, input_column, labels_column, first, on_error, rejects, chunked
        )
        check_schema(src, sources, labels_column, require_labels)
        sources.append(src)
        ids_parts.append(ids)
        len_parts.append(lengths)
        lab_parts.append(labels)
        index_parts.append(first + kept if kept is not None else (first, first + src.num_samples))
        first += src.num_samples
        if progress:
            progress(path)
    offsets, index = assemble_offsets(len_parts, index_parts, first, rejects)
    if chunked:
        return _chunked_samples(ids_parts, lab_parts, offsets, sources, index, rejects)
    tokens = np.concatenate(ids_parts) if len(ids_parts) > 1 else ids_parts[0]
    labels = None
    if sources[0].has_labels:
        labels = np.concatenate(lab_parts) if len(lab_parts) > 1 else lab_parts[0]
    return Samples(
        tokens=tokens, offsets=offsets, labels=labels, sources=sources, index=index, rejects=rejects
    )


def check_schema(
    src: SourceFile, sources: list[SourceFile], labels_column: str | None, require_labels: bool
) -> None:
    """Every file must agree with the first on having labels (and have them when required)."""
    if sources and src.has_labels != sources[0].has_labels:
        with_, without = (src, sources[0]) if src.has_labels else (sources[0], src)
        raise InputError(
            f"mixed schemas: {with_.path} has a '{labels_column}' column and "
            f"{without.path} does not"
        )
    if require_labels and not src.has_labels:
        raise InputError(f"no '{labels_column}' column", where=str(src.path))


def _chunked_samples(ids_parts, lab_parts, offsets, sources, index, rejects) -> Samples:
    from packer.gather import as_chunks

    tok, lab = [], [] if sources[0].has_labels else None
    starts = [0]
    for ids, labels in zip(ids_parts, lab_parts):
        pieces = ids if isinstance(ids, list) else [ids]
        lpieces = (labels if isinstance(labels, list) else [labels]) if lab is not None else None
        for k, piece in enumerate(pieces):
            if piece.size == 0:
                continue
            tok.append(piece)
            if lab is not None:
                lab.append(lpieces[k])
            starts.append(starts[-1] + piece.size)
    return Samples(
        tokens=None,
        offsets=offsets,
        labels=None,
        sources=sources,
        index=index,
        rejects=rejects,
        token_chunks=as_chunks(tok),
        label_chunks=as_chunks(lab) if lab is not None else None,
        chunk_starts=np.asarray(starts, np.int64),
    )


def _counts_text(rejects: Rejects | None) -> str:
    if not rejects:
        return ""
    return ", ".join(f"{k}: {v}" for k, v in sorted(rejects.counts.items()))


def assemble_offsets(len_parts, index_parts, num_read: int, rejects):
    """Offsets of the kept samples and, when some were skipped, their global indices.

    index_parts: per part, the global indices kept, or (first, end) when all were kept.

    Raises when the inputs hold no sample, or when every sample was rejected.
    """
    kept_total = sum(len(x) for x in len_parts)
    if num_read == 0:
        raise InputError("the dataset is empty: the inputs hold no samples")
    if kept_total == 0:
        raise InputError(
            f"the dataset is empty: all {num_read} samples were rejected ({_counts_text(rejects)})"
        )
    offsets = np.zeros(kept_total + 1, np.int64)
    np.cumsum(np.concatenate(len_parts), out=offsets[1:])
    index = None
    if kept_total != num_read:
        # a (first, end) pair stands for a run of samples that were all kept
        index = np.concatenate(
            [np.arange(*p, dtype=np.int64) if isinstance(p, tuple) else p for p in index_parts]
        ).astype(np.int64, copy=False)
    return offsets, index
