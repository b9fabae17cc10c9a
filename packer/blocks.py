"""Block packing: the pipeline that both engines run, one block of input per task.

With `block_size` set, the inputs are cut into blocks that follow the files: a block never
spans two files, Parquet blocks end at row-group boundaries, Arrow IPC blocks at record batches
and JSONL blocks at the first line that starts at or after each multiple of `block_size` bytes
(a compressed JSONL file is one block). The cut depends on the files and `block_size` only, so
every engine, with any number of workers, writes the same bytes.

Stages, each a plain function an engine runs where it likes (`packer.engines`):

1. `scan_file`, one per file: the blocks and their sample counts (Parquet and Arrow from
   metadata; JSONL counts its non-blank lines, without parsing them). The driver numbers the
   samples globally from these counts, so `sample_index` means the same as with one plan.
2. `pack_block`, one per block: read and validate (the local reader's checks and one-line
   errors), resolve over-length samples, plan with the configured strategy, and write the rows
   that are full enough as shards straight into the output's temporary directory. The samples
   of the under-filled tail rows are spilled to a small file; only their lengths go back to the
   driver, with the block's counts and length histogram.
3. The driver plans every spilled sample together (by block, then position) and `write_tail`
   tasks gather them from the spill files into tail shards. Those samples are the only tokens
   that move between workers (`tokens_moved` in the stats).
4. The driver writes the manifest last and commits the directory atomically, as `pack` does.

Tasks write into a private work directory and rename their files into place, so a task retried
after its worker died writes the same bytes again.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import types
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from packer import __version__, algorithms, output
from packer.config import PackConfig
from packer.errors import InputError, UsageError
from packer.overlength import Segments, resolve
from packer.planning import Plan, lower_bound, martello_toth_bound, plan
from packer.progress import open_input
from packer.readers import (
    _JSON_BLOCK,
    _chunked_samples,
    _counts_text,
    _json_schema,
    _line_spans,
    _select,
    detect_format,
    fingerprint,
    parse_jsonl_lines,
)
from packer.samples import Rejects, Samples, SourceFile
from packer.shards import _sources, write_shards

DEFAULT_BLOCK_SIZE = 64 << 20  # `--engine ray` without --block-size
# A row with more than L // TAIL_FREE free tokens is a tail row: its samples are packed again
# with every block's tails. 1/512 of L keeps the rows within 0.01 % of one global plan on the
# benchmarks of docs/scale.md while moving a few percent of the tokens.
TAIL_FREE = 512
TAIL_GROUP = 1024  # blocks whose tails are planned together (and read by one tail task at most)
WORK = ".blocks"  # inside the temporary output: spill files and task work directories
_SCAN_CHUNK = 16 << 20
_DECREASING = ("bfd", "ffd", "histogram")
_HISTOGRAM_MAX_LEN = 1 << 24  # beyond this L the driver does not build a dense histogram


# --------------------------------------------------------------------------------------------
# Stage 1: scan


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
    """Cut one input file into blocks and count their samples."""
    p = Path(path)
    fmt, compression = detect_format(p)
    size = p.stat().st_size
    if fmt == "parquet":
        blocks = _scan_parquet(index, p, block_size, columns)
    elif fmt == "arrow":
        blocks = _scan_arrow(index, p, block_size, columns)
    else:
        blocks = _scan_jsonl(index, p, None if compression else block_size, compression)
    return FileScan(str(p), fmt, size, fingerprint(p), blocks)


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
        meta = pq.read_metadata(path)
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


def _open_ipc(path: Path):
    """(batches as a list, schema) of an Arrow IPC file or stream, memory-mapped."""
    source = pa.memory_map(str(path))
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
    index: int, path: Path, block_size: int | None, compression: str | None
) -> list[BlockSpec]:
    """JSONL blocks from one streaming pass: newlines and non-blank lines counted per block.

    A block starts at the first line that starts at or after the next multiple of
    `block_size`; None (compressed files) gives one block. Blank lines are not samples, as in
    the reader (`_line_spans`).
    """
    size = path.stat().st_size
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


# --------------------------------------------------------------------------------------------
# Stage 2: one block


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


@dataclass
class BlockResult:
    """What a block task sends back to the driver: counts and tail lengths, no tokens."""

    block: int
    rows: int  # samples read, rejected ones included
    has_labels: bool
    samples: int  # kept
    tokens_in: int
    segments: int
    tokens: int
    dropped: int
    truncated: int
    split: int
    tokens_removed: int
    rejects: list[dict]
    rejected_by_reason: dict[str, int]
    shards: list[dict]
    full_rows: int
    tail_lengths: np.ndarray  # int64: lengths of the spilled segments, in spill order
    hist: tuple[np.ndarray, np.ndarray]  # (segment lengths, counts)
    seconds: float
    version: str = __version__
    split_labels: np.ndarray | None = None  # pipeline.split_points of the block


def _block_bytes(spec: BlockSpec) -> bytes:
    path = Path(spec.path)
    _, compression = detect_format(path)
    try:
        with open_input(path, compression) as stream:
            if spec.end < 0:
                return stream.read()
            stream.seek(spec.start)
            return stream.read(spec.end - spec.start)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read: {exc}", where=spec.path) from None


def _read_block(spec: BlockSpec, columns: list[str]):
    """The block as the local readers return a file: a `RawTable` of the wanted columns."""
    from packer.readers import RawTable

    path = Path(spec.path)
    if spec.format == "parquet":
        try:
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
            batches, schema = _open_ipc(path)
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


def _block_samples(spec: BlockSpec, cfg: PackConfig, rejects: Rejects | None):
    """Read and validate a block: (Samples with global indices, or None if none kept, source)."""
    from packer.readers import validate

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
        samples = _chunked_samples([tokens], [labels], offsets, [src], index, rejects)
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


def block_seed(seed: int, block: int) -> int:
    """The seed of one block's plan (ff-shuffle), from the configured seed and its number."""
    return int(np.random.SeedSequence([seed, block]).generate_state(1)[0])


