"""The all-in-memory writer: every record batch of the plan gathered into its own slice of one
set of buffers sized for the whole output, each batch a zero-copy view of them, so that the
output's columns are the only memory that grows with the tokens (`pack_dataset`'s result)."""

from __future__ import annotations

import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from packer.config import PackConfig
from packer.planning.overlength import Segments
from packer.planning.strategies import Plan
from packer.read.samples import Samples
from packer.write.gather import Buffers, shard_sizes
from packer.write.seq_lengths import packed_batch
from packer.write.shards import batch_bounds, gather_batch


def _fresh(n: int, dtype) -> np.ndarray:
    """An uninitialised array in its own anonymous mapping, without transparent huge pages.

    The output is the one large allocation of `pack_dataset`, written once. Under THP's
    `defrag=madvise` (numpy advises huge pages for large arrays) first writes stalled in
    compaction: on the development VM a 100k-sample pack took 1.5-1.8 s with numpy's arrays
    and 0.8-1.1 s with these, and plain fills of 2 GiB 0.25-5.8 s against 0.9-1.4 s.
    """
    dtype = np.dtype(dtype)
    if n == 0 or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.empty(n, dtype)
    region = mmap.mmap(-1, n * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(region, dtype, count=n)  # keeps `region` alive


def _output_buffers(tokens: int, rows: int, segments: int) -> Buffers:
    """`Buffers.allocate`'s arrays, from `_fresh`."""
    return Buffers(
        ids=_fresh(tokens, np.int32),
        labels=_fresh(tokens, np.int32),
        pos=_fresh(tokens, np.int32),
        row_offsets=_fresh(rows + 1, np.int32),
        cu=_fresh(segments + rows, np.int32),
        cu_offsets=_fresh(rows + 1, np.int32),
        sample=_fresh(segments, np.int64),
        sample_offset=_fresh(segments, np.int32),
        sample_row_offsets=_fresh(rows + 1, np.int32),
        loss=_fresh(rows, np.int32),
    )


def gather_batches(
    samples: Samples, segs: Segments, pl: Plan, cfg: PackConfig, workers: int
) -> tuple[list[pa.RecordBatch], int, int]:
    """(record batches as `pack` writes them, loss tokens, tokens with padding).

    Every batch is gathered into its own slice of one set of buffers sized for the whole
    output, on `workers` threads (the kernel releases the GIL), and wrapped without a copy.
    """
    bounds = [(a, b) for _, a, b in batch_bounds(pl, cfg)]
    if not bounds:
        return [], 0, 0
    sizes = np.array(
        [
            shard_sizes(pl.order, pl.row_starts, segs.length, a, b, cfg.max_len, cfg.pad)
            for a, b in bounds
        ],
        np.int64,
    ).reshape(-1, 2)
    rows = np.array([b - a for a, b in bounds], np.int64)
    tok0 = np.concatenate(([0], np.cumsum(sizes[:, 0])))
    seg0 = np.concatenate(([0], np.cumsum(sizes[:, 1])))
    row0 = np.concatenate(([0], np.cumsum(rows)))
    cu0 = seg0 + row0
    big = _output_buffers(int(tok0[-1]), int(row0[-1]) + len(bounds), int(seg0[-1]))

    def one(k: int) -> tuple[pa.RecordBatch, int, int]:
        t, s, r, c, o = int(tok0[k]), int(seg0[k]), int(row0[k]), int(cu0[k]), int(row0[k]) + k
        n = int(rows[k])
        view = Buffers(
            ids=big.ids[t:],
            labels=big.labels[t:],
            pos=big.pos[t:],
            row_offsets=big.row_offsets[o : o + n + 1],
            cu=big.cu[c:],
            cu_offsets=big.cu_offsets[o : o + n + 1],
            sample=big.sample[s:],
            sample_offset=big.sample_offset[s:],
            sample_row_offsets=big.sample_row_offsets[o : o + n + 1],
            loss=big.loss[r : r + n],
        )
        a, b = bounds[k]
        tokens, cu_entries = gather_batch(samples, segs, pl, cfg, a, b, view)
        batch = packed_batch(view, n, tokens, cu_entries)
        return batch, int(view.loss[:n].sum()), tokens

    first = one(0)  # also builds the per-segment chunk lookup, once, before the threads
    if len(bounds) > 1 and workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            rest = list(pool.map(one, range(1, len(bounds))))
    else:
        rest = [one(k) for k in range(1, len(bounds))]
    done = [first, *rest]
    return [d[0] for d in done], sum(d[1] for d in done), sum(d[2] for d in done)
