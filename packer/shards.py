"""Gather planned rows into shards and write them, overlapping the two on separate cores.

The gather kernel releases the GIL, and hashing plus writing a shard spend their time in
the hash and the kernel's write path, so with two buffers shard i+1 is gathered while shard i is
written. With `workers=1` the same work runs in sequence. Each finished shard is flushed to disk
on a third thread, which only waits on the device, so the final commit has little left to sync,
and its pages leave the page cache so that later shards reuse them (see `output.fsync_file`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from packer import workers as workers_mod
from packer.config import PackConfig
from packer.gather import Buffers, gather_rows, gather_rows_chunked, shard_sizes
from packer.output import fsync_file
from packer.overlength import Segments
from packer.planning import Plan
from packer.samples import Samples
from packer.writer import shard_batch, write_shard

Progress = Callable[[str, int, int], None]


def shard_bounds(num_rows: int, rows_per_shard: int) -> list[tuple[int, int]]:
    starts = list(range(0, num_rows, rows_per_shard))
    return [(a, min(a + rows_per_shard, num_rows)) for a in starts]


def default_workers() -> int:
    return workers_mod.current()


def _allocate(pl: Plan, segs: Segments, cfg: PackConfig, bounds) -> Buffers:
    sizes = [shard_sizes(pl.order, pl.row_starts, segs.length, a, b, cfg.max_len, cfg.pad)
             for a, b in bounds]
    return Buffers.allocate(
        max_tokens=max((t for t, _ in sizes), default=0),
        max_rows=max((b - a for a, b in bounds), default=0),
        max_segments=max((s for _, s in sizes), default=0),
    )


def gather_shard(samples: Samples, segs: Segments, pl: Plan, cfg: PackConfig, a: int, b: int,
                 buf: Buffers) -> tuple[int, int]:
    """Fill `buf` with rows a..b; return (tokens, cu_seqlens entries)."""
    if samples.token_chunks is not None:
        seg_chunk, seg_local = _chunk_positions(samples, segs)
        has = samples.label_chunks is not None
        return gather_rows_chunked(
            samples.token_chunks, samples.label_chunks if has else samples.token_chunks, has,
            seg_chunk, seg_local, pl.order, pl.row_starts, segs.sample, segs.length,
            segs.offset, a, b, cfg.max_len, cfg.pad, cfg.pad_id, buf.ids, buf.labels, buf.pos,
            buf.row_offsets, buf.cu, buf.cu_offsets, buf.sample, buf.sample_offset,
            buf.sample_row_offsets, buf.loss,
        )
    labels = samples.labels if samples.labels is not None else samples.tokens
    return gather_rows(
        samples.tokens, labels, samples.labels is not None, pl.order, pl.row_starts,
        segs.sample, segs.start, segs.length, segs.offset, a, b, cfg.max_len, cfg.pad,
        cfg.pad_id, buf.ids, buf.labels, buf.pos, buf.row_offsets, buf.cu, buf.cu_offsets,
        buf.sample, buf.sample_offset, buf.sample_row_offsets, buf.loss,
    )


def _chunk_positions(samples: Samples, segs: Segments) -> tuple[np.ndarray, np.ndarray]:
    """(chunk, start within the chunk) of every segment, computed once per Segments."""
    cached = getattr(segs, "_chunk_positions", None)
    if cached is None:
        chunk = np.searchsorted(samples.chunk_starts, segs.start, side="right") - 1
        local = segs.start - samples.chunk_starts[chunk]
        cached = (chunk.astype(np.int64), local.astype(np.int64))
        segs._chunk_positions = cached
    return cached


def gather_all(samples: Samples, segs: Segments, pl: Plan, cfg: PackConfig) -> Buffers:
    """Every row in one set of buffers: the in-memory pack, for benchmarks and library users."""
    bounds = [(0, pl.num_rows)]
    buf = _allocate(pl, segs, cfg, bounds)
    gather_shard(samples, segs, pl, cfg, 0, pl.num_rows, buf)
    return buf


def write_shards(samples: Samples, segs: Segments, pl: Plan, cfg: PackConfig, out_dir: Path,
                 progress: Progress | None = None, workers: int | None = None) -> list[dict]:
    """Write every shard of the plan into `out_dir`; return their manifest entries in order."""
    bounds = shard_bounds(pl.num_rows, cfg.rows_per_shard())
    width = max(5, len(str(len(bounds))))
    workers = workers or default_workers()
    n_buffers = 2 if workers > 1 and len(bounds) > 1 else 1
    buffers = [_allocate(pl, segs, cfg, bounds) for _ in range(n_buffers)]
    entries: list[dict] = []
    pending: list[Future | None] = [None] * n_buffers

    def finish(future: Future) -> None:
        entries.append(future.result())
        if progress:
            progress("write", bounds[len(entries) - 1][1], pl.num_rows)

    def write(i: int, buf: Buffers, rows: int, tokens: int, cu_entries: int) -> dict:
        name = f"shard-{i:0{width}d}.arrow"
        path = out_dir / name
        entry = write_shard(path, shard_batch(buf, rows, tokens, cu_entries), cfg.hash)
        syncs.append(syncer.submit(fsync_file, path, drop_cache=True))
        segments = int(buf.sample_row_offsets[rows])
        return {"file": name, "rows": rows, "tokens": tokens, "segments": segments,
                "loss_tokens": int(buf.loss[:rows].sum()), **entry}

    syncs: list[Future] = []
    with ThreadPoolExecutor(max_workers=1) as pool, ThreadPoolExecutor(max_workers=1) as syncer:
        try:
            for i, (a, b) in enumerate(bounds):
                slot = i % n_buffers
                if pending[slot] is not None:  # the buffer is still being written
                    finish(pending[slot])
                    pending[slot] = None
                buf = buffers[slot]
                tokens, cu_entries = gather_shard(samples, segs, pl, cfg, a, b, buf)
                if n_buffers == 1:
                    finish(pool.submit(write, i, buf, b - a, tokens, cu_entries))
                else:
                    pending[slot] = pool.submit(write, i, buf, b - a, tokens, cu_entries)
            for k in range(len(bounds), len(bounds) + n_buffers):
                future = pending[k % n_buffers]
                if future is not None:
                    finish(future)
                    pending[k % n_buffers] = None
            for future in syncs:
                future.result()
        finally:
            for future in pending + syncs:
                if future is not None:
                    future.cancel()
    return entries
