"""Stage 2 of the block pipeline: one block, read, planned and written by one task.

`pack_block` reads and validates its block (the local reader's checks and one-line errors),
resolves over-length samples, plans them with the configured strategy and writes the rows that
are full enough as shards straight into the output's temporary directory. The samples of the
under-filled tail rows are spilled to a small file; only their lengths go back to the driver
(`packer.pipelines.blocks`), with the block's `Stats` and length histogram.

A task writes into a private directory and publishes its files (renamed into the temporary
output, or uploaded beside a remote output: `packer.pipelines.run_files`), so a task retried
after its worker died writes the same bytes again.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.config import PackConfig
from packer.pipelines import resume
from packer.pipelines.result import Stats
from packer.pipelines.run_files import spill_name
from packer.planning.overlength import Segments, resolve
from packer.planning.row_order import BLOCK, order_rows
from packer.planning.strategies import Plan, plan
from packer.read.blocks import BlockSpec, block_samples
from packer.read.samples import Rejects, Samples
from packer.storage import display
from packer.version import __version__
from packer.write.manifest import split_points
from packer.write.shard_file import arrow_array
from packer.write.shards import SHARDS, segment_sources, write_shards
from packer.write.source_column import with_source_column

# A row with more than L // TAIL_FREE free tokens is a tail row: its samples are packed again
# with every block's tails. 1/512 of L keeps the rows within 0.01 % of one global plan on the
# benchmarks of docs/scale.md while moving a few percent of the tokens.
TAIL_FREE = 512
DECREASING = ("bfd", "ffd", "histogram")  # strategies that fill rows from the longest down


@dataclass
class BlockResult:
    """What a block task sends back to the driver: counts and tail lengths, no tokens."""

    block: int
    has_labels: bool
    # the block's figures: its full rows, and the pad and loss tokens of their shards
    stats: Stats
    rejects: list[dict]
    shards: list[dict]
    tail_lengths: np.ndarray  # int64: lengths of the spilled segments, in spill order
    hist: tuple[np.ndarray, np.ndarray]  # (segment lengths, counts)
    seconds: float
    version: str = __version__
    split_labels: np.ndarray | None = None  # write.manifest.split_points of the block

    @property
    def rows(self) -> int:
        """Samples read, rejected ones included."""
        return self.stats.samples_in

    @property
    def samples(self) -> int:
        """Samples kept."""
        return self.stats.samples_packed + self.stats.dropped


@dataclass
class BlockTake:
    """A mixture's choice from one block (`packer.pipelines.mixture.blocks`): the positions of
    the block's kept samples to pack, in selection order (a repeat is a second segment of the
    same sample), and the sources' first global sample indices (`bounds`), from which the
    shards' `sample_source` column is read off `sample_index`."""

    positions: np.ndarray  # int64
    bounds: np.ndarray  # int64, sources + 1
    digest: str  # of positions and bounds: a resumed block is kept only for the same take
    counts_dropped: bool = True  # the training output counts `drop`'s samples, as one plan does


def block_seed(seed: int, block: int) -> int:
    """The seed of one block's plan (ff-shuffle), from the configured seed and its number."""
    return int(np.random.SeedSequence([seed, block]).generate_state(1)[0])


def tail_rows(pl: Plan, lengths: np.ndarray, cfg: PackConfig) -> np.ndarray:
    """Which rows of a block's plan are under-filled tails (bool per row)."""
    n = pl.num_rows
    tail = np.zeros(n, bool)
    if n == 0:
        return tail
    if cfg.strategy in DECREASING:
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


