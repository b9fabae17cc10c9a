"""`pack(..., mix=...)` and `validation_split=`: a weighted mixture of sources, one global plan.

Every source is read (in memory, or out of core past the memory budget), the mixture planned
once over all of them (`select`), and the chosen samples, repeats included, packed
with one plan like any run. A validation split holds out samples of every source first and
packs them into a second output. Both outputs are built completely before either is put in
place; the validation output goes in first, so a training output never names one that is not
there. Every segment names its source (`sample_source`) and the manifests say what each
source gave (`mixture`).
"""

from __future__ import annotations

import numbers
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np

from packer.config import PackConfig
from packer.errors import UsageError, option
from packer.interrupts import interrupt_once
from packer.pipelines.mixture.read import check_source_columns, read_sources
from packer.pipelines.mixture.report import (
    describe_sources,
    file_counts,
    mixture_report,
    validation_report,
)
from packer.pipelines.mixture.select import (
    MixturePlan,
    Selection,
    expand_sources,
    mix_sources,
    plan_mixture,
    selection_segments,
    source_ranges,
)
from packer.pipelines.result import PackResult, Progress, stats_of
from packer.planning.cp import pad_to_multiple
from packer.planning.row_order import order_plan_rows
from packer.planning.strategies import plan
from packer.storage import display, is_url
from packer.write import commit as output
from packer.write.cp_shards import cp_shard_files, cp_stats
from packer.write.manifest import build_manifest, split_points, write_rejects, write_split_labels
from packer.write.shards import SHARDS, write_shards
from packer.write.source_column import with_source_column


def check_mixture_run(cfg: PackConfig, out, *, repack: bool, resume: bool, mixing: bool) -> None:
    """What a mixture or a validation split cannot run with, refused before any work."""
    what = option("mix") if mixing else option("validation_split")
    blocks = cfg.block_size is not None or cfg.engine != "local"
    for flag, on in (
        (option("repack=True", "--repack"), repack),
        (option("pairs"), cfg.pairs),
    ):
        if on:
            raise UsageError(f"{what} packs samples; it cannot be used with {flag}")
    if resume and not blocks:
        raise UsageError(
            f"{option('resume=True', '--resume')} picks up block runs: pass "
            f"{option('block_size')} or {option('engine')} ray"
        )
    if is_url(str(out)):
        raise UsageError(
            f"{what} writes local outputs; pack to a directory, then copy it", where=str(out)
        )


def validation_target(out: Path, validation_output, overwrite: bool) -> Path:
    """Where the validation output goes (a sibling `OUT-validation` by default), refused
    before any work if it cannot be written or is the training output."""
    dest = Path(validation_output) if validation_output is not None else None
    if dest is None:
        dest = out.with_name(f"{out.name}-validation")
    elif is_url(str(validation_output)):
        raise UsageError(f"{option('validation_output')} must be a local directory")
    a, b = dest.resolve(), out.resolve()
    if a == b or a.is_relative_to(b) or b.is_relative_to(a):
        raise UsageError(
            f"{option('validation_output')} and the output must be apart, neither inside the other",
            where=str(dest),
        )
    output.check_target(dest, overwrite)
    return dest


def check_mix_tokens(mix, mix_tokens) -> None:
    """`mix_tokens` sizes a mixture: refused for a run without `mix` (a split only)."""
    if mix_tokens is not None and mix is None:
        raise UsageError(
            f"{option('mix_tokens', '--mix-tokens')} sizes a mixture: pass {option('mix')}"
        )


def pack_mixture(
    inputs: list,
    out: Path,
    cfg: PackConfig,
    *,
    mix,
    mix_tokens,
    validation_split,
    validation_output,
    overwrite: bool,
    progress: Progress | None,
    workers: int,
    memory_budget,
    t0: float,
) -> PackResult:
    """Pack a mixture of sources (`mix`, {path: weight} or [(path, weight)]), or hold out a
    validation split of `inputs`, into `out` (and the validation output)."""
    sources = mix_sources(mix, inputs)
    check_mix_tokens(mix, mix_tokens)
    split = _check_split(validation_split)
    if split is None and validation_output is not None:
        raise UsageError(
            f"{option('validation_output')} is where {option('validation_split')} writes"
        )
    vout = validation_target(out, validation_output, overwrite) if split is not None else None
    files = expand_sources(sources)
    check_source_columns(sources, files, cfg)
    with ExitStack() as stack:
        samples = read_sources(sources, files, out, cfg, memory_budget, stack)
        read_seconds = time.perf_counter() - t0
        counts = file_counts(samples, files)
        ranges = source_ranges(samples, counts)
        weights = [s.weight for s in sources]
        planned = plan_mixture(samples, ranges, weights, cfg, mix_tokens, split)
        bounds = np.cumsum([0, *counts], dtype=np.int64)
        described = describe_sources(sources, files, bounds)
        tmp_dirs: list[tuple[Path, Path]] = []
        try:
            result = _write_both(
                samples,
                planned,
                cfg,
                out,
                vout,
                bounds,
                described,
                split,
                mix_tokens,
                progress,
                workers,
                tmp_dirs,
            )
            with interrupt_once():
                for tmp, dest in reversed(tmp_dirs):  # the validation output first
                    output.commit(tmp, dest, overwrite=overwrite)
                tmp_dirs.clear()
        finally:
            for tmp, _ in tmp_dirs:
                output.discard(tmp)
    result.seconds = time.perf_counter() - t0
    result.timings = {"read": read_seconds, **result.timings}
    return result


