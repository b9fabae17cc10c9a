"""Batches balanced by modeled compute: the cost model, the efficiency targets, the epoch rules,
the sampler over a real packed output and `packer plan --world-size`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_samples, read_shards, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.planning.balance import (
    balance_inputs,
    compare_balance,
    efficiency,
    plan_batches,
    plan_epoch,
    row_costs,
    row_segments,
    row_tokens,
)
from packer.planning.row_order import order_plan_rows
from packer.planning.strategies import plan

sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))
from bench_balance import mix_lengths, packed_rows, split_lengths  # noqa: E402


def reference_cost(segments, hidden_size):
    return sum(segments) + sum(x * x for x in segments) / (12 * hidden_size)


def reference_efficiency(plan, costs, world):
    """Σ cost / W over Σ_steps of the slowest rank, with plain loops."""
    total = slowest = 0.0
    for step in plan:
        loads = [sum(costs[i] for i in batch) for batch in step]
        total += sum(loads)
        slowest += max(loads)
    return total / world / slowest


def test_row_costs_follow_the_model():
    rows = [[32768], [100] * 300 + [2768], [5, 7], []]
    offsets, seg = row_segments(rows)
    assert offsets.tolist() == [0, 1, 302, 304, 304]
    assert row_tokens(offsets, seg).tolist() == [sum(r) for r in rows]
    for d in (64, 4096, 8192):
        expected = [reference_cost(r, d) for r in rows]
        np.testing.assert_allclose(row_costs(offsets, seg, d), expected, rtol=1e-12)
    # one 32k document costs about 1.7x a row of short samples at d = 4096
    costs = row_costs(offsets, seg)
    assert 1.6 < costs[0] / costs[1] < 1.7
    custom = row_costs(offsets, seg, cost=lambda s: float(len(s)))
    assert custom.tolist() == [1, 301, 2, 0]
    with pytest.raises(ValueError, match="non-negative"):
        row_costs(offsets, seg, cost=lambda s: -1.0)
    with pytest.raises(ValueError, match="hidden_size"):
        row_costs(offsets, seg, 0)


def test_split_lengths_cuts_like_overlength_split():
    out = split_lengths(np.array([5, 10, 11, 1, 25]), 10)
    assert out.tolist() == [5, 10, 10, 1, 1, 10, 10, 5]


@pytest.mark.parametrize(
    ("mix", "max_len"),
    [("lognormal", 32768), ("long-documents", 32768), ("long-documents", 8192)],
)
def test_attention_balance_reaches_the_targets(mix, max_len):
    offsets, seg = packed_rows(mix_lengths(mix, 1000, max_len), max_len)
    assert len(offsets) - 1 >= 1000
    tokens, costs = row_tokens(offsets, seg), row_costs(offsets, seg)
    for world, target in ((8, 0.98), (64, 0.97)):
        for epoch in range(3):
            kw = dict(seed=0, epoch=epoch)
            by_att = plan_epoch(tokens, costs, 1, world, balance="attention", **kw)
            by_tok = plan_epoch(tokens, costs, 1, world, balance="tokens", **kw)
            att, tok = efficiency(by_att, costs), efficiency(by_tok, costs)
            assert att == pytest.approx(reference_efficiency(by_att, costs, world), rel=1e-9)
            assert att >= target, (mix, max_len, world, epoch, att)
            assert att > tok  # a real gain, not the tokens plan kept as a fallback
            assert np.array_equal(np.sort(by_att.ravel()), np.sort(by_tok.ravel()))
    # several rows per rank: never worse than tokens either
    r = compare_balance(offsets, seg, 8, batch_size=4)
    assert r["attention"] >= max(r["tokens"], 0.98)


def test_long_documents_are_where_tokens_balance_fails():
    """The imbalance this fixes: at 32k, rows with one long document stall their step."""
    offsets, seg = packed_rows(mix_lengths("long-documents", 1000, 32768), 32768)
    r = compare_balance(offsets, seg, 8)
    assert r["tokens"] < 0.85 and r["attention"] > 0.98


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(1, 4000), min_size=1, max_size=6), max_size=70),
    batch_size=st.integers(1, 4),
    replicas=st.integers(1, 9),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 50),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    hidden_size=st.sampled_from([16, 256, 4096]),
)
def test_attention_plan_properties(
    rows, batch_size, replicas, seed, epoch, drop_last, shuffle, hidden_size
):
    n, per_step = len(rows), batch_size * replicas
    kw = dict(seed=seed, epoch=epoch, drop_last=drop_last, shuffle=shuffle, hidden_size=hidden_size)
    got = plan_batches(rows, batch_size, replicas, balance="attention", **kw)
    assert np.array_equal(got, plan_batches(rows, batch_size, replicas, **kw))  # the default
    steps = n // per_step if drop_last else -(-n // per_step)
    assert got.shape == (steps, replicas, batch_size) and got.dtype == np.int64
    counts = np.bincount(got.ravel(), minlength=n)
    if drop_last:
        assert counts.max(initial=0) <= 1
    else:
        assert (counts >= 1).all()
    # the same rows as balancing by tokens (same drop_last choice), never a worse plan
    by_tok = plan_batches(rows, batch_size, replicas, balance="tokens", **kw)
    assert np.array_equal(np.sort(got.ravel()), np.sort(by_tok.ravel()))
    offsets, seg = row_segments(rows)
    costs = row_costs(offsets, seg, hidden_size)
    assert efficiency(got, costs) >= efficiency(by_tok, costs) * (1 - 1e-8)


def test_epochs_differ_and_seeds_repeat():
    offsets, seg = packed_rows(mix_lengths("long-documents", 1000, 32768), 32768)
    rows = [seg[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    plans = [plan_batches(rows, 1, 8, seed=3, epoch=e) for e in range(6)]
    assert np.array_equal(plans[0], plan_batches(rows, 1, 8, seed=3, epoch=0))
    steps = [{frozenset(s.ravel().tolist()) for s in p} for p in plans]
    for i in range(len(plans)):
        counts = np.bincount(plans[i].ravel(), minlength=len(rows))
        assert counts.min() == 1 and counts.sum() - len(rows) == (-len(rows)) % 8  # fill only
        for j in range(i):
            assert not np.array_equal(plans[i], plans[j])
            # the steps themselves change too: few recur in another epoch
            assert len(steps[i] & steps[j]) < 0.1 * len(steps[i])
    assert not np.array_equal(plans[0], plan_batches(rows, 1, 8, seed=4, epoch=0))


def test_balance_argument_errors():
    with pytest.raises(ValueError, match="segment lengths"):
        plan_batches([100, 200, 300], 1, 2)  # attention needs segments, not row lengths
    assert plan_batches([100, 200, 300], 1, 2, balance="tokens").shape == (2, 2, 1)
    assert plan_batches([], 1, 2).shape == (0, 2, 1)
    with pytest.raises(ValueError, match="balance must be"):
        plan_batches([[1], [2]], 1, 2, balance="flops")
    with pytest.raises(ValueError, match="batch_size"):
        plan_batches([[1], [2]], 0, 2)
    with pytest.raises(ValueError, match="1 costs for 2 rows"):
        plan_epoch([1, 2], [1.0], 1, 1)
    # True / False work as they did: tokens balance and no balance
    lengths, costs = balance_inputs([[3, 4], [5]], balance=True)
    assert lengths.tolist() == [7, 5] and costs is None


@pytest.fixture(scope="module")
def split_output(tmp_path_factory):
    """A real output of `packer pack --overlength split` with long documents among short ones."""
    from typer.testing import CliRunner

    from packer.cli import app

    root = tmp_path_factory.mktemp("balance")
    samples = make_samples(150, seed=5, median=40, max_len=120)
    samples += make_samples(20, seed=6, median=600, vocab=50)  # most longer than L, split
    order = np.random.default_rng(0).permutation(len(samples))
    src = write_jsonl(root / "in.jsonl", [samples[i] for i in order])
    out = root / "out"
    args = ["pack", str(src), "-o", str(out), "-L", "256", "--overlength", "split"]
    result = CliRunner().invoke(app, [*args, "--shard-rows", "16"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def test_dataset_segment_lengths_match_the_shards(split_output):
    pytest.importorskip("torch")
    from packer.torch import PackedDataset

    ds = PackedDataset(split_output)
    table = read_shards(split_output)
    offsets, seg = ds.segment_lengths()
    assert len(offsets) == len(ds) + 1 == table.num_rows + 1
    for i in range(len(ds)):
        cu = table.column("cu_seqlens")[i].as_py()
        k = len(table.column("sample_index")[i].as_py())
        assert seg[offsets[i] : offsets[i + 1]].tolist() == np.diff(cu[: k + 1]).tolist()
    assert row_tokens(offsets, seg).tolist() == ds.lengths.tolist()
    assert seg.max() == 256  # split pieces of the long documents fill whole rows


def test_sampler_balances_attention_over_a_real_output(split_output):
    pytest.importorskip("torch")
    import torch

    from packer.torch import PackedBatchSampler, PackedDataset, collate_packed

    ds = PackedDataset(split_output)
    world, batch = 4, 2
    samplers = [
        PackedBatchSampler(ds, batch, num_replicas=world, rank=r, seed=1, hidden_size=64)
        for r in range(world)
    ]
    for s in samplers:
        s.set_epoch(2)
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1 == len({len(s) for s in samplers})
    assert len(per_rank[0]) == len(samplers[0])
    # every rank computed the same plan on its own; together they cover every row
    plan = np.array(per_rank).transpose(1, 0, 2)
    assert np.array_equal(plan, samplers[0].plan())
    assert set(plan.ravel().tolist()) == set(range(len(ds)))
    # costs from the rows themselves, as a trainer would see them
    costs = np.array(
        [
            reference_cost(np.diff(ds[i]["cu_seqlens"][: len(ds[i]["sample_index"]) + 1]), 64)
            for i in range(len(ds))
        ]
    )
    np.testing.assert_allclose(samplers[0].costs, costs)
    by_tok = PackedBatchSampler(ds, batch, num_replicas=world, rank=0, seed=1, balance="tokens")
    by_tok.set_epoch(2)
    assert efficiency(plan, costs) >= efficiency(by_tok.plan(), costs)
    custom = PackedBatchSampler(ds, batch, num_replicas=world, rank=0, cost=lambda s: len(s))
    assert custom.costs.tolist() == [len(ds[i]["sample_index"]) for i in range(len(ds))]
    loader = torch.utils.data.DataLoader(ds, batch_sampler=samplers[3], collate_fn=collate_packed)
    assert sum(b["input_ids"].shape[1] for b in loader) == sum(
        int(ds.lengths[i]) for batch in per_rank[3] for i in batch
    )


def test_plan_cli_reports_balance(cli, tmp_path):
    samples = make_samples(400, seed=2, median=60, max_len=300)
    samples += make_samples(60, seed=3, median=2000, vocab=50)
    path = write_jsonl(tmp_path / "a.jsonl", samples)
    args = ["plan", path, "-L", 1024, "--overlength", "split", "--strategy", "bfd"]
    result = cli(*args, "--world-size", 8, "--hidden-size", 32, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["balance"] == {"world_size": 8, "batch_size": 1, "hidden_size": 32}
    (entry,) = report["strategies"]
    lengths = split_lengths([len(s["input_ids"]) for s in samples], 1024)
    # the batches are planned over the rows in the order `pack` writes them (shuffled)
    rows = order_plan_rows(plan(lengths, 1024, "bfd"), "shuffle", 0)
    expected = compare_balance(rows.row_starts, lengths[rows.order], 8, 1, 32)
    assert entry["dp_efficiency"] == {k: round(v, 6) for k, v in expected.items()}
    assert report["row_order"] == "shuffle"
    in_plan = json.loads(
        cli(*args, "--world-size", 8, "--hidden-size", 32, "--json", "--row-order", "plan").stdout
    )
    rows = plan(lengths, 1024, "bfd")
    expected = compare_balance(rows.row_starts, lengths[rows.order], 8, 1, 32)
    assert in_plan["strategies"][0]["dp_efficiency"] == {
        k: round(v, 6) for k, v in expected.items()
    }
    assert entry["dp_efficiency"]["attention"] > entry["dp_efficiency"]["tokens"]
    table = cli(*args, "--world-size", 8, "--batch-size", 2)
    assert table.exit_code == 0, table.stderr
    assert "8 ranks x 2 row(s)" in table.stderr and "attention" in table.stderr
    plain = json.loads(cli(*args, "--json").stdout)
    assert plain["balance"] is None and "dp_efficiency" not in plain["strategies"][0]
    for flag in ("--world-size", "--hidden-size", "--batch-size"):
        bad = cli(*args, flag, 0)
        assert bad.exit_code == 2 and f"{flag} must be at least 1" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1


def test_docs_snippet_runs(split_output, tmp_path, monkeypatch):
    """docs/balance.md's Python block runs as written against a real output."""
    pytest.importorskip("torch")
    import re
    import shutil

    text = (Path(__file__).parent.parent / "docs" / "balance.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"<!-- runnable -->\n```python\n(.*?)```", text, re.S)
    shutil.copytree(split_output, tmp_path / "out" / "demo")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(code, scope)
    sampler, ds = scope["sampler"], scope["ds"]
    offsets, seg = ds.segment_lengths()
    rows = [seg[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    np.testing.assert_allclose(sampler.costs, [len(r) + (r**2).sum() / 5e4 for r in rows])
    assert sorted(i for batch in sampler for i in batch) == list(range(len(ds)))
