"""One plan: every sample of the run read, resolved and planned together, then written.

In memory when the decoded input fits the memory budget; out of core otherwise (`read.cache`
streams the tokens to a memory-mapped cache and only the lengths stay in RAM). Both write the
same bytes. `pack_samples` (plan, write, commit) is also the second half of a repack.
"""

from __future__ import annotations

import time
from pathlib import Path

from packer.arguments import parse_size
from packer.config import PackConfig
from packer.contract.schema import CP_SCHEMA
from packer.errors import OutputError
from packer.interrupts import interrupt_once
from packer.pipelines.result import PackResult, Progress, stats_of
from packer.pipelines.warmup import start_warming
from packer.planning.cp import pad_to_multiple
from packer.planning.overlength import Segments, resolve
from packer.planning.row_order import order_plan_rows
from packer.planning.strategies import Plan, plan
from packer.read.assemble import read_samples
from packer.read.cache import (
    batch_bytes_for,
    default_budget,
    make_cache_dir,
    needs_out_of_core,
    remove_cache_dir,
    stream_samples,
)
from packer.read.progress import metering
from packer.read.samples import Samples
from packer.write import commit as output
from packer.write.cp_shards import cp_shard_files, cp_stats
from packer.write.manifest import build_manifest, split_points, write_rejects, write_split_labels
from packer.write.shards import write_shards


def plan_samples(samples: Samples, cfg: PackConfig) -> tuple[Segments, Plan, int | None]:
    """Resolve over-length samples and plan their rows, in `cfg.row_order`: (segments, plan,
    rows of one global plan when `cfg.window` is set). Shared by `pack` and `pack_dataset`."""
    segs = resolve(
        samples.lengths,
        cfg.max_len,
        cfg.overlength,
        starts=samples.offsets[:-1],
        locate=samples.locate,
    )
    if samples.index is not None:  # skipped samples keep their input numbering
        segs.sample = samples.index[segs.sample]
    lengths = pad_to_multiple(segs.length, cfg.segment_multiple)  # as they are without CP
    pl = plan(lengths, cfg.max_len, cfg.strategy, seed=cfg.seed, window=cfg.window)
    pl = order_plan_rows(pl, cfg.row_order, cfg.seed, cfg.window)
    global_rows = None
    if cfg.window is not None:
        global_rows = plan(lengths, cfg.max_len, cfg.strategy, seed=cfg.seed).num_rows
    return segs, pl, global_rows


def pack_one_plan(
    inputs: list[Path],
    out: Path,
    cfg: PackConfig,
    *,
    overwrite: bool,
    progress: Progress | None,
    workers: int,
    memory_budget: int | str | None,
    out_of_core: bool | None,
    t0: float,
) -> PackResult:
    """Read every input (in memory, or out of core when it would not fit `memory_budget`), plan
    all samples together and write them."""
    timings = {}
    on_file, on_bytes = _read_progress(inputs, progress)

    budget = parse_size(memory_budget) if memory_budget is not None else default_budget()
    labels_column = cfg.labels_column or None
    if out_of_core is None:
        columns = [cfg.input_column] + ([labels_column] if labels_column else [])
        out_of_core = needs_out_of_core(inputs, columns, budget)
    cache_dir = None
    # a second Ctrl-C, once the first is being acted on, is ignored: raised in a join of the
    # clean-up, it would leave threads (the warm-up's compiler, the readers) running at exit
    with interrupt_once():
        warming = start_warming(
            cfg.strategy
        )  # this run's kernels compile while reading (packer.pipelines.warmup)
        try:
            with metering(on_bytes):
                if out_of_core:
                    try:
                        cache_dir = make_cache_dir(out)
                    except OSError as exc:
                        raise OutputError(
                            f"cannot create a cache directory: {output.os_reason(exc)}",
                            where=str(out.parent),
                        ) from None
                    samples = stream_samples(
                        inputs,
                        cache_dir,
                        cfg.input_column,
                        labels_column,
                        progress=on_file,
                        on_error=cfg.on_error,
                        batch_bytes=batch_bytes_for(budget),
                    )
                else:
                    samples = read_samples(
                        inputs,
                        cfg.input_column,
                        labels_column,
                        progress=on_file,
                        on_error=cfg.on_error,
                        chunked=True,
                    )
            timings["read"] = time.perf_counter() - t0
            return pack_samples(
                samples, out, cfg, overwrite, progress, workers, timings, t0, out_of_core
            )
        finally:
            warming.stop()
            if cache_dir is not None:
                remove_cache_dir(cache_dir)


def _read_progress(inputs: list[Path], progress: Progress | None):
    """Callbacks for the end of each file and for bytes read inside one (None without bars)."""
    if progress is None:
        return None, None
    sizes = [p.stat().st_size for p in inputs]
    total = sum(sizes)
    state = {"file": 0, "done": 0, "current": 0}

    def on_bytes(n: int) -> None:
        state["current"] += n
        i = state["file"]
        current = min(state["current"], sizes[i])
        progress("file", current, sizes[i], inputs[i].name)
        progress("read", state["done"] + current, total)

    def on_file(_path: Path) -> None:
        i = state["file"]
        state["done"] += sizes[i]
        state["file"], state["current"] = i + 1, 0
        if i + 1 < len(inputs):
            progress("file", 0, sizes[i + 1], inputs[i + 1].name)
        progress("read", state["done"], total)

    progress("read", 0, total)
    progress("file", 0, sizes[0], inputs[0].name)
    return on_file, on_bytes


def pack_samples(
    samples: Samples,
    out: Path,
    cfg: PackConfig,
    overwrite: bool,
    progress: Progress | None,
    workers: int,
    timings: dict,
    t0: float,
    out_of_core: bool,
    repacked_from: dict | None = None,
) -> PackResult:
    """Plan samples already read, write their shards, rejects, split labels and manifest, and
    commit the output."""
    timings["out_of_core"] = float(out_of_core)

    t = time.perf_counter()
    if progress:
        progress("plan", 0, 0)
    segs, pl, global_rows = plan_samples(samples, cfg)
    timings["plan"] = time.perf_counter() - t
    if progress:
        progress("plan", 1, 1)

    t = time.perf_counter()
    tmp = output.start(out)
    with output.building(tmp, out):
        if cfg.segment_multiple > 1:
            files = cp_shard_files(cfg)
            shards = write_shards(samples, segs, pl, files.cfg, tmp, progress, workers, files=files)
        else:
            shards = write_shards(samples, segs, pl, cfg, tmp, progress, workers)
        loss_tokens = sum(s["loss_tokens"] for s in shards)
        pad_tokens = sum(s["tokens"] for s in shards) - int(segs.length.sum())
        stats = stats_of(samples, segs, pl, cfg, loss_tokens, pad_tokens, global_rows).as_dict()
        if cfg.segment_multiple > 1:
            stats.update(cp_stats(segs.length, pl.num_rows, cfg))
        rejects = write_rejects(samples, tmp, cfg.hash) if cfg.on_error == "skip" else None
        split_labels = write_split_labels(split_points(samples, segs), tmp, cfg.hash)
        manifest = build_manifest(cfg, samples, stats, shards, rejects, repacked_from, split_labels)
        if cfg.segment_multiple > 1:
            manifest["columns"] = {f.name: str(f.type) for f in CP_SCHEMA}
        output.finish(tmp, out, manifest, overwrite)
    timings["write"] = time.perf_counter() - t
    return PackResult(
        output=out, stats=stats, shards=shards, seconds=time.perf_counter() - t0, timings=timings
    )
