"""`packer pack --cp-size N`: every segment padded at its end to a multiple of 2N, read back.

Each output is read back with pyarrow and checked segment by segment against the input: the
real tokens and labels in place, the padding `pad_id` / -100 with positions that continue the
segment's count, `cu_seqlens` the cumulative real lengths and `cu_seqlens_padded` the
boundaries in the row, every padded length a multiple of 2N, and the manifest's CP figures.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_samples, read_shards, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.config import PackConfig
from packer.errors import UsageError
from packer.pipelines.pack import pack
from packer.planning.compare import compare_strategies
from packer.planning.cp import cp_cost, padded_lengths
from packer.planning.strategies import plan


def check_cp_rows(table, samples, cp_size: int, max_len: int, pad: bool, pad_id: int = 0):
    """Every row of a CP output against its input samples; returns the pieces seen."""
    mult = 2 * cp_size
    seen = []
    for row in table.to_pylist():
        ids, labels, pos = row["input_ids"], row["labels"], row["position_ids"]
        cu, cup = row["cu_seqlens"], row["cu_seqlens_padded"]
        n = len(row["sample_index"])
        assert len(cu) == len(cup)
        assert cup[0] == 0 and cup[-1] == len(ids) and cu[0] == 0
        assert len(ids) <= max_len and (len(ids) == max_len or not pad)
        assert len(cu) - 1 in (n, n + 1)  # a final padding segment only when the row is padded
        for k in range(len(cu) - 1):
            real, padded = cu[k + 1] - cu[k], cup[k + 1] - cup[k]
            assert padded % mult == 0 and padded - real >= 0
            a = cup[k]
            if k < n:
                assert padded - real < mult
                s, off = row["sample_index"][k], row["sample_offset"][k]
                src = samples[s]
                assert ids[a : a + real] == src["input_ids"][off : off + real]
                assert labels[a] == -100
                assert labels[a + 1 : a + real] == src["labels"][off + 1 : off + real]
                seen.append((s, off, real))
            else:
                assert real == 0 and pad  # the row's padding: no real token
            assert ids[a + real : a + padded] == [pad_id] * (padded - real)
            assert labels[a + real : a + padded] == [-100] * (padded - real)
            assert pos[a : a + padded] == list(range(padded))
        assert row["num_loss_tokens"] == sum(x != -100 for x in labels)
    return seen


@pytest.mark.parametrize("cp_size", [2, 4])
@pytest.mark.parametrize("pad", [False, True])
def test_cp_rows_read_back(tmp_path, cp_size, pad):
    samples = make_samples(300, seed=cp_size, median=50, max_len=256)
    src = write_jsonl(tmp_path / "in.jsonl", samples)
    res = pack([src], tmp_path / "out", PackConfig(max_len=256, cp_size=cp_size, pad=pad, pad_id=7))
    table = read_shards(tmp_path / "out")
    seen = check_cp_rows(table, samples, cp_size, 256, pad, pad_id=7)
    assert sorted(s for s, _, _ in seen) == list(range(len(samples)))
    lengths = np.array([len(s["input_ids"]) for s in samples])
    padded = padded_lengths(lengths, cp_size)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    stats = manifest["stats"]
    assert manifest["config"]["cp_size"] == cp_size
    assert "cu_seqlens_padded" in manifest["columns"]
    assert stats["cp_pad_tokens"] == int((padded - lengths).sum()) == res.stats["cp_pad_tokens"]
    assert stats["padded_tokens"] == int(padded.sum())
    assert stats["tokens"] == int(lengths.sum())
    assert stats["pad_tokens"] == sum(len(r) for r in table.column("input_ids").to_pylist()) - int(
        lengths.sum()
    )
    assert stats["efficiency"] == round(lengths.sum() / (stats["rows"] * 256), 6)
    assert stats["efficiency_padded"] == round(padded.sum() / (stats["rows"] * 256), 6)
    assert stats["lower_bound_padded"] == -(-int(padded.sum()) // 256)
    assert stats["rows"] >= stats["lower_bound_padded"]


def test_cp_split_pieces_each_padded(tmp_path):
    samples = make_samples(40, seed=3, median=200)
    src = write_jsonl(tmp_path / "in.jsonl", samples)
    cfg = PackConfig(max_len=96, cp_size=3, overlength="split")
    res = pack([src], tmp_path / "out", cfg)
    assert res.stats["split"] > 0
    seen = check_cp_rows(read_shards(tmp_path / "out"), samples, 3, 96, False)
    for i, s in enumerate(samples):  # every piece of every sample, in order, nothing lost
        pieces = sorted((off, n) for j, off, n in seen if j == i)
        assert sum(n for _, n in pieces) == len(s["input_ids"])
        assert [off for off, _ in pieces] == list(np.cumsum([0] + [n for _, n in pieces])[:-1])


def test_cp_size_one_is_today(tmp_path):
    """cp_size 1 writes the bytes of a run without it, and records nothing new."""
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(100))
    pack([src], tmp_path / "a", PackConfig(max_len=300))
    pack([src], tmp_path / "b", PackConfig(max_len=300, cp_size=1))
    a = json.loads((tmp_path / "a" / "manifest.json").read_text())
    b = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert a["shards"] == b["shards"] and "cp_size" not in b["config"]
    assert "cp_pad_tokens" not in b["stats"]


def test_cp_bad_configs(tmp_path):
    with pytest.raises(UsageError, match=r"max_len 100 must be a multiple of 2 x cp_size = 8"):
        PackConfig(max_len=100, cp_size=4).validate()
    with pytest.raises(UsageError, match="cp_size must be at least 1"):
        PackConfig(max_len=100, cp_size=0).validate()
    with pytest.raises(UsageError, match="local engine with one global plan"):
        PackConfig(max_len=64, cp_size=2, block_size=1000).validate()
    with pytest.raises(UsageError, match="cannot be used with pairs"):
        PackConfig(max_len=64, cp_size=2, pairs=True).validate()


def test_cp_cli(cli, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(80, median=30, max_len=120))
    r = cli("pack", src, "-o", tmp_path / "bad", "-L", "100", "--cp-size", "4")
    assert r.exit_code == 2
    assert "--max-len 100 must be a multiple of 2 x --cp-size = 8" in r.stderr
    assert not (tmp_path / "bad").exists()
    r = cli("pack", src, "-o", tmp_path / "out", "-L", "128", "--cp-size", "4", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["cp_size"] == 4 and report["cp_pad_tokens"] > 0
    r = cli("pack", tmp_path / "out", "-o", tmp_path / "re", "--repack", "-L", "128")
    assert r.exit_code != 0 and "a CP output" in r.stderr
    r = cli("plan", src, "-L", "128", "--cp-size", "4", "--strategy", "bfd", "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["cp"]["cp_pad_tokens"] == report["cp_pad_tokens"]
    assert plan["strategies"][0]["rows"] == report["rows"]
    r = cli("plan", src, "-L", "100", "--cp-size", "4")
    assert r.exit_code == 2 and "multiple of 2 x --cp-size = 8" in r.stderr
    r = cli("plan", src, "-L", "128", "--cp-size", "2", "--strategy", "bfd")
    assert r.exit_code == 0 and "CP size 2: every sample padded to a multiple of 4" in r.stderr


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=80),
    cp_size=st.integers(2, 8),
)
def test_planner_packs_padded_lengths(lengths, cp_size):
    """Property: every planned row's padded lengths fit L, and the rows never go below the
    padded lower bound (the lengths are capped at L, so each fits after padding)."""
    max_len = 2 * cp_size * 8
    lengths = np.minimum(np.array(lengths), max_len)
    report = compare_strategies(lengths, max_len, ("bfd",), cp_size=cp_size)
    cost = cp_cost(lengths, max_len, cp_size)
    padded = padded_lengths(lengths, cp_size)
    assert (padded % (2 * cp_size) == 0).all() and (padded - lengths < 2 * cp_size).all()
    pl = plan(padded, max_len, "bfd")
    rows = np.add.reduceat(padded[pl.order], pl.row_starts[:-1])
    assert (rows <= max_len).all() and pl.num_rows == report["strategies"][0]["rows"]
    assert report["strategies"][0]["rows"] >= cost["lower_bound_padded"] >= cost["lower_bound"]
    assert report["bounds"]["tokens"] == cost["lower_bound_padded"]
