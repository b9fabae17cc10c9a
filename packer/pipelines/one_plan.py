"""One plan: every sample of the run resolved and planned together (in memory or out of core)."""

from __future__ import annotations

from packer.config import PackConfig
from packer.planning.overlength import Segments, resolve
from packer.planning.strategies import Plan, plan
from packer.read.samples import Samples


def plan_samples(samples: Samples, cfg: PackConfig) -> tuple[Segments, Plan, int | None]:
    """Resolve over-length samples and plan their rows: (segments, plan, rows of one global
    plan when `cfg.window` is set). Shared by `pack` and `pack_dataset`."""
    segs = resolve(
        samples.lengths,
        cfg.max_len,
        cfg.overlength,
        starts=samples.offsets[:-1],
        locate=samples.locate,
    )
    if samples.index is not None:  # skipped samples keep their input numbering
        segs.sample = samples.index[segs.sample]
    pl = plan(segs.length, cfg.max_len, cfg.strategy, seed=cfg.seed, window=cfg.window)
    global_rows = None
    if cfg.window is not None:
        global_rows = plan(segs.length, cfg.max_len, cfg.strategy, seed=cfg.seed).num_rows
    return segs, pl, global_rows