def pack_block(
    spec: BlockSpec, cfg: PackConfig, place, workers: int, take: BlockTake | None = None
) -> BlockResult:
    """Stage 2 for one block: read, validate, resolve, plan, write full rows, spill tails into
    a private directory, publish them (`place`: `packer.pipelines.run_files`), then the block's
    completion record. `take`: a mixture's samples of this block, instead of all of them."""
    from packer.workers import configure

    configure(workers)
    place.enter()
    work = place.scratch(block_task_name(spec))
    try:
        result = _pack_block(spec, cfg, work, workers, take)
        files = [listed_file(s) for s in result.shards]
        spill = work / spill_name(spec.block, spec.width)
        if result.tail_lengths.size:
            files.append(resume.file_entry(spill, cfg.hash))
        else:
            spill.unlink(missing_ok=True)  # nothing spilled: nothing for a tail task to read
        _fault_point()
        place.publish(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    record = encode_block(result)
    if take is not None:
        record["take"] = take.digest
    place.save(block_task_name(spec), files, record)
    return result


def block_task_name(spec: BlockSpec) -> str:
    return f"b{spec.block:0{spec.width}d}"


def listed_file(shard: dict) -> dict:
    """A shard's manifest entry as a completion record lists it: name, size, hash."""
    return {"name": shard["file"], **{k: v for k, v in shard.items() if k != "file"}}


def encode_block(r: BlockResult) -> dict:
    """A `BlockResult` as JSON values, for its completion record."""
    return {
        "block": r.block,
        "has_labels": r.has_labels,
        "stats": asdict(r.stats),
        "rejects": r.rejects,
        "shards": r.shards,
        "tail_lengths": r.tail_lengths.tolist(),
        "hist": [r.hist[0].tolist(), r.hist[1].tolist()],
        "seconds": r.seconds,
        "version": r.version,
        "split_labels": None if r.split_labels is None else r.split_labels.tolist(),
    }


def decode_block(d: dict) -> BlockResult:
    """The `BlockResult` a completion record holds (`encode_block` read back)."""
    split = d["split_labels"]
    return BlockResult(
        block=d["block"],
        has_labels=d["has_labels"],
        stats=Stats(**d["stats"]),
        rejects=d["rejects"],
        shards=d["shards"],
        tail_lengths=np.asarray(d["tail_lengths"], np.int64),
        hist=(np.asarray(d["hist"][0], np.int64), np.asarray(d["hist"][1], np.int64)),
        seconds=d["seconds"],
        version=d["version"],
        split_labels=None if split is None else np.asarray(split, np.int64).reshape(-1, 3),
    )


def _pack_block(
    spec: BlockSpec, cfg: PackConfig, work: Path, workers: int, take: BlockTake | None
) -> BlockResult:
    t0 = time.perf_counter()
    rejects = Rejects() if cfg.on_error == "skip" else None
    samples, src = block_samples(spec, cfg, rejects)
    common = {
        "block": spec.block,
        "has_labels": src.has_labels,
        "rejects": rejects.records if rejects else [],
    }
    if samples is None or (take is not None and take.positions.size == 0):
        dropped = 0 if samples is None or not take.counts_dropped else _over_dropped(samples, cfg)
        stats = Stats(cfg.max_len, samples_in=spec.rows, dropped=dropped, **_rejected(rejects))
        empty = np.zeros(0, np.int64)
        return BlockResult(
            **common,
            stats=stats,
            shards=[],
            tail_lengths=empty,
            hist=(empty, empty.copy()),
            seconds=time.perf_counter() - t0,
        )
    pos = take.positions if take is not None else np.arange(samples.num_samples)
    segs = resolve(
        samples.lengths[pos],
        cfg.max_len,
        cfg.overlength,
        starts=samples.offsets[:-1][pos],
        locate=lambda i: samples.locate(int(pos[i])),
        counted=f" of the {spec.rows:,} in block {spec.block} ({display(spec.path)})",
    )
    segs.sample = samples.index[pos][segs.sample]
    pl = plan(
        segs.length,
        cfg.max_len,
        cfg.strategy,
        seed=block_seed(cfg.seed, spec.block),
        window=cfg.window,
    )
    tail = tail_rows(pl, segs.length, cfg)
    full = order_rows(_keep_rows(pl, ~tail), cfg.row_order, cfg.seed, BLOCK, spec.block)
    tails = _keep_rows(pl, tail)
    files = SHARDS if take is None else with_source_column(SHARDS, take.bounds)
    shards, spill = _write_block(spec, samples, segs, full, tails, cfg, work, workers, files)
    lengths, counts = np.unique(segs.length, return_counts=True)
    stats = _block_stats(spec, samples, segs, full, shards, spill, rejects, cfg)
    if take is not None:  # the chosen samples, repeats counted; `drop`'s own as in any run
        dropped = _over_dropped(samples, cfg) if take.counts_dropped else 0
        stats = replace(stats, samples_packed=int(pos.size), dropped=dropped)
    return BlockResult(
        **common,
        stats=stats,
        shards=shards,
        tail_lengths=spill,
        hist=(lengths.astype(np.int64), counts.astype(np.int64)),
        seconds=time.perf_counter() - t0,
        split_labels=split_points(samples, segs),
    )


def _over_dropped(samples: Samples, cfg: PackConfig) -> int:
    """Over-length samples `overlength` drop leaves out of the block (a mixture never chooses
    them)."""
    if cfg.overlength != "drop":
        return 0
    return int((samples.lengths > cfg.max_len).sum())


def _rejected(rejects: Rejects | None) -> dict:
    return {
        "rejected": rejects.total if rejects else 0,
        "rejected_by_reason": dict(rejects.counts) if rejects else {},
    }


def _block_stats(spec, samples, segs, full, shards, spill, rejects, cfg: PackConfig) -> Stats:
    """The block's figures; its rows and pad tokens are those of its full rows only."""
    tokens = int(segs.length.sum())
    return Stats(
        cfg.max_len,
        samples_in=spec.rows,
        samples_packed=samples.num_samples - segs.dropped,
        **_rejected(rejects),
        dropped=segs.dropped,
        truncated=segs.truncated,
        split=segs.split,
        segments=segs.num_segments,
        tokens_in=samples.num_tokens,
        tokens=tokens,
        tokens_removed=segs.tokens_removed,
        pad_tokens=sum(s["tokens"] for s in shards) - (tokens - int(spill.sum())),
        loss_tokens=sum(s["loss_tokens"] for s in shards),
        rows=full.num_rows,
    )


def _write_block(
    spec: BlockSpec, samples, segs, full: Plan, tails: Plan, cfg, work, workers, files=SHARDS
):
    """Write the full rows as shards and spill the tail rows' segments into `work`:
    (shards, tail lengths)."""
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
        files=files,
    )
    spill = _spill(samples, segs, tails.order, work / spill_name(spec.block, spec.width))
    return shards, spill


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
    chunks, label_chunks, seg_chunk, seg_local = segment_sources(samples, segs)
    lengths = segs.length[order]
    offsets = np.zeros(order.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = [chunks[seg_chunk[s]][seg_local[s] : seg_local[s] + segs.length[s]] for s in order]
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
    starts = _arrow(offsets, np.int64)
    columns = {
        "tokens": pa.LargeListArray.from_arrays(starts, _arrow(flat, np.int32)),
        "sample": _arrow(segs.sample[order], np.int64),
        "offset": _arrow(segs.offset[order], np.int32),
    }
    if samples.has_labels:
        labs = [
            label_chunks[seg_chunk[s]][seg_local[s] : seg_local[s] + segs.length[s]] for s in order
        ]
        flat_labels = np.concatenate(labs) if labs else np.zeros(0, np.int32)
        columns["labels"] = pa.LargeListArray.from_arrays(starts, _arrow(flat_labels, np.int32))
    batch = pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return lengths.astype(np.int64)


def _arrow(values: np.ndarray, dtype) -> pa.Array:
    """`values` in `dtype` as an Arrow array over their own memory (not `pa.array`, which
    imports pandas: a quarter of a second of every block run's fixed cost)."""
    return arrow_array(np.ascontiguousarray(values, dtype))