def tail_rows(pl: Plan, lengths: np.ndarray, cfg: PackConfig) -> np.ndarray:
    """Which rows of a block's plan are under-filled tails (bool per row)."""
    n = pl.num_rows
    tail = np.zeros(n, bool)
    if n == 0:
        return tail
    if cfg.strategy in _DECREASING:
        used = np.add.reduceat(lengths[pl.order], pl.row_starts[:-1])
        tail[:] = cfg.max_len - used > cfg.max_len // TAIL_FREE
    else:  # input-order strategies: only the block's last, open row
        tail[-1] = True
    return tail


def _keep_rows(pl: Plan, keep: np.ndarray) -> Plan:
    counts = np.diff(pl.row_starts)
    order = pl.order[np.repeat(keep, counts)]
    starts = np.zeros(int(keep.sum()) + 1, np.int64)
    np.cumsum(counts[keep], out=starts[1:])
    return Plan(order=order, row_starts=starts)


def _work_dir(tmp: Path, name: str) -> Path:
    work = tmp / WORK / f"work-{name}-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    return work


def _publish(work: Path, dest: Path) -> None:
    """Rename a task's finished files into place (idempotent: a retry writes the same bytes)."""
    for entry in sorted(work.iterdir()):
        os.replace(entry, dest / entry.name)
    work.rmdir()


def spill_path(tmp: Path, block: int, width: int) -> Path:
    return tmp / WORK / f"tail-b{block:0{width}d}.arrow"


