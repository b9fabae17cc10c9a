"""Gather planned rows into record batches and write them as shards, on separate cores.

A shard is an Arrow IPC stream of record batches of `BATCH_TOKENS // L` rows (one at least),
so the gather buffers, and with them packer's memory, do not grow with the shard size or the
input.
The batch size is fixed (not derived from `--memory-budget` or `--workers`): the output bytes
never depend on the machine.

The gather kernel releases the GIL, and hashing plus writing spend their time in the hash and
the kernel's write path, so with two buffers batch i+1 is gathered while batch i is written.
With `workers=1` the same work runs in sequence. Each finished shard is flushed to disk on a
third thread, which only waits on the device, so the final commit has little left to sync, and
its pages leave the page cache so that later shards reuse them (see `commit.fsync_file`).
A file written around the page cache (`direct`, `pack_dataset`'s cache file) leaves the writer
thread little to do, so there every worker gathers. `packer pack` keeps the page cache: with
per-shard staging buffers its write stage measured 7.2-8.2 s against 4.0-4.6 s buffered.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer import workers as workers_mod
from packer.config import PackConfig
from packer.contract.schema import SCHEMA
from packer.interrupts import interrupt_once
from packer.planning.overlength import Segments
from packer.planning.strategies import Plan
from packer.read.samples import Samples, as_chunks
from packer.write.commit import KEEP_BYTES, fsync_file
from packer.write.gather import Buffers, gather_rows, shard_sizes
from packer.write.shard_file import ShardWriter, shard_batch

Progress = Callable[[str, int, int], None]
# (buffers, rows, tokens, cu_seqlens entries) -> the record batch written for them
BatchOf = Callable[[Buffers, int, int, int], pa.RecordBatch]

BATCH_TOKENS = 1 << 20  # per record batch (4 MiB per int32 column); one row when L is larger


def gather_buffer_bytes(max_len: int) -> int:
    """An upper bound on the two reused gather buffers: per token three int32 columns (12
    bytes) and at most one segment's cu_seqlens, sample_index and sample_offset entries (16)."""
    return 2 * max(BATCH_TOKENS, max_len) * 32


def shard_bounds(num_rows: int, rows_per_shard: int) -> list[tuple[int, int]]:
    starts = list(range(0, num_rows, rows_per_shard))
    return [(a, min(a + rows_per_shard, num_rows)) for a in starts]


