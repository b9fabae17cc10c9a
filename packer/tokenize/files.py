"""Raw inputs: the files RAW arguments name, read as batches of rows that remember where they
came from (file, line), so that a bad record is reported as `FILE:LINE: what`.

The driver reads (`read_batches`, in the main process: cheap byte splitting and columnar
slicing, bounded by the batch size); the workers decode (`decode_rows`: JSON parsing and
Python objects, the costly part). Batches are cut by row count and bytes only, never by the
number of workers, so the same input always gives the same batches.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from packer.errors import InputError
from packer.read.files import NamedTwice, expand_inputs
from packer.read.progress import open_input
from packer.storage import display, is_url

BATCH_ROWS = 1024  # rows per batch, and per tokenized shard
BATCH_BYTES = 8 << 20  # raw bytes per batch at most (long records make smaller batches)
_CHUNK = 4 << 20  # bytes read from a JSONL stream at a time
_JSON_ARRAYS = {".json": None, ".json.gz": "gzip", ".json.zst": "zstd"}


@dataclass(frozen=True)
class RawFile:
    """One raw input file: its local path (a staged copy for a URL), how it is shown, its format."""

    path: Path
    shown: str
    fmt: str  # "jsonl", "json" (an array of objects), "parquet", "arrow"
    compression: str | None = None


@dataclass
class RawBatch:
    """Rows of one file in input order: `lines` are 1-based line numbers (JSONL, JSON arrays)
    or row numbers (Parquet, Arrow); `rows` are undecoded JSON lines, decoded objects, or an
    Arrow record batch."""

    file_index: int
    batch_index: int
    shown: str
    lines: list[int]
    rows: list | pa.RecordBatch
    columnar: bool = False

    def where(self, i: int) -> str:
        """`FILE:LINE` of the batch's i-th row (`FILE:row N` for Parquet and Arrow)."""
        return (
            f"{self.shown}:row {self.lines[i]}"
            if self.columnar
            else f"{self.shown}:{self.lines[i]}"
        )


def _json_array_compression(name: str) -> str | None | bool:
    for suffix, compression in _JSON_ARRAYS.items():
        if name.lower().endswith(suffix):
            return compression
    return False


def raw_inputs(inputs: Iterable[str | Path], skip: Path | str | None = None) -> list[RawFile]:
    """The raw files the inputs name, in order: JSONL (.jsonl, .gz, .zst), Parquet and Arrow as
    `packer pack` finds them (directories, globs, URLs), plus local `.json` arrays named as
    files. A name given twice is refused."""
    from packer.read.files import detect_format

    files: list[RawFile] = []
    rest: list[str] = []

    def flush() -> None:
        if rest:
            for path in expand_inputs(list(rest), skip=skip):
                fmt, compression = detect_format(Path(path))
                files.append(RawFile(Path(path), display(path), fmt, compression))
            rest.clear()

    for item in inputs:
        text = str(item)
        compression = _json_array_compression(text)
        if compression is not False and not is_url(text):
            flush()
            path = Path(text)
            if not path.is_file():
                raise InputError("no such file", where=text)
            files.append(RawFile(path, text, "json", compression))
        else:
            rest.append(text)
    flush()
    seen: set[Path] = set()
    for f in files:
        key = f.path.resolve()
        if key in seen:
            raise NamedTwice(f.shown)
        seen.add(key)
    if not files:
        raise InputError("no input files given")
    return files


def read_batches(
    raw: RawFile,
    file_index: int,
    columns: list[str],
    batch_rows: int = BATCH_ROWS,
    batch_bytes: int = BATCH_BYTES,
) -> Iterator[RawBatch]:
    """The file's rows in batches of at most `batch_rows` rows and about `batch_bytes` bytes.

    columns: the raw columns to read from Parquet and Arrow (those absent are left out)."""
    if raw.fmt == "jsonl":
        pieces = _jsonl_lines(raw)
    elif raw.fmt == "json":
        pieces = _json_array_items(raw)
    else:
        yield from _columnar_batches(raw, file_index, columns, batch_rows, batch_bytes)
        return
    index, lines, rows, size = 0, [], [], 0
    for line, row, nbytes in pieces:
        lines.append(line)
        rows.append(row)
        size += nbytes
        if len(rows) >= batch_rows or size >= batch_bytes:
            yield RawBatch(file_index, index, raw.shown, lines, rows)
            index, lines, rows, size = index + 1, [], [], 0
    if rows:
        yield RawBatch(file_index, index, raw.shown, lines, rows)