def pack_block(spec: BlockSpec, cfg: PackConfig, tmp: str, workers: int) -> BlockResult:
    """Stage 2 for one block: read, validate, resolve, plan, write full rows, spill tails."""
    from packer.pipeline import split_points  # pipeline dispatches to this module
    from packer.workers import configure

    t0 = time.perf_counter()
    configure(workers)
    tmp_dir = Path(tmp)
    rejects = Rejects() if cfg.on_error == "skip" else None
    samples, src = _block_samples(spec, cfg, rejects)
    common = {
        "block": spec.block,
        "rows": spec.rows,
        "has_labels": src.has_labels,
        "rejects": rejects.records if rejects else [],
        "rejected_by_reason": dict(rejects.counts) if rejects else {},
    }
    if samples is None:
        return BlockResult(
            **common,
            samples=0,
            tokens_in=0,
            segments=0,
            tokens=0,
            dropped=0,
            truncated=0,
            split=0,
            tokens_removed=0,
            shards=[],
            full_rows=0,
            tail_lengths=np.zeros(0, np.int64),
            hist=(np.zeros(0, np.int64), np.zeros(0, np.int64)),
            seconds=time.perf_counter() - t0,
        )
    segs = resolve(samples, cfg.max_len, cfg.overlength)
    segs.sample = samples.index[segs.sample]
    pl = plan(
        segs.length,
        cfg.max_len,
        cfg.strategy,
        seed=block_seed(cfg.seed, spec.block),
        window=cfg.window,
    )
    tail = tail_rows(pl, segs.length, cfg)
    full = _keep_rows(pl, ~tail)
    tails = _keep_rows(pl, tail)

    work = _work_dir(tmp_dir, f"b{spec.block:0{spec.width}d}")
    n_shards = -(-full.num_rows // cfg.rows_per_shard())
    digits = max(3, len(str(max(n_shards - 1, 0))))
    prefix = f"shard-b{spec.block:0{spec.width}d}"
    shards = write_shards(
        samples,
        segs,
        full,
        cfg,
        work,
        workers=workers,
        names=lambda i: f"{prefix}-{i:0{digits}d}.arrow",
    )
    spill = _spill(
        samples, segs, tails.order, work / spill_path(tmp_dir, spec.block, spec.width).name
    )
    _fault_point()
    for entry in sorted(work.iterdir()):
        dest = tmp_dir / WORK if entry.name.startswith("tail-") else tmp_dir
        os.replace(entry, dest / entry.name)
    work.rmdir()
    lengths, counts = np.unique(segs.length, return_counts=True)
    return BlockResult(
        **common,
        samples=samples.num_samples,
        tokens_in=samples.num_tokens,
        segments=segs.num_segments,
        tokens=int(segs.length.sum()),
        dropped=segs.dropped,
        truncated=segs.truncated,
        split=segs.split,
        tokens_removed=segs.tokens_removed,
        shards=shards,
        full_rows=full.num_rows,
        tail_lengths=spill,
        hist=(lengths.astype(np.int64), counts.astype(np.int64)),
        seconds=time.perf_counter() - t0,
        split_labels=split_points(samples, segs),
    )


def _fault_point() -> None:
    """Fault injection for tests: with PACKER_FAULT_KILL_ONCE=PATH set, the first block task to
    create PATH kills its own process after writing its files and before publishing them."""
    marker = os.environ.get("PACKER_FAULT_KILL_ONCE")
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def _spill(samples: Samples, segs: Segments, order: np.ndarray, path: Path) -> np.ndarray:
    """Write the tail segments (tokens, labels, provenance) to an Arrow IPC file; their lengths."""
    chunks, label_chunks, seg_chunk, seg_local = _sources(samples, segs)
    lengths = segs.length[order]
    offsets = np.zeros(order.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = [chunks[seg_chunk[s]][seg_local[s] : seg_local[s] + segs.length[s]] for s in order]
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
    columns = {
        "tokens": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int32())),
        "sample": pa.array(segs.sample[order], pa.int64()),
        "offset": pa.array(segs.offset[order], pa.int32()),
    }
    if samples.has_labels:
        labs = [
            label_chunks[seg_chunk[s]][seg_local[s] : seg_local[s] + segs.length[s]] for s in order
        ]
        flat_labels = np.concatenate(labs) if labs else np.zeros(0, np.int32)
        columns["labels"] = pa.LargeListArray.from_arrays(
            pa.array(offsets), pa.array(flat_labels, pa.int32())
        )
    table = pa.table(columns)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return lengths.astype(np.int64)


# --------------------------------------------------------------------------------------------
# Stage 3: tail shards


@dataclass
class TailTask:
    """One tail shard: its rows as (block, position in the block's spill) per segment."""

    shard: int
    blocks: np.ndarray  # int64 per segment
    positions: np.ndarray  # int64 per segment
    row_starts: np.ndarray  # int64[rows + 1]
    width: int = 5
    block_width: int = 5


