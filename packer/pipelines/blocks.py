"""Block packing: the driver of the pipeline that every engine runs, one block of input per task.

With `block_size` set, the inputs are cut into blocks that follow the files (`packer.read.blocks`
says where a block ends); the cut depends on the files and `block_size` only, so every engine,
with any number of workers, writes the same bytes.

Stages, each a plain function an engine runs where it likes (`packer.engines`):

1. `scan_file` (`packer.read.blocks`), one per file: the blocks and their sample counts (Parquet
   and Arrow from metadata; JSONL counts its non-blank lines, without parsing them). The driver
   numbers the samples globally from these counts, so `sample_index` means the same as with one
   plan.
   A mixture (`packer.pipelines.mixture.blocks`) then reads every block's lengths and
   chooses its samples once, for all blocks.
2. `pack_block` (`packer.pipelines.block_task`), one per block: read, validate, plan, write the
   rows that are full enough as shards, spill the samples of the under-filled tail rows; only
   their lengths go back to the driver, with the block's `Stats` and length histogram.
3. The driver plans every spilled sample together (by block, then position) and `write_tail`
   tasks (`packer.pipelines.block_tail`) gather them from the spill files into tail shards.
4. The driver sums the blocks' `Stats`, writes the manifest last and commits the directory
   atomically, as every driver does.
"""

from __future__ import annotations

import shutil
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

from packer.config import PackConfig
from packer.contract.names import REJECTS
from packer.engines import Engine
from packer.errors import InputError, UsageError, option
from packer.interrupts import interrupt_once
from packer.pipelines import resume
from packer.pipelines.block_inputs import check_labels, sources_of
from packer.pipelines.block_tail import tail_task_name, tail_tasks, task_key, write_tail
from packer.pipelines.block_task import (
    DECREASING,
    BlockResult,
    block_task_name,
    decode_block,
    pack_block,
)
from packer.pipelines.result import PackResult, Stats
from packer.pipelines.run_files import WORK, LocalRun, open_store
from packer.pipelines.warmup import start_warming
from packer.planning import kernels as algorithms
from packer.planning.row_order import order_shards
from packer.planning.strategies import martello_toth_bound
from packer.read.assemble import counts_text
from packer.read.blocks import BlockSpec, FileScan, scan_file
from packer.read.samples import Rejects
from packer.storage.options import carried, carry_in
from packer.version import __version__
from packer.write import commit as output
from packer.write.manifest import build_manifest, write_rejects, write_split_labels
from packer.write.shards import gather_buffer_bytes

DEFAULT_BLOCK_SIZE = 64 << 20  # `--engine ray` without --block-size
_HISTOGRAM_MAX_LEN = 1 << 24  # beyond this L the driver does not build a dense histogram


def pack_blocks(
    engine: Engine,
    files: list[Path],
    out: Path,
    cfg: PackConfig,
    *,
    overwrite: bool,
    progress,
    workers: int,
    budget: int,
    t0: float,
    resume_run: bool = False,
    remote=None,
    mixture=None,
    held: list | None = None,
) -> PackResult:
    """Run the block pipeline on `engine` (opened by the caller); the atomic commit stays here.

    resume_run: adopt a dead run's temporary output and keep the tasks it finished
    (`packer.pipelines.resume`). remote: the output on a store (`packer.write.remote`): the
    tasks upload their files beside it and the driver builds only the manifest and the small
    files in `out`, for `remote.commit` (`packer.pipelines.run_files`). mixture: a
    `packer.pipelines.mixture.blocks.BlockMixture`: every block packs the samples the
    mixture chose from it. held: build the output, manifest included, but leave it in its
    temporary directory, appending (tmp, out, synced files) for the caller to commit (a
    mixture's validation and training outputs are both built before either is committed)."""
    if cfg.block_size is None:
        cfg = replace(cfg, block_size=DEFAULT_BLOCK_SIZE)
    # the local engine runs the tasks here: their kernels load (or compile) in the background
    # while the inputs are scanned, the records read and the first block read
    # (`packer.pipelines.warmup`); a second Ctrl-C is ignored while the warm-up is joined
    with interrupt_once():
        warming = start_warming(cfg.strategy) if cfg.engine == "local" else None
        try:
            return _pack_blocks(
                engine,
                files,
                out,
                cfg,
                overwrite,
                progress,
                workers,
                budget,
                t0,
                resume_run,
                remote,
                mixture,
                held,
            )
        finally:
            if warming is not None:
                warming.stop()


