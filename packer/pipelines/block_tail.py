"""Stage 3 of the block pipeline: the under-filled tail rows of every block, packed together.

The driver (`packer.pipelines.blocks`) plans the spilled segments of every `TAIL_GROUP`
consecutive blocks together (`tail_tasks`, by block, then position), and `write_tail` tasks
gather them from the spill files into tail shards. Those samples are the only tokens that move
between workers (`tokens_moved` in the stats).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer import hashing
from packer.config import PackConfig
from packer.contract.shards import numpy_view
from packer.pipelines.block_task import BlockResult, block_seed, listed_file
from packer.pipelines.run_files import spill_name
from packer.planning import row_order
from packer.planning.overlength import Segments
from packer.planning.strategies import Plan, plan
from packer.read.samples import Samples, as_chunks
from packer.write.shards import SHARDS, write_shards
from packer.write.source_column import with_source_column

TAIL_GROUP = 1024  # blocks whose tails are planned together (and read by one tail task at most)


@dataclass
class TailTask:
    """One tail shard: its rows as (block, position in the block's spill) per segment."""

    shard: int
    blocks: np.ndarray  # int64 per segment
    positions: np.ndarray  # int64 per segment
    row_starts: np.ndarray  # int64[rows + 1]
    width: int = 5
    block_width: int = 5


def write_tail(
    task: TailTask, cfg: PackConfig, place, workers: int, bounds: np.ndarray | None = None
) -> list[dict]:
    """Gather the tail rows of one shard from the spill files and write the shard (`place`:
    where the run's files are, `packer.pipelines.run_files`); then the task's record.
    `bounds`: a mixture's sources' first sample indices, for the `sample_source` column."""
    from packer.workers import configure

    configure(workers)
    place.enter()
    spills = place.scratch(f"{tail_task_name(task)}-in")
    try:
        entries = _write_tail(task, cfg, place, workers, spills, bounds)
    finally:
        shutil.rmtree(spills, ignore_errors=True)
    files = [listed_file(e) for e in entries]
    place.save(tail_task_name(task), files, {"key": task_key(task), "shards": entries})
    return entries


def _write_tail(task: TailTask, cfg: PackConfig, place, workers: int, spills: Path, bounds):
    needed = np.unique(task.blocks)
    chunk_of = {int(b): k for k, b in enumerate(needed.tolist())}
    tok, lab, starts = [], [], [0]
    tables = [_read_spill(place.spill(spill_name(b, task.block_width), spills)) for b in needed]
    # a mixture's source without labels trains its tokens, beside one with labels
    labelled = any("labels" in table.schema.names for table in tables)
    for table in tables:
        values = numpy_view(table.column("tokens").values)
        tok.append(values)
        if labelled:
            has = "labels" in table.schema.names
            lab.append(numpy_view(table.column("labels").values) if has else values)
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
        offsets = numpy_view(table.column("tokens").offsets)
        seg_start[mine] = starts[k] + offsets[pos]
        seg_len[mine] = offsets[pos + 1] - offsets[pos]
        seg_sample[mine] = numpy_view(table.column("sample"))[pos]
        seg_offset[mine] = numpy_view(table.column("offset"))[pos]
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
    work = place.scratch(tail_task_name(task))
    name = f"shard-t{task.shard:0{task.width}d}.arrow"
    try:
        files = SHARDS if bounds is None else with_source_column(SHARDS, bounds)
        entries = write_shards(
            samples, segs, pl, one, work, workers=workers, names=lambda _: name, files=files
        )
        place.publish(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return entries


def _read_spill(path: Path) -> pa.RecordBatch:
    """A spill file's one record batch, read through numpy views (`numpy_view`: Arrow's own
    `to_numpy` imports pandas, a quarter of a second of a run's fixed cost)."""
    with pa.memory_map(str(path)) as source:
        reader = pa.ipc.open_file(source)
        if reader.num_record_batches == 1:
            return reader.get_batch(0)
        return reader.read_all().combine_chunks().to_batches()[0]


def tail_task_name(task: TailTask) -> str:
    return f"t{task.shard:0{task.width}d}"


def task_key(task: TailTask) -> str:
    """A digest of what a tail task gathers: its record is kept only for the same rows."""
    digest = hashing.new("xxh3_128")
    for a in (task.blocks, task.positions, task.row_starts):
        digest.update(np.ascontiguousarray(a, np.int64).tobytes())
        digest.update(b"|")
    digest.update(f"{task.width},{task.block_width}".encode())
    return digest.hexdigest()


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
        pl = row_order.order_rows(pl, cfg.row_order, cfg.seed, row_order.TAIL_GROUP, g)
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