def _check_split(split):
    """A validation split as `split_validation` takes it (checked there, in full)."""
    if split is None:
        return None
    if isinstance(split, bool) or not isinstance(split, numbers.Real):
        raise UsageError(
            f"{option('validation_split')} must be a fraction in (0, 1) or a count, got {split!r}"
        )
    return split


def _write_both(
    samples,
    planned: MixturePlan,
    cfg,
    out,
    vout,
    bounds,
    described,
    split,
    mix_tokens,
    progress,
    workers,
    tmp_dirs,
) -> PackResult:
    """Build the training output (and the validation output) in temporary directories,
    listed in `tmp_dirs` as (tmp, destination) for the caller to commit."""
    report = mixture_report(planned, described, cfg, split, mix_tokens)
    if vout is not None:
        report["validation"] = {"output": display(vout), "split": split, "seed": cfg.seed}
    train = _build(samples, planned.train, cfg, out, bounds, report, progress, workers, tmp_dirs)
    if vout is not None:
        vreport = validation_report(planned, described, cfg, split, out)
        held = Selection(planned.validation.positions, planned.validation.source)
        _build(samples, held, cfg, vout, bounds, vreport, None, workers, tmp_dirs)
    train.mixture = report
    return train


def _build(
    samples,
    selection: Selection,
    cfg,
    dest: Path,
    bounds,
    report: dict,
    progress,
    workers,
    tmp_dirs,
) -> PackResult:
    """Plan the selected samples, write their shards and manifest into a temporary directory
    beside `dest` (appended to `tmp_dirs`); not yet committed."""
    t = time.perf_counter()
    segs = selection_segments(samples, selection, cfg)
    lengths = pad_to_multiple(segs.length, cfg.segment_multiple)
    pl = plan(lengths, cfg.max_len, cfg.strategy, seed=cfg.seed, window=cfg.window)
    pl = order_plan_rows(pl, cfg.row_order, cfg.seed, cfg.window)
    global_rows = None
    if cfg.window is not None:
        global_rows = plan(lengths, cfg.max_len, cfg.strategy, seed=cfg.seed).num_rows
    timings = {"plan": time.perf_counter() - t}
    tmp = output.start(dest)
    tmp_dirs.append((tmp, dest))
    t = time.perf_counter()
    with output.building(tmp, dest):
        stats, shards = _write(
            samples, segs, pl, global_rows, selection, cfg, tmp, bounds, report, progress, workers
        )
    timings["write"] = time.perf_counter() - t
    return PackResult(output=dest, stats=stats, shards=shards, seconds=0.0, timings=timings)


def _write(
    samples, segs, pl, global_rows, selection, cfg, tmp, bounds, report, progress, workers
) -> tuple[dict, list[dict]]:
    """The shards, sidecar files and manifest of one output, in its temporary directory."""
    files = cp_shard_files(cfg) if cfg.segment_multiple > 1 else SHARDS
    wcfg = files.cfg if cfg.segment_multiple > 1 else cfg
    files = with_source_column(files, bounds)
    shards = write_shards(samples, segs, pl, wcfg, tmp, progress, workers, files=files)
    loss_tokens = sum(s["loss_tokens"] for s in shards)
    pad_tokens = sum(s["tokens"] for s in shards) - int(segs.length.sum())
    stats = stats_of(samples, segs, pl, cfg, loss_tokens, pad_tokens, global_rows)
    stats = replace(stats, samples_packed=int(selection.positions.size), dropped=selection.dropped)
    stats = stats.as_dict()
    if cfg.segment_multiple > 1:
        stats.update(cp_stats(segs.length, pl.num_rows, cfg))
    rejects = write_rejects(samples, tmp, cfg.hash) if cfg.on_error == "skip" else None
    split_labels = write_split_labels(split_points(samples, segs), tmp, cfg.hash)
    manifest = build_manifest(cfg, samples, stats, shards, rejects, None, split_labels)
    manifest["columns"] = {f.name: str(f.type) for f in files.schema}
    manifest["mixture"] = report
    output.write_manifest(tmp, manifest)
    return stats, shards
