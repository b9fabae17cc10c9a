"""Formats: turn one JSONL, Parquet or Arrow file into an Arrow table of the wanted columns.

Each format has one small function that returns a `RawTable` holding the token column and,
when present, the labels column. Everything after that (type checks, id ranges, empty samples,
label lengths, flattening to numpy) is shared (`packer.read.validate`), so adding a format
touches one function. JSONL that the fast parser rejects is re-read line by line, so that every
bad line is found and named.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from packer.errors import InputError
from packer.read.files import detect_format
from packer.read.progress import ParquetMeter, open_input
from packer.read.reasons import REASON_CODE


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
_COUNT_CHUNK = 8 << 20  # bytes read at a time to count lines


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
        # the fast parser takes two objects on one line as two rows: the sample count and
        # every later line number would be wrong, so such a file is read line by line
        if table.num_rows == count_lines(path, compression):
            return RawTable(table)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        # The fast parser stops at the first bad line and says little about where; re-read by
        # chunks of lines to find every bad line and keep the good ones.
        pass
    except OSError as exc:
        raise InputError(f"cannot read: {exc}", where=str(path)) from None
    return _read_jsonl_by_lines(path, columns)


_BLANK = re.compile(rb"\n[ \t\r]*(?=\n)")  # a blank line, after the newline before it
_TEXT = re.compile(rb"[^ \t\r\n]")


def count_lines(path: Path, compression: str | None) -> int:
    """The non-blank lines of a JSONL file (one sample each), as `_line_spans` counts them,
    streamed a chunk at a time (scripts/bench_jsonl_lines.py: about a tenth of the parse)."""
    lines, text = 0, False  # text: the line under way holds more than blanks so far
    try:
        with pa.input_stream(str(path), compression=compression) as stream:
            while chunk := stream.read(_COUNT_CHUNK):
                first = chunk.find(b"\n")
                if first < 0:
                    text = text or _TEXT.search(chunk) is not None
                    continue
                lines += text or _TEXT.search(chunk, 0, first) is not None  # the line it ends
                # the lines between its first newline and its last
                lines += chunk.count(b"\n") - 1 - len(_BLANK.findall(chunk))
                text = _TEXT.search(chunk, chunk.rfind(b"\n")) is not None
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read: {exc}", where=str(path)) from None
    return lines + text


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
        meter = ParquetMeter(path, pq.read_metadata(path).num_rows) if present else None
        if meter is not None and meter.active:  # a row group at a time, each one reported
            pf = pq.ParquetFile(path, memory_map=True)
            groups = []
            for i in range(pf.num_row_groups):
                groups.append(pf.read_row_group(i, columns=present))
                meter.rows_done(groups[-1].num_rows)
            table = pa.concat_tables(groups) if groups else pf.schema_arrow.empty_table()
            table = table.select(present)
        else:
            # ParquetFile, not pq.read_table: that one imports pyarrow.dataset (0.5 s a run)
            table = pq.ParquetFile(path, memory_map=True).read(columns=present)
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
