"""The rows the attention and model checks run: how they are picked, and how a failure on one of
them names its sample.

The checks compare each sample of a row run packed with the sample run alone; a sample is what
the position ids delimit (`alone_segments`), not what cu_seqlens says, so a wrong boundary shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.verify.result import Failure


@dataclass
class RowInput:
    """A row picked for the attention and model checks."""

    shard: str
    row: int
    data: dict  # ShardArrays.row(): numpy views of the row's columns


def alone_segments(position_ids: np.ndarray) -> list[tuple[int, int]]:
    """Samples as the position ids delimit them (independent of cu_seqlens): [start, end)."""
    n = len(position_ids)
    starts = np.flatnonzero(np.asarray(position_ids) == 0).tolist()
    if not starts or starts[0] != 0:
        starts = [0] + starts
    return list(zip(starts, starts[1:] + [n]))


def _segment_of(cu: np.ndarray, token: int) -> int:
    return int(np.searchsorted(cu, token, side="right")) - 1


def sample_label(
    shard: str, r: int, row: dict, a: int, b: int, j: int | None = None
) -> tuple[str, int, int | None]:
    """Name the j-th sample as the position ids delimit it (tokens a..b-1): sample_index[j]
    when the row lists that many, else by the cu_seqlens segment holding token a."""
    cu = np.asarray(row["cu_seqlens"])
    idx = row["sample_index"]
    k = j if j is not None and j < len(idx) else _segment_of(cu, a)
    if 0 <= k < len(idx):
        off = int(row["sample_offset"][k])
        name = f"sample {int(idx[k])}" + (f" (piece at token {off})" if off else "")
        return f"{shard} row {r}, {name} (tokens {a}..{b - 1})", k, int(idx[k])
    return f"{shard} row {r}, padding (tokens {a}..{b - 1})", k, None


def sample_failure(item: RowInput, label: tuple, text: str) -> Failure:
    """A failure about one sample of a checked row, placed as `sample_label` names it."""
    place, seg, idx = label
    return Failure(f"{place}: {text}", shard=item.shard, row=item.row, sample=idx, segment=seg)


def pick_rows(
    candidates: list[tuple[int, int, int]], count: int | None, seed: int
) -> list[tuple[int, int]]:
    """Rows to run, from (shard number, row, segments) of usable rows: all when count is None,
    else `count` picked with the seed, rows holding two or more samples first."""
    if count is None:
        return [(s, r) for s, r, _ in candidates]
    rng = np.random.default_rng(seed)
    multi = [c for c in candidates if c[2] > 1]
    single = [c for c in candidates if c[2] <= 1]
    chosen = [multi[i] for i in rng.permutation(len(multi))[:count]]
    if len(chosen) < count:
        chosen += [single[i] for i in rng.permutation(len(single))[: count - len(chosen)]]
    return sorted((s, r) for s, r, _ in chosen)