def batch_rows(cfg: PackConfig) -> int:
    """Rows per record batch: as many as hold `BATCH_TOKENS` at most (at least one)."""
    return max(1, BATCH_TOKENS // cfg.max_len)


def batch_bounds(pl: Plan, cfg: PackConfig) -> list[tuple[int, int, int]]:
    """(shard, first row, end row) of every record batch, in output order."""
    out = []
    per_batch = batch_rows(cfg)
    for i, (a, b) in enumerate(shard_bounds(pl.num_rows, cfg.rows_per_shard())):
        out.extend((i, r, min(r + per_batch, b)) for r in range(a, b, per_batch))
    return out


def default_workers() -> int:
    return workers_mod.current()


def allocation(pl: Plan, segs: Segments, cfg: PackConfig, bounds) -> tuple[int, int, int]:
    """(tokens, rows, segments) of the largest of the (.., first row, end row) ranges."""
    sizes = [
        shard_sizes(pl.order, pl.row_starts, segs.length, a, b, cfg.max_len, cfg.pad)
        for *_, a, b in bounds
    ]
    return (
        max((t for t, _ in sizes), default=0),
        max((b - a for *_, a, b in bounds), default=0),
        max((s for _, s in sizes), default=0),
    )


def allocate(pl: Plan, segs: Segments, cfg: PackConfig, bounds) -> Buffers:
    """Buffers for the largest of the (.., first row, end row) ranges in `bounds`."""
    return Buffers.allocate(*allocation(pl, segs, cfg, bounds))


def gather_batch(
    samples: Samples, segs: Segments, pl: Plan, cfg: PackConfig, a: int, b: int, buf: Buffers
) -> tuple[int, int]:
    """Fill `buf` with rows a..b; return (tokens, cu_seqlens entries)."""
    tokens, labels, seg_chunk, seg_local = segment_sources(samples, segs)
    return gather_rows(
        tokens.addresses,
        labels.addresses,
        samples.has_labels,
        seg_chunk,
        seg_local,
        pl.order,
        pl.row_starts,
        segs.sample,
        segs.length,
        segs.offset,
        a,
        b,
        cfg.max_len,
        cfg.pad,
        cfg.pad_id,
        buf.ids,
        buf.labels,
        buf.pos,
        buf.row_offsets,
        buf.cu,
        buf.cu_offsets,
        buf.sample,
        buf.sample_offset,
        buf.sample_row_offsets,
        buf.loss,
    )


def segment_sources(samples: Samples, segs: Segments):
    """(token chunks, label chunks, chunk of each segment, start within it), once per Segments."""
    cached = getattr(segs, "_sources", None)
    if cached is None:
        if samples.token_chunks is not None:
            tokens, labels = samples.token_chunks, samples.label_chunks
            chunk = np.searchsorted(samples.chunk_starts, segs.start, side="right") - 1
            local = segs.start - samples.chunk_starts[chunk]
        else:  # one flat array (or cache file): a single chunk
            tokens = as_chunks([samples.tokens])
            labels = as_chunks([samples.labels]) if samples.labels is not None else None
            chunk = np.zeros(len(segs.start), np.int64)
            local = segs.start
        cached = (
            tokens,
            labels if labels is not None else tokens,
            chunk.astype(np.int64, copy=False),
            local.astype(np.int64, copy=False),
        )
        segs._sources = cached
    return cached


def gather_all(samples: Samples, segs: Segments, pl: Plan, cfg: PackConfig) -> Buffers:
    """Every row in one set of buffers: the in-memory pack, for benchmarks and library users."""
    bounds = [(0, 0, pl.num_rows)]
    buf = allocate(pl, segs, cfg, bounds)
    gather_batch(samples, segs, pl, cfg, 0, pl.num_rows, buf)
    return buf


def open_shard(
    path: Path, algorithm: str | None, schema: pa.Schema = SCHEMA, direct: bool = False
) -> ShardWriter:
    """A new shard file (a seam for fault-injection tests)."""
    return ShardWriter(path, algorithm, schema, direct)


@dataclass(frozen=True)
class ShardFiles:
    """Which files `write_shards` writes, and how. The default (`SHARDS`) is `packer pack`'s:
    one hashed file per shard, with the shards' columns, written through the page cache.

    schema, batch: the files' schema and the record batch of a filled buffer (the shards'
    columns by default; `pack_dataset` adds `seq_lengths`).
    one_file: every record batch goes into one file, `names(0)`, written even when the plan has
    no rows; the batches are those of the shards all the same. Its batches' headers stay in
    the page cache (`fsync_file`'s `keep`), since the caller memory-maps the file next.
    sync_bytes: also flush the file being written, and drop its pages from the page cache,
    every time this many more bytes have been written (a file of many GiB otherwise fills the
    page cache until it is closed).
    hashed: hash each file as it is written (`cfg.hash`), for a manifest; `pack_dataset`'s
    cache file has none and skips it (0.5 s of a core for 5 GiB).
    direct: write around the page cache (`direct.DirectFile`, where the file system allows):
    nothing to flush or drop as the files grow, so `sync_bytes` and the kept headers do not
    apply; each file is still synced once complete.
    """

    schema: pa.Schema = SCHEMA
    batch: BatchOf = shard_batch
    one_file: bool = False
    sync_bytes: int | None = None
    hashed: bool = True
    direct: bool = False
    # (record batch, gathered tokens) -> the tokens it holds, when `batch` adds some (CP padding)
    tokens_of: Callable[[pa.RecordBatch, int], int] | None = None


SHARDS = ShardFiles()


def write_shards(
    samples: Samples,
    segs: Segments,
    pl: Plan,
    cfg: PackConfig,
    out_dir: Path,
    progress: Progress | None = None,
    workers: int | None = None,
    names: Callable[[int], str] | None = None,
    *,
    files: ShardFiles = SHARDS,
) -> list[dict]:
    """Write every shard of the plan into `out_dir`; return their manifest entries in order.

    names: the file name of shard i (default `shard-00000.arrow`, ...).
    files: which files, and how (`ShardFiles`; by default the shards of `packer pack`).
    """
    bounds = batch_bounds(pl, cfg)
    if files.one_file:
        bounds = [(0, a, b) for _, a, b in bounds]
        if not bounds:
            name = names(0) if names else "shard-00000.arrow"
            return [_empty_file(out_dir / name, cfg, files)]
    workers = workers or default_workers()
    # the main thread gathers, one thread writes; around the page cache writing costs little
    # CPU, so more threads gather (batch k on thread k % gatherers) and the cores stay busy
    gatherers = min(workers, len(bounds)) if files.direct and workers > 1 else 1
    n_buffers = gatherers + 1 if workers > 1 and len(bounds) > 1 else 1
    sizes = allocation(pl, segs, cfg, bounds)
    buffers = [Buffers.allocate(*sizes) for _ in range(n_buffers)]
    out = _Output(out_dir, names, bounds, cfg, files)
    _gather_and_write(samples, segs, pl, cfg, out, buffers, gatherers, progress)
    return out.entries


def _empty_file(path: Path, cfg: PackConfig, files: ShardFiles) -> dict:
    """The one file of a plan with no rows: its schema and end mark, synced."""
    algorithm = cfg.hash if files.hashed else None
    writer = open_shard(path, algorithm, files.schema, files.direct)
    try:
        entry = writer.close()
    except BaseException:
        writer.abort()
        raise
    fsync_file(writer.path, drop_cache=True)
    return entry


class _Output:
    """The writer thread's side of `write_shards`: the file being written, the manifest entries
    of those complete and their syncs (on `syncer`). Touched by the writer thread only; after
    a failure, batches still queued do nothing."""

    def __init__(self, out_dir: Path, names, bounds, cfg: PackConfig, files: ShardFiles):
        num_shards = bounds[-1][0] + 1 if bounds else 0
        self.width = max(5, len(str(num_shards)))
        self.out_dir, self.names, self.bounds, self.files = out_dir, names, bounds, files
        self.algorithm = cfg.hash if files.hashed else None
        self.syncer: ThreadPoolExecutor | None = None
        self.entries: list[dict] = []
        self.syncs: list[Future] = []
        self.shard = -1
        self.writer: ShardWriter | None = None
        self.failed = False
        self.synced = 0
        self.heads: list[int] = []

    def write(self, k: int, buf: Buffers, rows: int, tokens: int, cu_entries: int) -> None:
        if self.failed:
            return
        files = self.files
        try:
            shard, _, _ = self.bounds[k]
            if self.shard != shard:
                name = self.names(shard) if self.names else f"shard-{shard:0{self.width}d}.arrow"
                writer = open_shard(self.out_dir / name, self.algorithm, files.schema, files.direct)
                self.shard, self.writer, self.synced = shard, writer, 0
                self.heads = [0] if files.one_file else []  # the schema message
            writer = self.writer
            if files.one_file:
                self.heads.append(writer.bytes)
            batch = files.batch(buf, rows, tokens, cu_entries)
            if files.tokens_of is not None:
                tokens = files.tokens_of(batch, tokens)
            writer.add(
                batch,
                tokens,
                int(buf.sample_row_offsets[rows]),
                int(buf.loss[:rows].sum()),
            )
            if k + 1 == len(self.bounds) or self.bounds[k + 1][0] != shard:
                self.writer = None
                self.entries.append(writer.close())
                end = [max(0, writer.bytes - KEEP_BYTES)] if files.one_file else []
                heads = self.heads + end  # + end mark
                self.syncs.append(self.syncer.submit(fsync_file, writer.path, True, heads))
            elif (
                files.sync_bytes
                and not writer.direct
                and writer.bytes - self.synced >= files.sync_bytes
            ):
                self.synced = writer.bytes
                heads = list(self.heads)
                self.syncs.append(self.syncer.submit(fsync_file, writer.path, True, heads))
        except BaseException:
            self.failed = True
            if self.writer is not None:
                self.writer.abort()
                self.writer = None
            raise

    def write_gathered(self, k: int, buf: Buffers, rows: int, gathered: Future) -> None:
        tokens, cu_entries = gathered.result()
        self.write(k, buf, rows, tokens, cu_entries)


def _gather_and_write(
    samples: Samples,
    segs: Segments,
    pl: Plan,
    cfg: PackConfig,
    out: _Output,
    buffers: list[Buffers],
    gatherers: int,
    progress: Progress | None,
) -> None:
    """Gather batch k into buffer k % len(buffers) (on the main thread, or on helper k %
    gatherers), and write it on the writer thread, in order."""
    bounds, n_buffers = out.bounds, len(buffers)
    pending: list[tuple[Future, int] | None] = [None] * n_buffers
    done_rows = [0]

    def finish(future: Future, rows: int) -> None:
        future.result()
        done_rows[0] += rows
        if progress:
            progress("write", done_rows[0], pl.num_rows)

    # a second Ctrl-C is ignored: raised inside the clean-up's joins below, it would leave the
    # writer threads running while the interpreter exits (a `Fatal Python error`)
    with (
        interrupt_once(),
        ThreadPoolExecutor(max_workers=1) as pool,
        ThreadPoolExecutor(max_workers=1) as syncer,
        ThreadPoolExecutor(max_workers=max(1, gatherers - 1)) as helpers,
    ):
        out.syncer = syncer
        try:
            for k, (_, a, b) in enumerate(bounds):
                slot = k % n_buffers
                if pending[slot] is not None:  # the buffer is still being written
                    finish(*pending[slot])
                    pending[slot] = None
                buf = buffers[slot]
                if k % gatherers:  # batch 0 first on this thread: `_sources` is built once
                    gathered = helpers.submit(gather_batch, samples, segs, pl, cfg, a, b, buf)
                    future = pool.submit(out.write_gathered, k, buf, b - a, gathered)
                else:
                    tokens, cu_entries = gather_batch(samples, segs, pl, cfg, a, b, buf)
                    future = pool.submit(out.write, k, buf, b - a, tokens, cu_entries)
                if n_buffers == 1:
                    finish(future, b - a)
                else:
                    pending[slot] = (future, b - a)
            for k in range(len(bounds), len(bounds) + n_buffers):
                if pending[k % n_buffers] is not None:
                    finish(*pending[k % n_buffers])
                    pending[k % n_buffers] = None
            for future in out.syncs:
                future.result()
        except BaseException:
            out.failed = True  # queued writes return at once
            helpers.shutdown(wait=True, cancel_futures=True)
            pool.shutdown(wait=True)
            syncer.shutdown(wait=True, cancel_futures=True)  # the directory is discarded anyway
            if out.writer is not None:
                out.writer.abort()
            raise
