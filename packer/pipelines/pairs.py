"""`pack --pairs`: preference pairs packed whole, both segments of a pair in one row.

The pairs are read and checked (`packer.read.pairs`), over-length pairs dropped or truncated
(`packer.planning.pairs`), and the planner packs each pair as one item of its two segments'
tokens with the strategy and window of any other run. The item plan is then spelled out per
segment (item k is segments 2k and 2k + 1, adjacent), and the shards are gathered and written
as every other output, with `pair_index` and `pair_side` added (`packer.write.pair_columns`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from packer.config import PackConfig
from packer.contract.schema import PAIR_SCHEMA, PAIR_SIDES
from packer.interrupts import interrupt_once
from packer.pipelines.result import PackResult, Progress, Stats
from packer.planning.pairs import resolve_pairs
from packer.planning.row_order import order_plan_rows
from packer.planning.strategies import Plan, plan
from packer.read.pairs import pair_samples, read_pairs
from packer.write import commit as output
from packer.write.manifest import build_manifest, write_rejects
from packer.write.pair_columns import pair_batch
from packer.write.shards import ShardFiles, write_shards

PAIR_SHARDS = ShardFiles(schema=PAIR_SCHEMA, batch=pair_batch)


def segment_plan(items: Plan) -> Plan:
    """The plan of the segments of a plan of pairs: item k becomes segments 2k, 2k + 1."""
    order = np.stack([2 * items.order, 2 * items.order + 1], 1).ravel()
    return Plan(order=order.astype(np.int64), row_starts=2 * items.row_starts)


def pair_item_lengths(
    inputs: list, columns: tuple[str, str, str], max_len: int, overlength: str
) -> tuple[np.ndarray, dict]:
    """What `packer plan --pairs` plans: each kept pair's packed length (prompt twice and both
    completions, after `overlength`), and the pair counts."""
    pairs = read_pairs(inputs, columns, "error")
    kept = resolve_pairs(*pairs.lengths, max_len, overlength, locate=pairs.locate)
    counts = {
        "pairs_in": pairs.num_pairs,
        "pairs": kept.num_pairs,
        "dropped": kept.dropped,
        "truncated": kept.truncated,
    }
    return np.ascontiguousarray(kept.item_lengths, np.int64), counts


def plan_pairs(inputs: list[Path], cfg: PackConfig, on_file=None):
    """Read, resolve and plan: (samples, segments, segment plan, stats without the rows'
    loss and pad tokens). Shared by `pack_pairs` and `packer plan`-like callers."""
    columns = (cfg.prompt_column, cfg.chosen_column, cfg.rejected_column)
    pairs = read_pairs(inputs, columns, cfg.on_error, progress=on_file)
    kept = resolve_pairs(*pairs.lengths, cfg.max_len, cfg.overlength, locate=pairs.locate)
    samples, segs = pair_samples(pairs, kept)
    items = kept.item_lengths
    pl = plan(items, cfg.max_len, cfg.strategy, seed=cfg.seed, window=cfg.window)
    pl = segment_plan(order_plan_rows(pl, cfg.row_order, cfg.seed, cfg.window))
    global_rows = None
    if cfg.window is not None:
        global_rows = plan(items, cfg.max_len, cfg.strategy, seed=cfg.seed).num_rows
    rejects = pairs.rejects
    stats = Stats(
        max_len=cfg.max_len,
        samples_in=samples.num_input_samples,
        samples_packed=kept.num_pairs,
        rejected=rejects.total if rejects else 0,
        rejected_by_reason=dict(rejects.counts) if rejects else {},
        dropped=kept.dropped,
        truncated=kept.truncated,
        segments=segs.num_segments,
        tokens_in=int(2 * pairs.lengths[0].sum() + pairs.lengths[1].sum() + pairs.lengths[2].sum()),
        tokens=int(segs.length.sum()),
        tokens_removed=kept.tokens_removed,
        rows=pl.num_rows,
        global_rows=global_rows,
    )
    return samples, segs, pl, stats


def pack_pairs(
    inputs: list[Path],
    out: Path,
    cfg: PackConfig,
    *,
    overwrite: bool,
    progress: Progress | None,
    workers: int,
    t0: float,
) -> PackResult:
    """Pack preference pairs into shards plus `manifest.json` under `out`, atomically."""
    timings: dict = {}
    with interrupt_once():
        samples, segs, pl, stats = plan_pairs(inputs, cfg)
        timings["read_and_plan"] = time.perf_counter() - t0
        t = time.perf_counter()
        tmp = output.start(out)
        with output.building(tmp, out):
            shards = write_shards(samples, segs, pl, cfg, tmp, progress, workers, files=PAIR_SHARDS)
            stats.loss_tokens = sum(s["loss_tokens"] for s in shards)
            stats.pad_tokens = sum(s["tokens"] for s in shards) - stats.tokens
            stats = stats.as_dict()
            rejects = write_rejects(samples, tmp, cfg.hash) if cfg.on_error == "skip" else None
            manifest = build_manifest(cfg, samples, stats, shards, rejects)
            manifest["columns"] = {f.name: str(f.type) for f in PAIR_SCHEMA}
            manifest["pairs"] = {"sides": list(PAIR_SIDES), "segments_per_pair": 2}
            output.finish(tmp, out, manifest, overwrite)
        timings["write"] = time.perf_counter() - t
    return PackResult(
        output=out, stats=stats, shards=shards, seconds=time.perf_counter() - t0, timings=timings
    )
