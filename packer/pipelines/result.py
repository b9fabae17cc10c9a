"""What a run reports: `PackResult` and `Stats`, the one statistics type of every driver, and
the `Progress` callback it reports to while it runs.

`Stats.as_dict()` is the `stats` of `packer pack --json`, of the manifest and of
`pack_dataset(..., return_stats=True)`: its keys, their order and their rounding are a contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packer.config import PackConfig
from packer.planning.overlength import Segments
from packer.planning.strategies import Plan, lower_bound
from packer.read.samples import Samples

# progress(stage, done, total, label): "read" (bytes of all files), "file" (bytes of the file
# being read, its name as label), "plan" (0 of 0 while planning, then 1 of 1), "write" (rows)
Progress = Callable[..., None]


@dataclass
class PackResult:
    output: Path
    stats: dict
    shards: list[dict]
    seconds: float
    timings: dict = field(default_factory=dict)
    skipped_inputs: list[str] = field(default_factory=list)  # packer outputs left out
    engine: str = "local"
    # block runs: the block and tail tasks kept from a killed run (`resume`) and those run now
    tasks_reused: int | None = None
    tasks_run: int | None = None
    mixture: dict | None = None  # a mixture's or a validation split's per-source report

    def report(self) -> dict:
        """The machine-readable summary printed by `packer pack --json`."""
        tasks = {}
        if self.tasks_run is not None:
            tasks = {"tasks_reused": self.tasks_reused, "tasks_run": self.tasks_run}
        return {
            **self.stats,
            "seconds": round(self.seconds, 3),
            "shards": len(self.shards),
            "output": str(self.output),
            "skipped_inputs": self.skipped_inputs,
            "engine": self.engine,
            **tasks,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            **({"mixture": self.mixture} if self.mixture is not None else {}),
        }


# the counts that add up over the tasks of a run (a block's, a window's)
_COUNTS = (
    "samples_in",
    "samples_packed",
    "rejected",
    "dropped",
    "truncated",
    "split",
    "segments",
    "tokens_in",
    "tokens",
    "tokens_removed",
    "pad_tokens",
    "loss_tokens",
    "rows",
)
# what only a whole run knows, set by its driver on the total
_RUN = ("global_rows", "blocks", "tail_rows", "tokens_moved", "lower_bound_l2")


@dataclass
class Stats:
    """A run's figures (or one task's, summed with `+` or `sum`) for rows of `max_len` tokens.

    `lower_bound`, `rows_over_lower_bound` and `efficiency` follow from the counts. The run's
    own figures: `global_rows`, the rows of one global plan (windowed or block runs: reported
    with `window_cost` or `block_cost`), and for block runs `blocks`, `tail_rows`,
    `tokens_moved` and `lower_bound_l2` (when the driver has the length histogram).
    """

    max_len: int
    samples_in: int = 0
    samples_packed: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    truncated: int = 0
    split: int = 0
    segments: int = 0
    tokens_in: int = 0
    tokens: int = 0
    tokens_removed: int = 0
    pad_tokens: int = 0
    loss_tokens: int = 0
    rows: int = 0
    global_rows: int | None = None
    blocks: int | None = None
    tail_rows: int | None = None
    tokens_moved: int | None = None
    lower_bound_l2: int | None = None

    def __add__(self, other: Stats) -> Stats:
        if not isinstance(other, Stats):
            return NotImplemented
        if other.max_len != self.max_len:
            raise ValueError(f"stats of rows of {self.max_len} and {other.max_len} tokens")
        if any(getattr(s, name) is not None for s in (self, other) for name in _RUN):
            raise ValueError("a run's own figures (global_rows, blocks, ...) are not summed")
        reasons = dict(self.rejected_by_reason)
        for reason, n in other.rejected_by_reason.items():
            reasons[reason] = reasons.get(reason, 0) + n
        counts = {name: getattr(self, name) + getattr(other, name) for name in _COUNTS}
        return Stats(max_len=self.max_len, rejected_by_reason=reasons, **counts)

    def __radd__(self, other) -> Stats:
        if isinstance(other, int) and other == 0:  # sum() starts from 0
            return self
        return NotImplemented

    def as_dict(self) -> dict:
        """The figures of `packer pack --json` and of the manifest, in their order."""
        tokens, rows = self.tokens, self.rows
        lb = lower_bound(tokens, self.max_len)
        stats = {
            "samples_in": self.samples_in,
            "samples_packed": self.samples_packed,
            "rejected": self.rejected,
            "rejected_by_reason": dict(sorted(self.rejected_by_reason.items())),
            "dropped": self.dropped,
            "truncated": self.truncated,
            "split": self.split,
            "segments": self.segments,
            "tokens_in": self.tokens_in,
            "tokens": tokens,
            "tokens_removed": self.tokens_removed,
            "pad_tokens": self.pad_tokens,
            "loss_tokens": self.loss_tokens,
            "rows": rows,
            "lower_bound": lb,
            "rows_over_lower_bound": round(rows / lb, 6) if lb else 1.0,
            "efficiency": round(tokens / (rows * self.max_len), 6) if rows else 1.0,
        }
        if self.blocks is not None:
            stats["blocks"] = self.blocks
            stats["tail_rows"] = self.tail_rows
            stats["tokens_moved"] = self.tokens_moved
            if self.lower_bound_l2 is not None:
                stats["lower_bound_l2"] = max(lb, self.lower_bound_l2)
        if self.global_rows is not None:  # what windows or blocks cost against one global plan
            cost = "block_cost" if self.blocks is not None else "window_cost"
            stats["global_rows"] = self.global_rows
            stats[cost] = round(rows / self.global_rows - 1, 6) if self.global_rows else 0.0
        return stats


def stats_of(
    samples: Samples,
    segs: Segments,
    pl: Plan,
    cfg: PackConfig,
    loss_tokens: int,
    pad_tokens: int,
    global_rows: int | None = None,
) -> Stats:
    """The figures of samples resolved into `segs` and planned into `pl`, with the loss and pad
    tokens of the rows written; `global_rows` with a window (the rows of one global plan)."""
    rejects = samples.rejects
    return Stats(
        max_len=cfg.max_len,
        samples_in=samples.num_input_samples,
        samples_packed=samples.num_samples - segs.dropped,
        rejected=samples.num_rejected,
        rejected_by_reason=dict(rejects.counts) if rejects else {},
        dropped=segs.dropped,
        truncated=segs.truncated,
        split=segs.split,
        segments=segs.num_segments,
        tokens_in=samples.num_tokens,
        tokens=int(segs.length.sum()),
        tokens_removed=segs.tokens_removed,
        pad_tokens=pad_tokens,
        loss_tokens=loss_tokens,
        rows=pl.num_rows,
        global_rows=global_rows,
    )
