"""Blocks: the input cut into blocks, and one block read as the readers read a file.

With `block_size` set, the inputs are cut into blocks that follow the files: a block never
spans two files, Parquet blocks end at row-group boundaries, Arrow IPC blocks at record batches
and JSONL blocks at the first line that starts at or after each multiple of `block_size` bytes
(a compressed JSONL file is one block). The cut depends on the files and `block_size` only, so
every engine, with any number of workers, writes the same bytes.

`scan_file` cuts one file (Parquet and Arrow from metadata; JSONL counts its non-blank lines,
without parsing them); `block_samples` reads and validates one block into `Samples`, with the
local reader's checks and one-line errors. The block pipeline (`packer.pipelines.blocks`) runs
both as tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from packer.config import PackConfig
from packer.errors import InputError
from packer.read.assemble import chunked_samples
from packer.read.files import detect_format, fingerprint
from packer.read.formats import (
    _JSON_BLOCK,
    RawTable,
    _json_schema,
    _line_spans,
    _select,
    parse_jsonl_lines,
)
from packer.read.progress import open_input
from packer.read.samples import Rejects, Samples, SourceFile
from packer.read.validate import validate
from packer.storage import files
from packer.storage.urls import is_url
from packer.version import __version__

_SCAN_CHUNK = 16 << 20


@dataclass
class BlockSpec:
    """One block: where it is in its file and which samples it holds."""

    file: int  # index of the file in the inputs
    path: str
    format: str
    start: int  # Parquet: first row group; Arrow: first batch; JSONL: first byte
    end: int  # exclusive; -1 for a whole (compressed or stream) file
    rows: int  # samples in the block, rejected ones included
    row0: int  # samples of the file before this block
    line0: int = 0  # JSONL: lines of the file before this block
    nbytes: int = 0  # input bytes
    decoded: int = 0  # estimated decoded bytes of the wanted columns
    block: int = -1  # global block number (set by the driver)
    first_index: int = -1  # global index of the file's first sample (set by the driver)
    width: int = 5  # digits of block numbers in file names (set by the driver)


@dataclass
class FileScan:
    path: str
    format: str
    size: int
    fingerprint: str
    blocks: list[BlockSpec]
    version: str = __version__


def scan_file(index: int, path: str, block_size: int, columns: list[str]) -> FileScan:
    """Cut one input file (a path, or a URL read in place) into blocks and count their samples."""
    p = path if is_url(path) else Path(path)
    fmt, compression = detect_format(Path(path))
    try:
        size = files.size(str(p))
    except OSError as exc:
        raise InputError(f"cannot read: {exc}", where=str(p)) from None
    if fmt == "parquet":
        blocks = _scan_parquet(index, p, block_size, columns)
    elif fmt == "arrow":
        blocks = _scan_arrow(index, p, block_size, columns)
    else:
        blocks = _scan_jsonl(index, p, None if compression else block_size, compression, size)
    return FileScan(str(p), fmt, size, fingerprint(p), blocks)


def _source(path: Path | str):
    """What the readers open: a local path as it is, a URL as its random-access file."""
    return files.open_random(path) if isinstance(path, str) else path


def _group(sizes: list[int], block_size: int) -> list[tuple[int, int]]:
    """Consecutive units into groups of at least `block_size` bytes (the last may be less)."""
    groups, start, total = [], 0, 0
    for i, n in enumerate(sizes):
        total += n
        if total >= block_size:
            groups.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes) or not groups:
        groups.append((start, len(sizes)))
    return groups


def _scan_parquet(index: int, path: Path, block_size: int, columns: list[str]) -> list[BlockSpec]:
    try:
        meta = pq.read_metadata(_source(path))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read Parquet: {exc}", where=str(path)) from None
    rows, sizes, decoded = [], [], []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        rows.append(rg.num_rows)
        sizes.append(sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)))
        decoded.append(
            sum(
                max(rg.column(c).total_uncompressed_size, 4 * rg.column(c).num_values)
                for c in range(rg.num_columns)
                if rg.column(c).path_in_schema.split(".")[0] in columns
            )
        )
    out, row0 = [], 0
    for a, b in _group(sizes, block_size):
        n = sum(rows[a:b])
        out.append(
            BlockSpec(
                index, str(path), "parquet", a, b, n, row0, 0, sum(sizes[a:b]), sum(decoded[a:b])
            )
        )
        row0 += n
    return out


def _open_ipc(path: Path | str):
    """(batches as a list, schema) of an Arrow IPC file or stream, memory-mapped (a URL: read
    through ranged GETs)."""
    source = files.open_random(str(path))
    try:
        reader = pa.ipc.open_file(source)
        return [reader.get_batch(i) for i in range(reader.num_record_batches)], reader.schema
    except pa.ArrowInvalid:
        source.seek(0)
        reader = pa.ipc.open_stream(source)
        return list(reader), reader.schema


def _scan_arrow(index: int, path: Path, block_size: int, columns: list[str]) -> list[BlockSpec]:
    try:
        batches, _ = _open_ipc(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read Arrow IPC: {exc}", where=str(path)) from None
    sizes = [b.nbytes for b in batches]
    out, row0 = [], 0
    for a, b in _group(sizes, block_size):
        n = sum(x.num_rows for x in batches[a:b])
        nbytes = sum(sizes[a:b])
        out.append(BlockSpec(index, str(path), "arrow", a, b, n, row0, 0, nbytes, nbytes))
        row0 += n
    return out


def _scan_jsonl(
    index: int, path: Path | str, block_size: int | None, compression: str | None, size: int
) -> list[BlockSpec]:
    """JSONL blocks from one streaming pass: newlines and non-blank lines counted per block.

    A block starts at the first line that starts at or after the next multiple of
    `block_size`; None (compressed files) gives one block. Blank lines are not samples, as in
    the reader (`_line_spans`).
    """
    cuts = [0]  # byte offset where each block starts
    rows, lines = [0], [0]  # per block: non-blank lines, newlines
    base = 0
    carry = False  # the current, unfinished line has a non-blank byte
    target = block_size if block_size else None
    try:
        with open_input(path, compression) as stream:
            while chunk := stream.read(_SCAN_CHUNK):
                buf = np.frombuffer(chunk, np.uint8)
                nl = np.flatnonzero(buf == 10)
                solid = (buf != 32) & (buf != 9) & (buf != 13) & (buf != 10)
                if nl.size == 0:
                    carry = carry or bool(solid.any())
                    base += buf.size
                    continue
                ends = np.cumsum(solid)[nl]
                nonblank = np.diff(ends, prepend=0) > 0
                nonblank[0] |= carry
                carry = bool(solid[nl[-1] + 1 :].any())
                starts = base + nl + 1  # where the next line starts
                done = 0
                while target is not None:
                    i = int(np.searchsorted(starts, target))
                    if i >= starts.size or starts[i] >= size:
                        break
                    rows[-1] += int(nonblank[done : i + 1].sum())
                    lines[-1] += i + 1 - done
                    done = i + 1
                    cuts.append(int(starts[i]))
                    rows.append(0)
                    lines.append(0)
                    target = (int(starts[i]) // block_size + 1) * block_size
                rows[-1] += int(nonblank[done:].sum())
                lines[-1] += nl.size - done
                base += buf.size
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read: {exc}", where=str(path)) from None
    if carry:
        rows[-1] += 1
    out, row0, line0 = [], 0, 0
    ends = cuts[1:] + [size]
    whole = block_size is None
    for k, (a, b) in enumerate(zip(cuts, ends)):
        nbytes = (b - a) if not whole else size
        decoded = nbytes * (6 if compression else 1)
        out.append(
            BlockSpec(
                index,
                str(path),
                "jsonl",
                a,
                -1 if whole else b,
                rows[k],
                row0,
                line0,
                nbytes,
                decoded,
            )
        )
        row0 += rows[k]
        line0 += lines[k]
    return out


@dataclass
class BlockSource(SourceFile):
    """The file a block came from; rows are the file's rows, lines its lines."""

    spec: BlockSpec | None = None

    def position(self, row: int) -> tuple[str, int]:
        if self.format != "jsonl":
            return "row", int(row)
        if self._lines is None:
            self._lines = _line_spans(_block_bytes(self.spec))[2] + self.spec.line0
        k = row - self.spec.row0
        return "line", int(self._lines[k]) if 0 <= k < len(self._lines) else -1