def _jsonl_lines(raw: RawFile) -> Iterator[tuple[int, bytes, int]]:
    """(line number, line bytes, size) of every non-blank line, streamed."""
    try:
        stream = open_input(raw.path, raw.compression)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read: {exc}", where=raw.shown) from None
    number, rest = 0, b""
    with stream:
        while True:
            try:
                chunk = stream.read(_CHUNK)
            except (OSError, pa.ArrowInvalid) as exc:
                raise InputError(f"cannot read: {exc}", where=raw.shown) from None
            if not chunk:
                break
            parts = (rest + chunk).split(b"\n")
            rest = parts.pop()
            for part in parts:
                number += 1
                if number == 1:
                    part = part.removeprefix(b"\xef\xbb\xbf")
                if part.strip():
                    yield number, part, len(part)
    if rest.strip():
        yield number + 1, rest.removeprefix(b"\xef\xbb\xbf") if number == 0 else rest, len(rest)


def _json_array_items(raw: RawFile) -> Iterator[tuple[int, object, int]]:
    """(line, object, size) of every element of a file holding one JSON array."""
    try:
        with open_input(raw.path, raw.compression) as stream:
            text = stream.read().decode("utf-8").removeprefix("\ufeff")
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read: {exc}", where=raw.shown) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text ({exc.reason})", where=raw.shown) from None
    decoder = json.JSONDecoder()
    pos, line, n = _skip_space(text, 0, 1)
    if pos >= len(text) or text[pos] != "[":
        raise InputError(
            "expected a JSON array of records (a file of one record per line is .jsonl)",
            where=raw.shown,
        )
    pos, line, _ = _skip_space(text, pos + 1, line)
    while pos < len(text) and text[pos] != "]":
        try:
            item, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"malformed JSON ({exc.msg})", where=f"{raw.shown}:{exc.lineno}"
            ) from None
        yield line, item, end - pos
        line += text.count("\n", pos, end)
        pos, line, _ = _skip_space(text, end, line)
        if pos < len(text) and text[pos] == ",":
            pos, line, _ = _skip_space(text, pos + 1, line)
        elif pos < len(text) and text[pos] != "]":
            raise InputError("malformed JSON (expected ',' or ']')", where=f"{raw.shown}:{line}")
    if pos >= len(text):
        raise InputError("malformed JSON (the array is not closed)", where=f"{raw.shown}:{line}")
    pos, line, _ = _skip_space(text, pos + 1, line)
    if pos < len(text):
        raise InputError(
            "more after the JSON array's closing ']': a .json file holds one array of records "
            "(records one per line are .jsonl)",
            where=f"{raw.shown}:{line}",
        )


def _skip_space(text: str, pos: int, line: int) -> tuple[int, int, int]:
    start = pos
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos, line + text.count("\n", start, pos), pos - start


def _columnar_batches(
    raw: RawFile, file_index: int, columns: list[str], batch_rows: int, batch_bytes: int
) -> Iterator[RawBatch]:
    try:
        if raw.fmt == "parquet":
            pf = pq.ParquetFile(raw.path, memory_map=True)
            present = [c for c in columns if c in pf.schema_arrow.names]
            batches = pf.iter_batches(batch_size=batch_rows, columns=present) if present else ()
        else:
            source = pa.memory_map(str(raw.path))
            try:
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                source.seek(0)
                reader = pa.ipc.open_stream(source)
                batches = iter(reader)
            present = [c for c in columns if c in reader.schema.names]
        if not present:
            raise InputError(f"has none of the raw columns ({', '.join(columns)})", where=raw.shown)
        index, first = 0, 1
        for batch in batches:
            batch = batch.select(present)
            for piece in _cut(batch, batch_rows, batch_bytes):
                lines = list(range(first, first + piece.num_rows))
                yield RawBatch(file_index, index, raw.shown, lines, piece, columnar=True)
                index, first = index + 1, first + piece.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read {raw.fmt}: {exc}", where=raw.shown) from None


