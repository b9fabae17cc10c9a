"""Block packing: the pipeline that both engines run, one block of input per task.

With `block_size` set, the inputs are cut into blocks that follow the files (`packer.read.blocks`
says where a block ends); the cut depends on the files and `block_size` only, so every engine,
with any number of workers, writes the same bytes.

Stages, each a plain function an engine runs where it likes (`packer.engines`):

1. `scan_file` (`packer.read.blocks`), one per file: the blocks and their sample counts (Parquet and Arrow from
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

from packer.config import PackConfig
from packer.contract.names import REJECTS
from packer.engines import open_engine
from packer.errors import InputError, UsageError, option
from packer.planning import kernels as algorithms
from packer.planning.overlength import Segments, resolve
from packer.planning.strategies import Plan, lower_bound, martello_toth_bound, plan
from packer.read.assemble import counts_text
from packer.read.blocks import BlockSpec, FileScan, block_samples, scan_file
from packer.read.samples import Rejects, Samples, SourceFile, as_chunks
from packer.version import __version__
from packer.write import commit as output
from packer.write.manifest import build_manifest, split_points, write_rejects, write_split_labels
from packer.write.shards import gather_buffer_bytes, segment_sources, write_shards

DEFAULT_BLOCK_SIZE = 64 << 20  # `--engine ray` without --block-size
# A row with more than L // TAIL_FREE free tokens is a tail row: its samples are packed again
# with every block's tails. 1/512 of L keeps the rows within 0.01 % of one global plan on the
# benchmarks of docs/scale.md while moving a few percent of the tokens.
TAIL_FREE = 512
TAIL_GROUP = 1024  # blocks whose tails are planned together (and read by one tail task at most)
WORK = ".blocks"  # inside the temporary output: spill files and task work directories
_DECREASING = ("bfd", "ffd", "histogram")
_HISTOGRAM_MAX_LEN = 1 << 24  # beyond this L the driver does not build a dense histogram


# --------------------------------------------------------------------------------------------
# Stage 2: one block


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
    split_labels: np.ndarray | None = None  # write.manifest.split_points of the block


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
    from packer.workers import configure

    t0 = time.perf_counter()
    configure(workers)
    tmp_dir = Path(tmp)
    rejects = Rejects() if cfg.on_error == "skip" else None
    samples, src = block_samples(spec, cfg, rejects)
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
    segs = resolve(
        samples.lengths,
        cfg.max_len,
        cfg.overlength,
        starts=samples.offsets[:-1],
        locate=samples.locate,
    )
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
    chunks, label_chunks, seg_chunk, seg_local = segment_sources(samples, segs)
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


def block_memory(specs: list[BlockSpec], budget: int, max_len: int) -> int:
    """Bytes one block task reserves: its largest block's decoded table and flat copy (what
    `_check_memory` sizes against half the budget) and the two gather buffers, at most the
    whole `--memory-budget`.

    Reserving the budget itself (8 GiB by default) would let a node of 32 cores and 128 GiB run
    a dozen 64 MiB blocks at once where it could run 32.
    """
    largest = max((spec.decoded for spec in specs), default=0)
    return min(budget, 2 * largest + gather_buffer_bytes(max_len))


def _check_memory(specs: list[BlockSpec], budget: int) -> None:
    for spec in specs:
        if 2 * spec.decoded > budget:
            raise UsageError(
                f"a block of {spec.path} decodes to about {spec.decoded >> 20} MiB, more than "
                f"half of the {option('memory_budget')} ({budget >> 20} MiB); pass a smaller "
                f"{option('block_size')} (a Parquet row group is never cut) or a larger "
                f"{option('memory_budget')}"
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
    from packer.pipeline import PackResult  # pipeline dispatches to this module

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
                memory=block_memory(specs, budget, cfg.max_len),
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
                rejects = write_rejects(
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
            f"({counts_text(totals.rejects)})"
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
