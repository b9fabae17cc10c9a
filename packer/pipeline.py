"""What `packer.in_memory` still imports from here until it imports `packer.pipelines`:
`compute_stats` (now `packer.pipelines.result.stats_of`) and `plan_samples`."""

from __future__ import annotations

from packer.config import PackConfig
from packer.pipelines.one_plan import plan_samples
from packer.pipelines.result import stats_of
from packer.planning.overlength import Segments
from packer.planning.strategies import Plan
from packer.read.samples import Samples

__all__ = ["compute_stats", "plan_samples"]


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