def _pack_blocks(
    engine,
    files,
    out,
    cfg,
    overwrite,
    progress,
    workers,
    budget,
    t0,
    resume_run,
    remote,
    mixture,
    held,
) -> PackResult:
    t = time.perf_counter()
    timings: dict[str, float] = {"engine_start": t - t0}
    scans, specs = _scan(engine, files, cfg, budget)
    timings["scan"] = time.perf_counter() - t
    key = resume.run_key(cfg, scans, mixture.key() if mixture is not None else None)
    if remote is None:
        tmp = resume.open_work(out, key, resume_run)
        place = LocalRun(str(tmp))
    else:
        place = open_store(remote, key, resume_run)
        tmp = output.start(out)
    with output.building(tmp, out), _discarded_on_failure(remote):
        place.start(key)
        t = time.perf_counter()
        worker_cpus = engine.task_workers(workers)
        takes = None
        if mixture is not None:  # the length pass, then one global choice
            memory = block_memory(specs, budget, cfg.max_len)
            takes = mixture.choose(engine, scans, specs, cfg, memory, progress)
            timings["lengths"] = time.perf_counter() - t
            t = time.perf_counter()
        results, reused = _run_blocks(
            engine, specs, cfg, place, worker_cpus, budget, progress, takes, mixture
        )
        timings["blocks"] = time.perf_counter() - t
        t = time.perf_counter()
        if progress:
            progress("plan", 0, 0)
        has_labels = _has_labels(specs, results, cfg, mixture)
        total, rejects, hist = _totals(results, cfg)
        width = specs[0].width if specs else 5
        tasks, tail_row_count, moved = tail_tasks(results, cfg, len(specs), width)
        if progress:
            progress("plan", 1, 1)
        bounds = mixture.bounds if mixture is not None else None
        tail_entries, tails_reused = _run_tails(engine, tasks, cfg, place, worker_cpus, bounds)
        timings["tails"] = time.perf_counter() - t
        t = time.perf_counter()
        tail_shards = [e for es in tail_entries for e in es]
        shards = [e for r in results for e in r.shards] + tail_shards
        shards = order_shards(shards, cfg.row_order, cfg.seed)  # the order readers follow
        tails = Stats(
            cfg.max_len,
            rows=tail_row_count,
            pad_tokens=sum(s["tokens"] for s in tail_shards) - moved,
            loss_tokens=sum(s["loss_tokens"] for s in tail_shards),
        )
        stats = replace(
            total + tails,
            blocks=len(specs),
            tail_rows=tail_row_count,
            tokens_moved=moved,
            lower_bound_l2=martello_toth_bound(hist, cfg.max_len) if hist is not None else None,
            global_rows=_global_rows(hist, cfg),
        ).as_dict()
        sources = sources_of(scans, specs, results, has_labels)
        if remote is not None:
            remote.on_store.update(s["file"] for s in shards)
        extra = mixture.manifest() if mixture is not None else {}
        _commit(tmp, out, cfg, sources, results, stats, shards, rejects, overwrite, extra, held)
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
        tasks_reused=reused + tails_reused,
        tasks_run=len(specs) + len(tasks) - reused - tails_reused,
        mixture=mixture.report if mixture is not None else None,
    )


def _scan(engine: Engine, files: list[Path], cfg: PackConfig, budget: int):
    """Stage 1: (the scan of every file, the blocks numbered in input order)."""
    labels_column = cfg.labels_column or None
    columns = [cfg.input_column] + ([labels_column] if labels_column else [])
    settings = carried()
    scans = engine.map(
        scan_task, [(settings, i, str(p), cfg.block_size, columns) for i, p in enumerate(files)]
    )
    for scan in scans:
        if scan.version != __version__:
            raise UsageError(
                f"a worker runs packer {scan.version}, the driver {__version__}: install "
                "the same packer on every node"
            )
    specs = plan_blocks(scans)
    _check_memory(specs, budget)
    return scans, specs


@contextmanager
def _discarded_on_failure(remote) -> Iterator[None]:
    """A run that fails (not a kill) leaves nothing on a store, as locally."""
    try:
        yield
    except BaseException:
        if remote is not None:
            remote.delete_run()
        raise


def _run_blocks(
    engine: Engine,
    specs,
    cfg: PackConfig,
    place,
    worker_cpus: int,
    budget: int,
    progress,
    takes=None,
    mixture=None,
) -> tuple[list[BlockResult], int]:
    """Stage 2: one `pack_block` task per block without a sound completion record, reporting
    the bytes read as blocks finish: (every block's result, how many were kept). `takes`: a
    mixture's choice from every block (a kept record must name the same)."""
    total_bytes = sum(s.nbytes for s in specs) or 1
    records = place.kept([block_task_name(s) for s in specs])
    takes = takes if takes is not None else [None] * len(specs)
    results: list[BlockResult | None] = [
        _kept_block(records.get(block_task_name(s)), s, take) for s, take in zip(specs, takes)
    ]
    todo = [k for k, r in enumerate(results) if r is None]
    done = [sum(s.nbytes for s, r in zip(specs, results) if r is not None)]

    def on_block(i: int) -> None:
        done[0] += specs[todo[i]].nbytes
        if progress:
            progress("read", done[0], total_bytes)

    if progress:
        progress("read", done[0], total_bytes)
    cfgs = [mixture.block_cfg(s, cfg) if mixture is not None else cfg for s in specs]
    ran = engine.map(
        pack_block,
        [(specs[k], cfgs[k], place, worker_cpus, takes[k]) for k in todo],
        on_done=on_block,
        memory=block_memory(specs, budget, cfg.max_len),
    )
    for k, r in zip(todo, ran):
        results[k] = r
    return results, len(specs) - len(todo)


