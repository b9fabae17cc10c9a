"""`pack`: read, resolve over-length samples, plan, gather and write, atomically.

This is the library entry point behind `packer pack`; it knows nothing about the terminal.
Progress is reported through an optional callback so the CLI can draw bars.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from packer import arguments as A
from packer.arguments import parse_size
from packer.config import PackConfig
from packer.errors import OutputError, UsageError, option
from packer.interrupts import interrupt_once
from packer.jit import start_warming
from packer.pipelines.one_plan import plan_samples
from packer.pipelines.result import PackResult, stats_of
from packer.planning.overlength import Segments
from packer.planning.strategies import Plan
from packer.read.assemble import read_samples
from packer.read.cache import (
    batch_bytes_for,
    default_budget,
    make_cache_dir,
    needs_out_of_core,
    remove_cache_dir,
    stream_samples,
)
from packer.read.files import expand_inputs
from packer.read.progress import metering
from packer.read.samples import Samples
from packer.workers import configure as configure_workers
from packer.write import commit as output
from packer.write.manifest import build_manifest, split_points, write_rejects, write_split_labels
from packer.write.shards import write_shards

# progress(stage, done, total, label): "read" (bytes of all files), "file" (bytes of the file
# being read, its name as label), "plan" (0 of 0 while planning, then 1 of 1), "write" (rows)
Progress = Callable[..., None]


def compute_stats(
    samples: Samples,
    segs: Segments,
    pl: Plan,
    cfg: PackConfig,
    loss_tokens: int,
    pad_tokens: int,
    global_rows: int | None = None,
) -> dict:
    """The figures of `packer pack --json` (and `pack_dataset(..., return_stats=True)`)."""
    return stats_of(samples, segs, pl, cfg, loss_tokens, pad_tokens, global_rows).as_dict()


def pack(
    inputs: Iterable[str | Path],
    output_dir: str | Path,
    config: PackConfig,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
    workers: int | None = None,
    memory_budget: int | str | None = None,
    out_of_core: bool | None = None,
    repack: bool = False,
    engine: str | None = None,
    ray_address: str | None = None,
) -> PackResult:
    """Pack token datasets into Arrow shards plus `manifest.json` under `output_dir`.

    The output appears only when complete: it is built in a hidden sibling directory and
    renamed into place, so a failed or killed run never leaves shards that look finished.

    Packer outputs are never read as samples (their rows are already packed): inside
    directories and globs they are skipped, named directly they are refused. `repack=True`
    reads one packer output back into its original samples instead (see `packer.read.repack`).

    With `config.block_size` or `engine="ray"` the block pipeline runs (`packer.engines.blocks`): both
    engines write the same bytes for the same configuration.
    """
    t0 = time.perf_counter()
    if not isinstance(config, PackConfig):
        raise UsageError(f"config must be a PackConfig, got {type(config).__name__}")
    if isinstance(inputs, (str, os.PathLike)):  # one path, not a sequence of characters
        inputs = [inputs]
    if not isinstance(output_dir, (str, os.PathLike)) or not str(output_dir):
        raise UsageError(f"output_dir must be a path, got {output_dir!r}")
    overwrite = A.boolean(overwrite, "overwrite")
    repack = A.boolean(repack, "repack")
    runtime = {"engine": engine, "ray_address": ray_address}
    cfg = replace(config, **{k: v for k, v in runtime.items() if v is not None}).validate()
    workers = configure_workers(A.integer(workers, "workers", minimum=1, none=True))
    out = Path(output_dir)
    output.check_target(out, overwrite)
    timings = {}
    blocks = cfg.block_size is not None or cfg.engine != "local"
    if repack and blocks:
        raise UsageError(
            f"{option('repack=True', '--repack')} runs on the local engine with one global plan "
            f"(no {option('block_size')})"
        )
    if repack:
        from packer.read.repack import check_repack_inputs, read_packed

        samples, origin = read_packed(check_repack_inputs(list(inputs)))
        timings["read"] = time.perf_counter() - t0
        return _pack_samples(
            samples, out, cfg, overwrite, progress, workers, timings, t0, False, origin
        )

    skipped: list[Path] = []
    inputs = expand_inputs(inputs, skip=out, skipped=skipped)
    if blocks:
        from packer.engines.blocks import pack_blocks

        result = pack_blocks(
            inputs,
            out,
            cfg,
            overwrite=overwrite,
            progress=progress,
            workers=workers,
            budget=parse_size(memory_budget) if memory_budget is not None else default_budget(),
            t0=t0,
        )
        result.skipped_inputs = [str(p) for p in skipped]
        return result
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
        )  # this run's kernels compile while reading (packer.jit)
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
            result = _pack_samples(
                samples, out, cfg, overwrite, progress, workers, timings, t0, out_of_core
            )
            result.skipped_inputs = [str(p) for p in skipped]
            return result
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


def _pack_samples(
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
        shards = write_shards(samples, segs, pl, cfg, tmp, progress, workers)
        loss_tokens = sum(s["loss_tokens"] for s in shards)
        pad_tokens = sum(s["tokens"] for s in shards) - int(segs.length.sum())
        stats = compute_stats(samples, segs, pl, cfg, loss_tokens, pad_tokens, global_rows)
        rejects = write_rejects(samples, tmp, cfg.hash) if cfg.on_error == "skip" else None
        split_labels = write_split_labels(split_points(samples, segs), tmp, cfg.hash)
        manifest = build_manifest(cfg, samples, stats, shards, rejects, repacked_from, split_labels)
        output.finish(tmp, out, manifest, overwrite)
    timings["write"] = time.perf_counter() - t
    return PackResult(
        output=out, stats=stats, shards=shards, seconds=time.perf_counter() - t0, timings=timings
    )
