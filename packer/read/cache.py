"""Out-of-core reading: stream inputs batch by batch into a memory-mapped token cache.

Planning needs only the lengths. When the decoded input would not fit the memory budget, each
file is read in record batches (Parquet row groups, Arrow IPC batches, JSONL blocks), validated
per batch with the same checks and messages as the in-memory reader, and its token and label
values are appended to flat int32 files in a temporary directory. Only the lengths (and the
rows kept, with `--on-error skip`) stay in RAM; the gather then reads the values through
copy-on-write memory maps, whose pages are file-backed (they never count as anonymous memory
and the kernel can drop them under pressure). The `Samples` built this way holds the same
arrays as the in-memory one, so the shards come out byte for byte the same.
"""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from packer.arguments import DEFAULT_INPUT, DEFAULT_LABELS
from packer.contract.names import TMP_MARK
from packer.errors import InputError
from packer.read.assemble import assemble_offsets, check_schema, new_source
from packer.read.columns import check_files, sample_columns
from packer.read.files import detect_format, expand_inputs
from packer.read.formats import (
    _JSON_BLOCK,
    READERS,
    RawTable,
    _json_schema,
    _list_of_int,
    count_lines,
)
from packer.read.progress import ParquetMeter, open_input
from packer.read.samples import Rejects, Samples
from packer.read.validate import validate

BATCH_BYTES = 32 << 20  # decoded bytes per streamed batch (at most; a Parquet row group bounds it)


def default_budget() -> int:
    """min(8 GiB, half of MemAvailable)."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(8 << 30, available // 2)


def estimate_decoded_bytes(paths: list[Path], columns: list[str]) -> int:
    """A cheap estimate of the input's decoded size in memory, from metadata and file sizes."""
    total = 0
    for path in paths:
        fmt, compression = detect_format(path)
        size = path.stat().st_size
        if fmt == "parquet":
            try:
                meta = pq.read_metadata(path)
                names = meta.schema.to_arrow_schema().names
                for g in range(meta.num_row_groups):
                    rg = meta.row_group(g)
                    for c in range(rg.num_columns):
                        col = rg.column(c)
                        if col.path_in_schema.split(".")[0] in columns or not names:
                            # dictionary pages make the page size small: count the values
                            total += max(col.total_uncompressed_size, 4 * col.num_values)
            except (pa.ArrowInvalid, OSError):
                total += size
        elif fmt == "jsonl":
            total += size * (6 if compression else 1)  # about 4 bytes per id of ~5 characters
        else:
            total += size
    return total