def _cut(batch: pa.RecordBatch, batch_rows: int, batch_bytes: int) -> Iterator[pa.RecordBatch]:
    """Slices of at most `batch_rows` rows and about `batch_bytes` bytes."""
    if batch.num_rows == 0:
        return
    per_row = max(1, batch.nbytes // batch.num_rows)
    step = max(1, min(batch_rows, batch_bytes // per_row))
    for start in range(0, batch.num_rows, step):
        yield batch.slice(start, step)


def batch_digest(batch: RawBatch) -> str:
    """xxh3 of what the batch holds of its file: its line (or row) numbers and its rows' bytes
    (the JSONL lines as read; a columnar slice in Arrow's IPC form; a JSON array's records as
    JSON). A resumed run keeps a finished batch only where this is what its record says: a
    file edited in place with its size and modification time put back shows here. At memory
    speed for JSONL and Arrow; a fraction of a percent of tokenizing the batch
    (`scripts/bench_trust_checks.py`)."""
    digest = xxhash.xxh3_128()
    digest.update(np.asarray(batch.lines, np.int64).tobytes())
    if batch.columnar:
        digest.update(batch.rows.serialize())
    elif all(isinstance(row, bytes) for row in batch.rows):
        digest.update(b"\n".join(batch.rows))
    else:
        text = json.dumps(batch.rows, ensure_ascii=False, separators=(",", ":"), default=repr)
        digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def decode_rows(batch: RawBatch) -> list[dict | str]:
    """Each row of the batch as a dict, or the one-line problem (without its place) that keeps
    it from being one."""
    if batch.columnar:  # Arrow strings are UTF-8: they cannot hold a lone surrogate
        return [_drop_nulls(row) for row in batch.rows.to_pylist()]
    out: list[dict | str] = []
    for row in batch.rows:
        decoded = row
        if isinstance(row, bytes):
            try:
                decoded = json.loads(row.decode("utf-8"))
            except UnicodeDecodeError as exc:
                out.append(f"not UTF-8 text ({exc.reason} at byte {exc.start})")
                continue
            except json.JSONDecodeError as exc:
                out.append(f"malformed JSON ({exc.msg} at column {exc.colno})")
                continue
            except RecursionError:
                out.append("malformed JSON (nested too deeply)")
                continue
        if not isinstance(decoded, dict):
            out.append(f"expected a JSON object, got {_json_type(decoded)}")
            continue
        if not isinstance(row, bytes) or _SURROGATE_ESCAPE.search(row):
            # a lone surrogate comes only from an escape (UTF-8 bytes cannot hold one): only
            # such lines are walked, and the items of a .json array (parsed by the driver)
            try:
                decoded = lone_surrogate(decoded) or decoded
            except RecursionError:
                decoded = "malformed JSON (nested too deeply)"
        out.append(decoded)
    return out


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # \ud800-\udfff, valid pairs' included
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def lone_surrogate(value, where: str = "") -> str | None:
    """What is wrong with the first string or object key in `value` that holds a lone surrogate
    (a `\\ud800` escape without its pair: half of a UTF-16 pair, no character a tokenizer can
    encode), or None. `where`: the path to `value` in its row."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found is None:
            return None
        return f"{where or 'the row'} holds {_surrogate(found.group())}"
    if isinstance(value, dict):
        for key, item in value.items():
            at = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and _SURROGATE.search(key):
                found = _SURROGATE.search(key).group()
                return f"a key of {where or 'the row'} ({ascii(key)}) holds {_surrogate(found)}"
            problem = lone_surrogate(item, at)
            if problem:
                return problem
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = lone_surrogate(item, f"{where}[{i}]")
            if problem:
                return problem
    return None


def _surrogate(char: str) -> str:
    return f"a lone surrogate (\\u{ord(char):04x}: half of a UTF-16 pair, not a character)"


def _json_type(value) -> str:
    names = {
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _drop_nulls(row: dict) -> dict:
    """A columnar row as a JSON line would have it: a struct field that this row lacks reads as
    null in Arrow (the schema is the union of all rows'), so nulls inside lists of records
    (the messages' `tool_calls`, `name`) are dropped."""
    for key, value in row.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            row[key] = [
                {k: v for k, v in item.items() if v is not None} if isinstance(item, dict) else item
                for item in value
            ]
    return row