def write_tail(task: TailTask, cfg: PackConfig, tmp: str, workers: int) -> list[dict]:
    """Gather the tail rows of one shard from the spill files and write the shard."""
    from packer.gather import as_chunks
    from packer.workers import configure

    configure(workers)
    tmp_dir = Path(tmp)
    needed = np.unique(task.blocks)
    chunk_of = {int(b): k for k, b in enumerate(needed.tolist())}
    tok, lab, starts, tables = [], [], [0], []
    for b in needed.tolist():
        path = spill_path(tmp_dir, b, task.block_width)
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        tables.append(table)
        values = table.column("tokens").combine_chunks().values.to_numpy()
        tok.append(values)
        if "labels" in table.column_names:
            lab.append(table.column("labels").combine_chunks().values.to_numpy())
        starts.append(starts[-1] + values.size)
    n = task.blocks.size
    seg_start = np.empty(n, np.int64)
    seg_len = np.empty(n, np.int64)
    seg_sample = np.empty(n, np.int64)
    seg_offset = np.empty(n, np.int32)
    chunk = np.fromiter((chunk_of[int(b)] for b in task.blocks), np.int64, count=n)
    for k, table in enumerate(tables):
        mine = np.flatnonzero(chunk == k)
        pos = task.positions[mine]
        offsets = table.column("tokens").combine_chunks().offsets.to_numpy()
        seg_start[mine] = starts[k] + offsets[pos]
        seg_len[mine] = offsets[pos + 1] - offsets[pos]
        seg_sample[mine] = table.column("sample").to_numpy()[pos]
        seg_offset[mine] = table.column("offset").to_numpy()[pos]
    samples = Samples(
        tokens=None,
        offsets=np.zeros(1, np.int64),
        labels=None,
        sources=[],
        token_chunks=as_chunks(tok),
        label_chunks=as_chunks(lab) if lab else None,
        chunk_starts=np.asarray(starts, np.int64),
    )
    segs = Segments(seg_sample, seg_start, seg_len, seg_offset, 0, 0, 0, 0)
    pl = Plan(order=np.arange(n, dtype=np.int64), row_starts=task.row_starts)
    one = replace(cfg, shard_rows=max(1, pl.num_rows))
    work = _work_dir(tmp_dir, f"t{task.shard:0{task.width}d}")
    name = f"shard-t{task.shard:0{task.width}d}.arrow"
    entries = write_shards(samples, segs, pl, one, work, workers=workers, names=lambda _: name)
    _publish(work, tmp_dir)
    return entries


# --------------------------------------------------------------------------------------------
# The driver


@dataclass
class _Totals:
    rejects: Rejects = field(default_factory=Rejects)
    hist: np.ndarray | None = None


def plan_blocks(scans: list[FileScan]) -> list[BlockSpec]:
    """Number the blocks and the samples of every file, in input order."""
    specs: list[BlockSpec] = []
    first = 0
    for scan in scans:
        for spec in scan.blocks:
            spec.first_index = first
            specs.append(spec)
        first += sum(s.rows for s in scan.blocks)
    width = max(5, len(str(max(len(specs) - 1, 0))))
    for k, spec in enumerate(specs):
        spec.block, spec.width = k, width
    return specs


def _check_memory(specs: list[BlockSpec], budget: int) -> None:
    for spec in specs:
        if 2 * spec.decoded > budget:
            raise UsageError(
                f"a block of {spec.path} decodes to about {spec.decoded >> 20} MiB, more than "
                f"half of the --memory-budget ({budget >> 20} MiB); pass a smaller --block-size "
                "(a Parquet row group is never cut) or a larger --memory-budget"
            )


def _check_labels(specs: list[BlockSpec], results: list[BlockResult], labels_column) -> bool:
    """Every block with samples must agree with the first on having labels."""
    seen = [(s, r) for s, r in zip(specs, results) if r.rows and r.samples]
    if not seen:
        return False
    s0, r0 = seen[0]
    for s, r in seen[1:]:
        if r.has_labels != r0.has_labels:
            (w, _), (wo, _) = ((s, r), (s0, r0)) if r.has_labels else ((s0, r0), (s, r))
            if w.path == wo.path:
                raise InputError(
                    f"mixed schemas: {w.path} has a '{labels_column}' column in some blocks "
                    "and not in others"
                )
            raise InputError(
                f"mixed schemas: {w.path} has a '{labels_column}' column and {wo.path} does not"
            )
    return r0.has_labels


def _global_rows(hist: np.ndarray | None, cfg: PackConfig) -> int | None:
    """Rows of one global plan of every segment, from the length histogram alone."""
    if hist is None or cfg.strategy not in _DECREASING:
        return None
    kernel = {
        "bfd": algorithms.best_fit_groups,
        "ffd": algorithms.first_fit_groups,
        "histogram": algorithms.worst_fit_groups,
    }[cfg.strategy]
    return int(kernel(hist, cfg.max_len)[-1])