def batch_bytes_for(budget: int) -> int:
    """Streamed batch size for a memory budget: a small slice of it, at most 32 MiB.

    Decoding a Parquet batch peaks at about five times its decoded size in Arrow's pool,
    which keeps some of it; 1/64 of the budget leaves room for the plan's per-sample arrays.
    """
    return max(1 << 12, min(BATCH_BYTES, budget // 64))


def needs_out_of_core(paths: list[Path], columns: list[str], budget: int) -> bool:
    # the in-memory path holds the decoded table and the flat copy at once
    return 2 * estimate_decoded_bytes(paths, columns) > budget


# --------------------------------------------------------------------------------------------
# Batch readers: the same tables the in-memory readers return, a slice at a time


def _batch_rows(bytes_per_row: float, batch_bytes: int) -> int:
    return int(max(1, min(1 << 20, batch_bytes // max(bytes_per_row, 1.0))))


def _parquet_batches(
    path: Path, columns: list[str], batch_bytes: int = BATCH_BYTES
) -> Iterator[RawTable]:
    try:
        pf = pq.ParquetFile(path, memory_map=True)
        schema = pf.schema_arrow
        present = [c for c in columns if c in schema.names]
        for name in present:
            if not _list_of_int(schema.field(name).type):
                raise InputError(
                    f"column '{name}' has type {schema.field(name).type}, expected "
                    "a list of integers",
                    where=str(path),
                )
        meta = pf.metadata
        if not present:
            yield RawTable(pa.table({"__rows__": pa.nulls(meta.num_rows)}))
            return
        per_row = estimate_decoded_bytes([path], present) / max(meta.num_rows, 1)
        meter = ParquetMeter(path, meta.num_rows)
        for batch in pf.iter_batches(
            batch_size=_batch_rows(per_row, batch_bytes), columns=present, use_threads=True
        ):
            meter.rows_done(batch.num_rows)
            yield RawTable(pa.Table.from_batches([batch]))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read Parquet: {exc}", where=str(path)) from None


def _arrow_batches(path: Path, columns: list[str], batch_bytes: int = 0) -> Iterator[RawTable]:
    try:
        source = pa.memory_map(str(path))
        try:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            schema = reader.schema
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_stream(source)
            batches, schema = iter(reader), reader.schema
        present = [c for c in columns if c in schema.names]
        for name in present:
            if not _list_of_int(schema.field(name).type):
                raise InputError(
                    f"column '{name}' has type {schema.field(name).type}, expected "
                    "a list of integers",
                    where=str(path),
                )
        for batch in batches:
            if present:
                yield RawTable(pa.Table.from_batches([batch]).select(present))
            else:
                yield RawTable(pa.table({"__rows__": pa.nulls(batch.num_rows)}))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot read Arrow IPC: {exc}", where=str(path)) from None


def _jsonl_batches(path: Path, columns: list[str], batch_bytes: int = 0) -> Iterator[RawTable]:
    _, compression = detect_format(path)
    try:
        reader = pa_json.open_json(
            open_input(path, compression),
            # the streaming JSON reader keeps tens of blocks in flight on its threads (its pool
            # peaked at ~45 blocks here), so a block is a quarter of a batch
            read_options=pa_json.ReadOptions(
                block_size=min(_JSON_BLOCK, max(batch_bytes // 4, 1 << 16))
                if batch_bytes
                else _JSON_BLOCK
            ),
            parse_options=pa_json.ParseOptions(
                explicit_schema=_json_schema(columns), unexpected_field_behavior="ignore"
            ),
        )
        batches = list(_first_batch(reader))  # fail before yielding anything on a bad start
        rows = 0
        for batch in itertools.chain(batches, reader):
            rows += batch.num_rows
            yield RawTable(pa.Table.from_batches([batch]))
        if rows != count_lines(path, compression):  # two objects on a line: read line by line
            raise _JsonlFallback()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        raise _JsonlFallback() from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc}", where=str(path)) from None


def _first_batch(reader) -> Iterator[pa.RecordBatch]:
    try:
        yield reader.read_next_batch()
    except StopIteration:
        return


class _JsonlFallback(Exception):
    """The streaming JSON parser met a line it cannot parse: re-read the file line by line."""


BATCH_READERS: dict[str, Callable[[Path, list[str]], Iterator[RawTable]]] = {
    "parquet": _parquet_batches,
    "arrow": _arrow_batches,
    "jsonl": _jsonl_batches,
}


# --------------------------------------------------------------------------------------------


def make_cache_dir(output: Path) -> Path:
    """A hidden directory beside the output; a killed run's is removed by the next run."""
    output.parent.mkdir(parents=True, exist_ok=True)
    path = output.parent / f".{output.name}{TMP_MARK}{os.getpid()}-cache-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def remove_cache_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


class _Appender:
    def __init__(self, path: Path):
        self.path = path
        self.fh = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.count = 0

    def add(self, values: np.ndarray) -> None:
        self.fh.write(memoryview(np.ascontiguousarray(values, np.int32)))
        self.count += values.size

    def rewind(self, count: int) -> None:
        self.fh.seek(count * 4)
        self.fh.truncate()
        self.count = count

    def close(self) -> np.ndarray:
        self.fh.close()
        if self.count == 0:
            return np.zeros(0, np.int32)
        # copy-on-write: a writable array type for the kernels, pages shared with the file
        return np.asarray(np.memmap(self.path, np.int32, mode="c", shape=(self.count,)))


class _Restart(Exception):
    """Batches of one file disagree (labels in some only) or JSONL the streaming parser rejects:
    re-read that file whole, with the in-memory reader's rules."""


def stream_samples(
    inputs: Iterable[str | Path],
    cache_dir: Path,
    input_column: str = DEFAULT_INPUT,
    labels_column: str | None = DEFAULT_LABELS,
    require_labels: bool = False,
    progress: Callable[[Path], None] | None = None,
    on_error: str = "error",
    batch_bytes: int = BATCH_BYTES,
) -> Samples:
    """Like `read_samples`, but the token and label values live in memory-mapped cache files.

    batch_bytes: decoded bytes per streamed batch (Parquet; JSONL blocks of at most 16 MiB).
    """
    if on_error not in ("error", "skip"):
        raise ValueError(f"on_error must be 'error' or 'skip', got {on_error!r}")
    paths = expand_inputs(inputs)
    check_files(paths, sample_columns(input_column, labels_column))
    columns = [input_column] + ([labels_column] if labels_column else [])
    out = (_Appender(cache_dir / "tokens.i32"), _Appender(cache_dir / "labels.i32"))
    sources = []
    len_parts, index_parts = [], []
    rejects = Rejects() if on_error == "skip" else None
    first = 0
    try:
        for path in paths:
            fmt, _ = detect_format(path)
            marks = (
                out[0].count,
                out[1].count,
                len(len_parts),
                len(rejects.records) if rejects else 0,
                dict(rejects.counts) if rejects else None,
            )

            def stream(tables, path=path, fmt=fmt, first=first):
                return _stream_file(
                    path,
                    fmt,
                    tables,
                    columns,
                    first,
                    input_column,
                    labels_column,
                    on_error,
                    rejects,
                    out,
                    len_parts,
                    index_parts,
                )

            try:
                src = stream(BATCH_READERS[fmt](path, columns, batch_bytes))
            except _Restart:
                out[0].rewind(marks[0])
                out[1].rewind(marks[1])
                del len_parts[marks[2] :], index_parts[marks[2] :]
                if rejects:
                    del rejects.records[marks[3] :]
                    rejects.counts = marks[4]
                src = stream(iter([READERS[fmt](path, columns)]))
            check_schema(src, sources, labels_column, require_labels)
            sources.append(src)
            first += src.num_samples
            if progress:
                progress(path)
    finally:
        tokens = out[0].close()
        labels = out[1].close()
    offsets, index = assemble_offsets(len_parts, index_parts, first, rejects)
    return Samples(
        tokens=tokens,
        offsets=offsets,
        labels=labels if sources[0].has_labels else None,
        sources=sources,
        index=index,
        rejects=rejects,
    )


def _stream_file(
    path,
    fmt,
    tables,
    columns,
    first,
    input_column,
    labels_column,
    on_error,
    rejects,
    out,
    len_parts,
    index_parts,
):
    """Validate and append every batch of one file; return its `SourceFile`."""
    src = new_source(path, fmt, 0, first)
    rows = 0
    has_labels = None
    try:
        for raw in tables:
            n = raw.table.num_rows
            if n == 0:
                continue
            if raw.lines is not None:
                src._lines = raw.lines
            src.num_samples = rows + n  # so that error locations inside this batch resolve
            tokens, lengths, labels, kept, has = validate(
                raw, src, rows, input_column, labels_column, on_error, rejects
            )
            if has_labels is None:
                has_labels = has
            elif has != has_labels:
                raise _Restart()
            out[0].add(tokens)
            if labels is not None:
                out[1].add(labels)
            len_parts.append(lengths)
            index_parts.append(
                (first + rows, first + rows + n)
                if kept is None
                else first + rows + kept.astype(np.int64)
            )
            rows += n
    except _JsonlFallback:
        raise _Restart() from None
    src.num_samples = rows
    src.has_labels = bool(has_labels)
    return src