def _kept_block(record: dict | None, spec: BlockSpec, take=None) -> BlockResult | None:
    """A block's result from its completion record, or None when it must run."""
    if record is None or record.get("block") != spec.block or record.get("version") != __version__:
        return None
    if record.get("take") != (take.digest if take is not None else None):
        return None
    try:
        return decode_block(record)
    except (KeyError, TypeError, ValueError):
        return None


def _run_tails(engine: Engine, tasks, cfg: PackConfig, place, worker_cpus: int, bounds=None):
    """Stage 3: one `write_tail` task per tail shard without a sound completion record:
    (every task's shard entries, how many were kept)."""
    entries: list[list[dict] | None] = []
    records = place.kept([tail_task_name(task) for task in tasks])
    for task in tasks:
        record = records.get(tail_task_name(task))
        keep = record is not None and record.get("key") == task_key(task)
        entries.append(record["shards"] if keep else None)
    todo = [k for k, e in enumerate(entries) if e is None]
    ran = engine.map(write_tail, [(tasks[k], cfg, place, worker_cpus, bounds) for k in todo])
    for k, e in zip(todo, ran):
        entries[k] = e
    return entries, len(tasks) - len(todo)


def _commit(
    tmp: Path, out: Path, cfg, sources, results, stats, shards, rejects, overwrite, extra, held
):
    """rejects.jsonl, split_labels.jsonl and the manifest (with `extra`'s entries), then the
    atomic commit (left to the caller with `held`)."""
    entry = None
    if cfg.on_error == "skip":
        entry = write_rejects(
            types.SimpleNamespace(rejects=rejects, num_rejected=rejects.total), tmp, cfg.hash
        )
        assert entry["file"] == REJECTS
    points = [r.split_labels for r in results if r.split_labels is not None]
    split_labels = write_split_labels(np.concatenate(points) if points else None, tmp, cfg.hash)
    shutil.rmtree(tmp / WORK, ignore_errors=True)  # records kept until here: a kill resumes
    manifest = build_manifest(
        cfg,
        types.SimpleNamespace(sources=sources),
        stats,
        shards,
        entry,
        split_labels=split_labels,
    )
    manifest.update(extra)
    # every shard was flushed by `write_shards` before its task's completion record was
    # written (a kept record: by the killed run's task): the commit flushes the rest
    synced = [s["file"] for s in shards]
    if held is not None:
        output.write_manifest(tmp, manifest)
        held.append((tmp, out, synced))
        return
    output.finish(tmp, out, manifest, overwrite, synced=synced)


def scan_task(settings: dict, *args) -> FileScan:
    """Stage 1 for one file, with the driver's store settings (a remote input is read in
    place by the task, on whichever node it runs)."""
    carry_in(settings)
    return scan_file(*args)


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


def _has_labels(specs: list[BlockSpec], results, cfg: PackConfig, mixture) -> bool:
    """Whether the output's samples have labels: the files must agree, or with a mixture the
    files of each source (sources may differ: one without labels trains its tokens)."""
    groups = mixture.source_blocks(specs) if mixture is not None else [range(len(specs))]
    checked = [
        check_labels([specs[k] for k in g], [results[k] for k in g], cfg.labels_column or None)
        for g in groups
    ]
    return any(checked)


def _global_rows(hist: np.ndarray | None, cfg: PackConfig) -> int | None:
    """Rows of one global plan of every segment, from the length histogram alone."""
    if hist is None or cfg.strategy not in DECREASING:
        return None
    kernel = {
        "bfd": algorithms.best_fit_groups,
        "ffd": algorithms.first_fit_groups,
        "histogram": algorithms.worst_fit_groups,
    }[cfg.strategy]
    return int(kernel(hist, cfg.max_len)[-1])


def _totals(results: list[BlockResult], cfg: PackConfig):
    """(the blocks' `Stats` summed, their rejects, the histogram of every segment's length or
    None beyond `_HISTOGRAM_MAX_LEN`); raises when no sample is left."""
    total = sum((r.stats for r in results), Stats(cfg.max_len))
    rejects = Rejects(
        records=[record for r in results for record in r.rejects],
        counts=dict(total.rejected_by_reason),
    )
    read = total.samples_in
    kept = sum(r.samples for r in results)
    if read == 0:
        raise InputError("the dataset is empty: the inputs hold no samples")
    if kept == 0:
        raise InputError(
            f"the dataset is empty: all {read} samples were rejected ({counts_text(rejects)})"
        )
    hist = None
    if cfg.max_len <= _HISTOGRAM_MAX_LEN:
        hist = np.zeros(cfg.max_len + 1, np.int64)
        for r in results:
            np.add.at(hist, r.hist[0], r.hist[1])
    return total, rejects, hist