def tail_tasks(
    results: list[BlockResult], cfg: PackConfig, num_blocks: int, width: int
) -> tuple[list[TailTask], int, int]:
    """Plan the spilled segments of every `TAIL_GROUP` consecutive blocks together.

    Returns (tasks, tail rows, tokens moved). Grouping bounds how many spill files one tail
    task opens; a group of 1024 blocks packs as well as all of them at once.
    """
    groups: dict[int, list[BlockResult]] = {}
    for r in results:
        if r.tail_lengths.size:
            groups.setdefault(r.block // TAIL_GROUP, []).append(r)
    per_shard = cfg.rows_per_shard()
    parts, rows, moved = [], 0, 0
    for g, members in sorted(groups.items()):
        blocks = np.concatenate([np.full(r.tail_lengths.size, r.block, np.int64) for r in members])
        positions = np.concatenate(
            [np.arange(r.tail_lengths.size, dtype=np.int64) for r in members]
        )
        lengths = np.concatenate([r.tail_lengths for r in members])
        pl = plan(lengths, cfg.max_len, cfg.strategy, seed=block_seed(cfg.seed, num_blocks + g))
        rows += pl.num_rows
        moved += int(lengths.sum())
        for a in range(0, pl.num_rows, per_shard):
            b = min(a + per_shard, pl.num_rows)
            sel = pl.order[pl.row_starts[a] : pl.row_starts[b]]
            parts.append((blocks[sel], positions[sel], pl.row_starts[a : b + 1] - pl.row_starts[a]))
    digits = max(5, len(str(max(len(parts) - 1, 0))))
    tasks = [
        TailTask(k, blk, pos, starts, width=digits, block_width=width)
        for k, (blk, pos, starts) in enumerate(parts)
    ]
    return tasks, rows, moved


def pack_blocks(
    files: list[Path],
    out: Path,
    cfg: PackConfig,
    *,
    overwrite: bool,
    progress,
    workers: int,
    budget: int,
    t0: float,
):
    """Run the block pipeline on the configured engine; the atomic commit stays here."""
    from packer.engines import open_engine
    from packer.pipeline import (
        REJECTS,
        PackResult,
        build_manifest,
        write_split_labels,
    )

    if cfg.block_size is None:
        cfg = replace(cfg, block_size=DEFAULT_BLOCK_SIZE)
    labels_column = cfg.labels_column or None
    columns = [cfg.input_column] + ([labels_column] if labels_column else [])
    timings: dict[str, float] = {}
    with open_engine(cfg, workers) as engine:
        t = time.perf_counter()
        timings["engine_start"] = t - t0
        scans = engine.map(
            scan_file, [(i, str(p), cfg.block_size, columns) for i, p in enumerate(files)]
        )
        for scan in scans:
            if scan.version != __version__:
                raise UsageError(
                    f"a worker runs packer {scan.version}, the driver {__version__}: install "
                    "the same packer on every node"
                )
        specs = plan_blocks(scans)
        _check_memory(specs, budget)
        timings["scan"] = time.perf_counter() - t
        tmp = output.start(out)
        with output.building(tmp, out):
            t = time.perf_counter()
            total_bytes = sum(s.nbytes for s in specs) or 1
            done = [0]

            def on_block(k: int) -> None:
                done[0] += specs[k].nbytes
                if progress:
                    progress("read", done[0], total_bytes)

            if progress:
                progress("read", 0, total_bytes)
            worker_cpus = engine.task_workers(workers)
            results = engine.map(
                pack_block,
                [(s, cfg, str(tmp), worker_cpus) for s in specs],
                on_done=on_block,
            )
            timings["blocks"] = time.perf_counter() - t
            t = time.perf_counter()
            if progress:
                progress("plan", 0, 0)
            has_labels = _check_labels(specs, results, labels_column)
            totals = _totals(results, cfg)
            tasks, tail_row_count, moved = tail_tasks(
                results, cfg, len(specs), specs[0].width if specs else 5
            )
            if progress:
                progress("plan", 1, 1)
            tail_entries = engine.map(write_tail, [(k, cfg, str(tmp), worker_cpus) for k in tasks])
            timings["tails"] = time.perf_counter() - t
            t = time.perf_counter()
            shutil.rmtree(tmp / WORK, ignore_errors=True)
            shards = [e for r in results for e in r.shards] + [e for es in tail_entries for e in es]
            sources = _sources_of(scans, specs, results, has_labels)
            stats = _stats(results, totals, cfg, shards, tail_row_count, moved, len(specs))
            rejects = None
            if cfg.on_error == "skip":
                from packer.pipeline import _write_rejects

                rejects = _write_rejects(
                    types.SimpleNamespace(
                        rejects=totals.rejects, num_rejected=totals.rejects.total
                    ),
                    tmp,
                    cfg.hash,
                )
                assert rejects["file"] == REJECTS
            points = [r.split_labels for r in results if r.split_labels is not None]
            split_labels = write_split_labels(
                np.concatenate(points) if points else None, tmp, cfg.hash
            )
            manifest = build_manifest(
                cfg,
                types.SimpleNamespace(sources=sources),
                stats,
                shards,
                rejects,
                split_labels=split_labels,
            )
            output.finish(tmp, out, manifest, overwrite)
            timings["commit"] = time.perf_counter() - t
    seconds = [r.seconds for r in results]
    timings["block_task_median"] = float(np.median(seconds)) if seconds else 0.0
    timings["block_task_max"] = float(max(seconds, default=0.0))
    return PackResult(
        output=out,
        stats=stats,
        shards=shards,
        seconds=time.perf_counter() - t0,
        timings=timings,
        engine=cfg.engine,
    )


def _totals(results: list[BlockResult], cfg: PackConfig) -> _Totals:
    totals = _Totals()
    for r in results:
        totals.rejects.records.extend(r.rejects)
        for reason, n in r.rejected_by_reason.items():
            totals.rejects.counts[reason] = totals.rejects.counts.get(reason, 0) + n
    read = sum(r.rows for r in results)
    kept = sum(r.samples for r in results)
    if read == 0:
        raise InputError("the dataset is empty: the inputs hold no samples")
    if kept == 0:
        raise InputError(
            f"the dataset is empty: all {read} samples were rejected "
            f"({_counts_text(totals.rejects)})"
        )
    if cfg.max_len <= _HISTOGRAM_MAX_LEN:
        hist = np.zeros(cfg.max_len + 1, np.int64)
        for r in results:
            np.add.at(hist, r.hist[0], r.hist[1])
        totals.hist = hist
    return totals


def _sources_of(scans, specs, results, has_labels: bool) -> list[SourceFile]:
    sources = []
    first = 0
    by_file: dict[int, list[tuple[BlockSpec, BlockResult]]] = {}
    for s, r in zip(specs, results):
        by_file.setdefault(s.file, []).append((s, r))
    for i, scan in enumerate(scans):
        parts = by_file.get(i, [])
        n = sum(r.rows for _, r in parts)
        sources.append(
            SourceFile(
                path=Path(scan.path),
                format=scan.format,
                num_samples=n,
                first_index=first,
                size=scan.size,
                fingerprint=scan.fingerprint,
                has_labels=has_labels and any(r.has_labels for _, r in parts),
                rejected=sum(len(r.rejects) for _, r in parts),
            )
        )
        first += n
    return sources


def _stats(results, totals: _Totals, cfg: PackConfig, shards, tail_rows_, moved, num_blocks):
    tokens = sum(r.tokens for r in results)
    rows = sum(r.full_rows for r in results) + tail_rows_
    lb = lower_bound(tokens, cfg.max_len)
    shard_tokens = sum(s["tokens"] for s in shards)
    stats = {
        "samples_in": sum(r.rows for r in results),
        "samples_packed": sum(r.samples - r.dropped for r in results),
        "rejected": totals.rejects.total,
        "rejected_by_reason": dict(sorted(totals.rejects.counts.items())),
        "dropped": sum(r.dropped for r in results),
        "truncated": sum(r.truncated for r in results),
        "split": sum(r.split for r in results),
        "segments": sum(r.segments for r in results),
        "tokens_in": sum(r.tokens_in for r in results),
        "tokens": tokens,
        "tokens_removed": sum(r.tokens_removed for r in results),
        "pad_tokens": shard_tokens - tokens,
        "loss_tokens": sum(s["loss_tokens"] for s in shards),
        "rows": rows,
        "lower_bound": lb,
        "rows_over_lower_bound": round(rows / lb, 6) if lb else 1.0,
        "efficiency": round(tokens / (rows * cfg.max_len), 6) if rows else 1.0,
        "blocks": num_blocks,
        "tail_rows": tail_rows_,
        "tokens_moved": moved,
    }
    if totals.hist is not None:
        l2 = martello_toth_bound(totals.hist, cfg.max_len)
        stats["lower_bound_l2"] = max(lb, l2)
    global_rows = _global_rows(totals.hist, cfg)
    if global_rows is not None:
        stats["global_rows"] = global_rows
        stats["block_cost"] = round(rows / global_rows - 1, 6) if global_rows else 0.0
    return stats
