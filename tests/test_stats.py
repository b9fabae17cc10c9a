"""`Stats`, the one statistics type of every driver: its keys and order are the `--json` and
manifest contract, and per-task figures add up to the run's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packer.config import PackConfig
from packer.pipelines.one_plan import plan_samples
from packer.pipelines.result import Stats, stats_of
from packer.read.samples import Samples, SourceFile

KEYS = [
    "samples_in",
    "samples_packed",
    "rejected",
    "rejected_by_reason",
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
    "lower_bound",
    "rows_over_lower_bound",
    "efficiency",
]


def samples_of_lists(lists: list[list[int]]) -> Samples:
    lengths = np.array([len(x) for x in lists], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.concatenate([np.asarray(x, np.int32) for x in lists])
    src = SourceFile(Path("x.jsonl"), "jsonl", len(lists), 0, 0, "", False)
    return Samples(tokens=tokens, offsets=offsets, labels=None, sources=[src])


def test_keys_and_order_are_the_json_contract():
    assert list(Stats(max_len=8).as_dict()) == KEYS
    windowed = Stats(max_len=8, rows=3, tokens=20, global_rows=2).as_dict()
    assert list(windowed) == [*KEYS, "global_rows", "window_cost"]
    assert windowed["window_cost"] == 0.5
    blocks = Stats(
        max_len=8, rows=4, tokens=20, blocks=2, tail_rows=1, tokens_moved=5, global_rows=3
    ).as_dict()
    assert list(blocks) == [
        *KEYS,
        "blocks",
        "tail_rows",
        "tokens_moved",
        "global_rows",
        "block_cost",
    ]


def test_figures_follow_from_the_counts():
    d = Stats(max_len=10, rows=3, tokens=25).as_dict()
    assert d["lower_bound"] == 3 and d["rows_over_lower_bound"] == 1.0
    assert d["efficiency"] == round(25 / 30, 6)
    empty = Stats(max_len=10).as_dict()
    assert empty["efficiency"] == 1.0 and empty["rows_over_lower_bound"] == 1.0


def test_tasks_sum_to_the_run():
    rng = np.random.default_rng(0)
    lists = [list(range(1, 2 + int(n))) for n in rng.integers(1, 40, 300)]
    cfg = PackConfig(max_len=64, overlength="split")
    parts = []
    for chunk in (lists[:100], lists[100:210], lists[210:]):
        samples = samples_of_lists(chunk)
        segs, pl, _ = plan_samples(samples, cfg)
        parts.append(stats_of(samples, segs, pl, cfg, loss_tokens=7, pad_tokens=0))
    total = sum(parts)
    assert total == parts[0] + parts[1] + parts[2]
    for key in ("samples_in", "samples_packed", "segments", "tokens", "rows", "loss_tokens"):
        assert getattr(total, key) == sum(getattr(p, key) for p in parts)
    assert total.samples_in == 300 and total.loss_tokens == 21
    assert total.tokens == sum(len(x) for x in lists)


def test_sum_merges_reasons_and_refuses_what_does_not_add():
    a = Stats(max_len=8, rejected=2, rejected_by_reason={"empty": 1, "negative_id": 1})
    b = Stats(max_len=8, rejected=1, rejected_by_reason={"empty": 1})
    assert (a + b).rejected_by_reason == {"empty": 2, "negative_id": 1}
    assert (a + b).as_dict()["rejected_by_reason"] == {"empty": 2, "negative_id": 1}
    with pytest.raises(ValueError, match="rows of 8 and 16 tokens"):
        a + Stats(max_len=16)
    with pytest.raises(ValueError, match="not summed"):
        a + Stats(max_len=8, global_rows=3)
