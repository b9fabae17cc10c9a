"""packer.torch on CP outputs: the dataset and collator carry `cu_seqlens_padded`, `cp_shard`
gives each CP rank its zigzag share with the attention kwargs, and `PackedBatchSampler` hands
every CP rank of a data-parallel rank the same rows.

Outputs are packed with the real CLI and read back through `PackedDataset`; each rank's share
is checked against a plain Python reference of the zigzag split (chunks r and 2N-1-r of every
sample), and all ranks together must rebuild the batch.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_samples, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from packer.torch import (  # noqa: E402
    PackedBatchSampler,
    PackedDataset,
    collate_packed,
    cp_shard,
)

PAD_ID = 7


def reference_positions(cu_padded: list[int], rank: int, cp_size: int) -> list[int]:
    """Rank `rank`'s batch positions, written out chunk by chunk."""
    out = []
    for start, end in zip(cu_padded[:-1], cu_padded[1:]):
        c = (end - start) // (2 * cp_size)
        for chunk in (rank, 2 * cp_size - 1 - rank):
            out.extend(range(start + chunk * c, start + (chunk + 1) * c))
    return out


def check_shards(batch: dict, cp_size: int) -> list[dict]:
    """Every rank's share against the reference; all ranks together rebuild the batch."""
    cup = batch["cu_seqlens_padded"].tolist() if "cu_seqlens_padded" in batch else None
    cup = cup or batch["cu_seq_lens_q"].tolist()
    real = batch["cu_seqlens"].tolist() if "cu_seqlens" in batch else cup
    ids = batch["input_ids"][0].tolist()
    labels = batch["labels"][0].tolist()
    pos = batch["position_ids"][0].tolist()
    total = len(ids)
    targets = labels[1:] + [-100]  # each position's target: the next position's label
    shards, seen = [], []
    for rank in range(cp_size):
        shard = cp_shard(batch, rank, cp_size)
        where = reference_positions(cup, rank, cp_size)
        assert shard["index"].tolist() == where
        assert len(where) == total // cp_size
        assert shard["input_ids"][0].tolist() == [ids[i] for i in where]
        assert shard["position_ids"][0].tolist() == [pos[i] for i in where]
        assert shard["labels"][0].tolist() == [targets[i] for i in where]
        assert shard["shift_labels"] is shard["labels"]
        assert shard["local_loss_tokens"] == sum(targets[i] != -100 for i in where)
        assert shard["num_loss_tokens"] == batch["num_loss_tokens"]
        te = shard["te_kwargs"]
        assert te["qkv_format"] == "thd" and te["attn_mask_type"] == "padding_causal"
        assert te["cu_seqlens_q"].tolist() == te["cu_seqlens_kv"].tolist() == real
        assert te["cu_seqlens_q_padded"].tolist() == te["cu_seqlens_kv_padded"].tolist() == cup
        assert te["cu_seqlens_q"].dtype == te["cu_seqlens_q_padded"].dtype == torch.int32
        longest = max(b - a for a, b in zip(cup[:-1], cup[1:]))
        assert te["max_seqlen_q"] == te["max_seqlen_kv"] == longest
        ring = shard["ring_flash_attn_kwargs"]
        # local boundaries: each sample's two chunks on this rank, end to end
        assert ring["cu_seqlens"].tolist() == [c // cp_size for c in cup]
        assert ring["cu_seqlens"].dtype == torch.int32
        assert ring["max_seqlen"] == longest // cp_size and ring["causal"] is True
        seen.extend(where)
        shards.append(shard)
    assert sorted(seen) == list(range(total))
    # every loss token of the batch is the target of exactly one position on one rank
    assert sum(s["local_loss_tokens"] for s in shards) == batch["num_loss_tokens"]
    return shards


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """CP outputs (2 and 4, padded rows or not) and a plain one, packed by the real CLI."""
    from typer.testing import CliRunner

    from packer.cli import app

    root = tmp_path_factory.mktemp("cp_torch")
    samples = make_samples(120, seed=5, median=30, max_len=300)
    src = write_jsonl(root / "in.jsonl", samples)
    outs = {}
    for name, extra in {
        "cp2": ["--cp-size", "2"],
        "cp4-pad": ["--cp-size", "4", "--pad"],
        "plain": [],
    }.items():
        out = root / name
        args = ["pack", str(src), "-o", str(out), "-L", "128", "--overlength", "split"]
        pad_id = ["--pad-id", str(PAD_ID)] if extra else []  # refused where nothing is padded
        args += [*pad_id, "--shard-rows", "5", *extra]
        result = CliRunner().invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        outs[name] = out
    return outs


@pytest.mark.parametrize("name,cp_size", [("cp2", 2), ("cp4-pad", 4), ("cp4-pad", 2)])
def test_shards_of_a_packed_cp_output(outputs, name, cp_size):
    ds = PackedDataset(outputs[name])
    assert all("cu_seqlens_padded" in ds[i] for i in range(len(ds)))
    batch = collate_packed([ds[i] for i in range(4)])
    # the THD batch keeps every sample's CP padding and drops only the rows' own padding
    cup, real = batch["cu_seqlens_padded"].tolist(), batch["cu_seqlens"].tolist()
    assert batch["cu_seq_lens_q"].tolist() == cup and cup[-1] == batch["input_ids"].shape[1]
    assert batch["max_length_q"] == max(np.diff(cup))
    offset = offset_real = 0
    for i in range(4):
        row = ds[i]
        k = len(row["sample_index"])
        n = int(row["cu_seqlens_padded"][k])
        assert batch["input_ids"][0, offset : offset + n].tolist() == row["input_ids"][:n].tolist()
        assert batch["labels"][0, offset : offset + n].tolist() == row["labels"][:n].tolist()
        offset += n
        offset_real += int(row["cu_seqlens"][k])
    assert offset == cup[-1] and offset_real == real[-1]
    check_shards(batch, cp_size)


def test_padding_and_last_tokens_carry_no_target(outputs):
    ds = PackedDataset(outputs["cp4-pad"])
    batch = collate_packed([ds[i] for i in range(3)])
    cup, real = batch["cu_seqlens_padded"].tolist(), batch["cu_seqlens"].tolist()
    ids = batch["input_ids"][0].tolist()
    for rank, shard in enumerate(check_shards(batch, 4)):
        where = shard["index"].tolist()
        for j, at in enumerate(where):
            k = int(np.searchsorted(cup, at, side="right")) - 1
            n = real[k + 1] - real[k]
            if at - cup[k] >= n - 1:  # padding, or a sample's last real token
                assert shard["labels"][0, j] == -100, (rank, at)
            if at - cup[k] >= n:
                assert ids[at] == PAD_ID


def test_plain_output_with_odd_samples_is_refused(outputs):
    ds = PackedDataset(outputs["plain"])
    assert "cu_seqlens_padded" not in ds[0]
    rows = [ds[i] for i in range(len(ds))]
    batch = collate_packed(rows)
    assert "cu_seqlens_padded" not in batch
    with pytest.raises(ValueError, match=r"^cp_size: sample \d+ of the batch has \d+ tokens"):
        cp_shard(batch, 0, 2)


def test_even_plain_batch_splits():
    """A batch packed without CP splits when its samples happen to divide by 2N."""
    cu = np.array([0, 4, 12, 20], np.int32)
    row = {
        "input_ids": np.arange(20, dtype=np.int32),
        "labels": np.where(np.isin(np.arange(20), cu[:-1]), -100, np.arange(20)).astype(np.int32),
        "position_ids": np.concatenate([np.arange(d) for d in np.diff(cu)]).astype(np.int32),
        "cu_seqlens": cu,
        "sample_index": np.arange(3),
        "sample_offset": np.zeros(3, np.int32),
        "num_loss_tokens": 17,
    }
    batch = collate_packed([row])
    shards = check_shards(batch, 2)
    assert shards[0]["te_kwargs"]["cu_seqlens_q"] is shards[0]["te_kwargs"]["cu_seqlens_q_padded"]
    assert shards[0]["input_ids"][0].tolist() == [0, 3, 4, 5, 10, 11, 12, 13, 18, 19]


def test_refusals(outputs):
    ds = PackedDataset(outputs["cp2"])
    rows = [ds[0], ds[1]]
    batch = collate_packed(rows)
    with pytest.raises(ValueError, match=r"^cp_rank must be in \[0, 2\), got 2"):
        cp_shard(batch, 2, 2)
    with pytest.raises(ValueError, match=r"^cp_size must be a positive integer, got 0"):
        cp_shard(batch, 0, 0)
    # packed for cp_size 2: a sample padded to a multiple of 4 is not always one of 8
    bad = [b for b in (3, 4, 8) if np.any(np.diff(batch["cu_seqlens_padded"].numpy()) % (2 * b))]
    with pytest.raises(ValueError, match=r"^cp_size: sample \d+ .* not a multiple of 2 x cp_size"):
        cp_shard(batch, 0, bad[0])
    with pytest.raises(ValueError, match=r"^mode: rows of a CP output .* mode='flatten'"):
        collate_packed(rows, "pad")
    plain = PackedDataset(outputs["plain"])[0]
    with pytest.raises(ValueError, match=r"^rows: some come from a CP output"):
        collate_packed([rows[0], plain])
    with pytest.raises(ValueError, match=r"^batch: cp_shard takes a batch collated with"):
        cp_shard(collate_packed([plain], "pad"), 0, 1)


@st.composite
def cp_rows(draw):
    """CP rows as `pack --cp-size` lays them out: samples padded at their end to 2N."""
    cp_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    mult = 2 * cp_size
    rows = []
    for r in range(draw(st.integers(1, 3))):
        real = draw(st.lists(st.integers(1, 40), min_size=1, max_size=5))
        padded = [-(-n // mult) * mult for n in real]
        ids, labels, pos = [], [], []
        for n, p in zip(real, padded):
            toks = draw(st.lists(st.integers(0, 999), min_size=n, max_size=n))
            ids += toks + [PAD_ID] * (p - n)
            labels += [-100] + toks[1:] + [-100] * (p - n)
            pos += list(range(p))
        rows.append(
            {
                "input_ids": np.array(ids, np.int32),
                "labels": np.array(labels, np.int32),
                "position_ids": np.array(pos, np.int32),
                "cu_seqlens": np.cumsum([0, *real]).astype(np.int32),
                "cu_seqlens_padded": np.cumsum([0, *padded]).astype(np.int32),
                "sample_index": np.arange(len(real)) + 10 * r,
                "sample_offset": np.zeros(len(real), np.int32),
                "num_loss_tokens": sum(x != -100 for x in labels),
            }
        )
    return rows, cp_size


@settings(max_examples=60, deadline=None)
@given(cp_rows())
def test_shards_partition_any_cp_batch(case):
    rows, cp_size = case
    batch = collate_packed(rows)
    shards = check_shards(batch, cp_size)
    # the ranks' shares, put back by their indices, are the batch and its shifted labels
    total = batch["input_ids"].shape[1]
    ids = torch.full((total,), -1, dtype=torch.int64)
    for s in shards:
        ids[s["index"]] = s["input_ids"][0]
    assert torch.equal(ids, batch["input_ids"][0])


def test_sampler_gives_every_cp_rank_of_a_dp_rank_the_same_rows(outputs):
    """dp 2 x cp 2 and dp 1 x cp 4: the sampler takes the DP rank and size, never the CP rank."""
    ds = PackedDataset(outputs["cp2"])
    manifest = json.loads((outputs["cp2"] / "manifest.json").read_text())
    assert manifest["config"]["cp_size"] == 2
    for dp_size, cp_size in ((2, 2), (1, 4), (3, 2)):
        ranks = {}  # global rank -> (dp rank, cp rank, batches)
        for global_rank in range(dp_size * cp_size):
            dp_rank, cp_rank = divmod(global_rank, cp_size)  # CP ranks adjacent, as Megatron's
            sampler = PackedBatchSampler(
                ds, batch_size=2, num_replicas=dp_size, rank=dp_rank, seed=3
            )
            sampler.set_epoch(1)
            ranks[global_rank] = (dp_rank, cp_rank, list(sampler))
        for dp_rank in range(dp_size):
            group = [b for d, _, b in ranks.values() if d == dp_rank]
            assert all(b == group[0] for b in group)  # the same rows on every CP rank
        firsts = [ranks[d * cp_size][2] for d in range(dp_size)]
        epoch_rows = sorted(i for batches in firsts for batch in batches for i in batch)
        assert set(epoch_rows) == set(range(len(ds)))  # the DP ranks share out every row
        # and each CP rank of a DP rank trains on its own share of those rows
        if cp_size == 2:
            batch = collate_packed([ds[i] for i in firsts[0][0]])
            check_shards(batch, cp_size)
