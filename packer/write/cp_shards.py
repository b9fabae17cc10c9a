"""How a CP run (`pack --cp-size N`) writes its shards and what it adds to the stats."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from packer.config import PackConfig
from packer.contract.schema import CP_SCHEMA
from packer.planning.cp import cp_cost
from packer.write.cp_columns import batch_tokens, cp_batch_of
from packer.write.shards import ShardFiles


@dataclass(frozen=True)
class CPShardFiles(ShardFiles):
    """`ShardFiles` for CP shards, with the configuration the gather runs under: no row
    padding there, the record batch pads the segments and then the row."""

    cfg: PackConfig | None = None


def cp_shard_files(cfg: PackConfig) -> CPShardFiles:
    return CPShardFiles(
        schema=CP_SCHEMA,
        batch=cp_batch_of(cfg.segment_multiple, cfg.max_len, cfg.pad, cfg.pad_id),
        tokens_of=batch_tokens,
        cfg=replace(cfg, pad=False),
    )


def cp_stats(lengths: np.ndarray, rows: int, cfg: PackConfig) -> dict:
    """The CP figures of a run's stats: the padding spent on CP, the efficiency with it
    counted as used (`efficiency_padded`, what the planner achieved on padded lengths) beside
    `efficiency` (real tokens only), and the rows against the lower bound of padded lengths."""
    cost = cp_cost(lengths, cfg.max_len, cfg.cp_size, cfg.segment_multiple)
    capacity = rows * cfg.max_len
    lb = cost["lower_bound_padded"]
    sp = {"segment_multiple": cost["multiple"]} if cfg.sequence_parallel else {}
    return {
        **sp,
        "cp_size": cfg.cp_size,
        "cp_pad_tokens": cost["cp_pad_tokens"],
        "padded_tokens": cost["padded_tokens"],
        "efficiency_padded": round(cost["padded_tokens"] / capacity, 6) if rows else 1.0,
        "lower_bound_padded": lb,
        "rows_over_lower_bound_padded": round(rows / lb, 6) if lb else 1.0,
    }