def _block_bytes(spec: BlockSpec) -> bytes:
    path = spec.path if is_url(spec.path) else Path(spec.path)
    _, compression = detect_format(Path(spec.path))
    try:
        if isinstance(path, str) and spec.end >= 0:  # one ranged GET of the block's bytes
            with files.open_random(path) as source:
                return source.read_at(spec.end - spec.start, spec.start)
        with open_input(path, compression) as stream:
            if spec.end < 0:
                return stream.read()
            stream.seek(spec.start)
            return stream.read(spec.end - spec.start)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read: {exc}", where=spec.path) from None


def _read_block(spec: BlockSpec, columns: list[str]):
    """The block as the local readers return a file: a `RawTable` of the wanted columns."""
    path = Path(spec.path)
    if spec.format == "parquet":
        try:
            if is_url(spec.path):
                pf = pq.ParquetFile(files.open_random(spec.path))
            else:
                pf = pq.ParquetFile(path, memory_map=True)
            present = [c for c in columns if c in pf.schema_arrow.names]
            if not present:
                return RawTable(pa.table({"__rows__": pa.nulls(spec.rows)}))
            table = pf.read_row_groups(range(spec.start, spec.end), columns=present)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"cannot read Parquet: {exc}", where=spec.path) from None
        return _select(table, path, columns)
    if spec.format == "arrow":
        try:
            batches, schema = _open_ipc(spec.path)
            table = pa.Table.from_batches(batches[spec.start : spec.end], schema=schema)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"cannot read Arrow IPC: {exc}", where=spec.path) from None
        return _select(table, path, columns)
    data = _block_bytes(spec)
    try:
        table = pa_json.read_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(block_size=_JSON_BLOCK),
            parse_options=pa_json.ParseOptions(
                explicit_schema=_json_schema(columns), unexpected_field_behavior="ignore"
            ),
        )
        if table.num_rows == spec.rows:
            return RawTable(table)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        pass
    raw = parse_jsonl_lines(data, columns)  # names every bad line
    raw.lines = raw.lines + spec.line0
    return raw


def block_samples(spec: BlockSpec, cfg: PackConfig, rejects: Rejects | None):
    """Read and validate a block: (Samples with global indices, or None if none kept, source)."""
    labels_column = cfg.labels_column or None
    columns = [cfg.input_column] + ([labels_column] if labels_column else [])
    raw = _read_block(spec, columns)
    src = BlockSource(
        path=Path(spec.path),
        format=spec.format,
        num_samples=spec.row0 + spec.rows,
        first_index=spec.first_index,
        size=0,
        fingerprint="",
        has_labels=False,
        _lines=raw.lines,
        spec=spec,
    )
    if raw.table.num_rows == 0:
        return None, src
    tokens, lengths, labels, kept, has_labels = validate(
        raw, src, spec.row0, cfg.input_column, labels_column, cfg.on_error, rejects, chunked=True
    )
    src.has_labels = has_labels
    if lengths.size == 0:
        return None, src
    first = spec.first_index + spec.row0
    index = first + (kept.astype(np.int64) if kept is not None else np.arange(lengths.size))
    offsets = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if isinstance(tokens, list):
        samples = chunked_samples([tokens], [labels], offsets, [src], index, rejects)
    else:
        samples = Samples(
            tokens=tokens,
            offsets=offsets,
            labels=labels,
            sources=[src],
            index=index,
            rejects=rejects,
        )
    return samples, src
