"""packer.torch without a model: dataset over real shards, collate layouts, multi-rank sampler."""

from __future__ import annotations

import functools
import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_samples, read_shards, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.masking_utils import find_packed_sequence_indices  # noqa: E402
from transformers.modeling_flash_attention_utils import (  # noqa: E402
    prepare_fa_kwargs_from_position_ids,
)

from packer.torch import (  # noqa: E402
    CONTRACT_COLUMNS,
    PackedBatchSampler,
    PackedDataset,
    collate_packed,
    load_hf_dataset,
    model_inputs,
    plan_batches,
    step_loss_tokens,
    sum_token_loss,
)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Two outputs of the same samples through the real CLI: unpadded (3 shards) and padded."""
    from typer.testing import CliRunner

    from packer.cli import app

    root = tmp_path_factory.mktemp("packed")
    src = write_jsonl(root / "in.jsonl", make_samples(60, seed=3, median=20, max_len=90))
    outs = {}
    for name, extra in {"plain": [], "padded": ["--pad", "--pad-id", "7"]}.items():
        out = root / name
        args = [
            "pack",
            str(src),
            "-o",
            str(out),
            "--max-len",
            "64",
            "--overlength",
            "split",
            "--shard-rows",
            "4",
            *extra,
        ]
        result = CliRunner().invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        outs[name] = out
    return outs


def test_import_packer_does_not_import_torch():
    code = "import sys, packer, packer.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_subpackage_name_does_not_shadow_torch():
    import torch as real_torch

    from packer import torch as ptorch

    assert real_torch.__name__ == "torch" and hasattr(real_torch, "Tensor")
    assert ptorch.__name__ == "packer.torch" and ptorch.PackedDataset is PackedDataset
    assert ptorch.collate.torch is real_torch  # `import torch` inside the package is PyTorch


def test_dataset_rows_equal_shards(packed):
    for out in packed.values():
        table = read_shards(out)
        ds = PackedDataset(out)
        assert len(ds) == table.num_rows and len(ds.files) > 1
        for i in range(len(ds)):
            row = ds[i]
            assert set(row) == set(CONTRACT_COLUMNS)
            for name in CONTRACT_COLUMNS:
                expected = table.column(name)[i].as_py()
                got = row[name] if name == "num_loss_tokens" else row[name].tolist()
                assert got == expected, (i, name)
        assert ds[-1]["input_ids"].tolist() == ds[len(ds) - 1]["input_ids"].tolist()
        with pytest.raises(IndexError):
            ds[len(ds)]


def test_dataset_is_memory_mapped(packed):
    before = pa.total_allocated_bytes()
    ds = PackedDataset(packed["plain"])
    rows = [ds[i] for i in range(len(ds))]
    assert pa.total_allocated_bytes() == before  # nothing read into Arrow memory
    assert not rows[0]["input_ids"].flags.writeable  # a view of the read-only mapping
    assert rows[0]["input_ids"].dtype == np.int32 and rows[0]["sample_index"].dtype == np.int64


def test_dataset_pickles_and_works_in_workers(packed):
    ds = PackedDataset(packed["plain"])
    ds[0]  # open a shard before pickling: maps must not travel
    clone = pickle.loads(pickle.dumps(ds))
    assert clone[5]["labels"].tolist() == ds[5]["labels"].tolist()
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=1, collate_fn=collate_packed)
    assert sum(b["num_loss_tokens"] for b in loader) == sum(
        ds[i]["num_loss_tokens"] for i in range(len(ds))
    )


def test_lengths_exclude_stored_padding(packed):
    plain, padded = PackedDataset(packed["plain"]), PackedDataset(packed["padded"])
    assert plain.lengths.tolist() == [len(plain[i]["input_ids"]) for i in range(len(plain))]
    assert padded.lengths.tolist() == plain.lengths.tolist()
    assert all(len(padded[i]["input_ids"]) == 64 for i in range(len(padded)))


def _check_segments(ids, labels, pos, cu, nonpad_len):
    """Positions restart at every boundary, run 0..n-1 inside, and every first label is -100."""
    cu = cu.tolist()
    assert cu[0] == 0 and cu[-1] == len(ids) and all(a <= b for a, b in zip(cu, cu[1:]))
    for a, b in zip(cu, cu[1:]):
        if a < b:
            assert pos[a:b].tolist() == list(range(b - a))
            assert labels[a] == -100
    assert (labels[nonpad_len:] == -100).all()


@pytest.mark.parametrize("name", ["plain", "padded"])
def test_collate_flatten(packed, name):
    ds = PackedDataset(packed[name])
    rows = [ds[i] for i in (0, len(ds) - 1, 2)]
    batch = collate_packed(rows, "flatten")
    ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
    total = sum(int(r["cu_seqlens"][len(r["sample_index"])]) for r in rows)
    assert ids.shape == labels.shape == pos.shape == (1, total)  # stored padding dropped
    assert ids.dtype == labels.dtype == pos.dtype == torch.int64
    cu_q, cu_k = batch["cu_seq_lens_q"], batch["cu_seq_lens_k"]
    assert cu_q.dtype == cu_k.dtype == torch.int32 and cu_q.ndim == 1 and torch.equal(cu_q, cu_k)
    assert int(cu_q[-1]) == total and len(cu_q) == sum(len(r["sample_index"]) for r in rows) + 1
    assert type(batch["max_length_q"]) is int and type(batch["max_length_k"]) is int
    assert batch["max_length_q"] == batch["max_length_k"] == int(cu_q.diff().max())
    _check_segments(ids[0], labels[0], pos[0], cu_q, total)
    assert batch["num_loss_tokens"] == int((labels != -100).sum())
    assert set(model_inputs(batch)) == set(batch) - {"num_loss_tokens"} | {"use_cache"}
    assert model_inputs(batch)["use_cache"] is False
    # transformers derives the same boundaries from position_ids on its own
    (fa_q, fa_k), (max_q, _) = prepare_fa_kwargs_from_position_ids(pos)
    assert torch.equal(fa_q, cu_q) and int(max_q) == batch["max_length_q"]
    seg = find_packed_sequence_indices(pos)[0]
    assert torch.equal(torch.bincount(seg), cu_q.diff().long())


@pytest.mark.parametrize("name", ["plain", "padded"])
@pytest.mark.parametrize("multiple", [None, 48])
def test_collate_pad(packed, name, multiple):
    ds = PackedDataset(packed[name])
    rows = [ds[i] for i in (len(ds) - 1, 0, 1)]  # the last row is the short one
    batch = collate_packed(rows, "pad", pad_id=7, pad_to_multiple_of=multiple)
    longest = max(len(r["input_ids"]) for r in rows)
    width = longest if multiple is None else -(-longest // multiple) * multiple
    assert batch["input_ids"].shape == batch["labels"].shape == (3, width)
    assert batch["position_ids"].shape == (3, width)
    assert {batch[k].dtype for k in ("input_ids", "labels", "position_ids")} == {torch.int64}
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.shape[0] == 3 and (cu[:, -1] == width).all()
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        real = int(row["cu_seqlens"][len(row["sample_index"])])
        assert batch["input_ids"][i, :n].tolist() == row["input_ids"].tolist()
        assert (batch["input_ids"][i, real:] == 7).all()
        assert batch["labels"][i, :n].tolist() == row["labels"].tolist()
        # one padding segment after the samples, whatever was stored
        expected_cu = row["cu_seqlens"][: len(row["sample_index"]) + 1].tolist()
        if real < width:
            expected_cu.append(width)
        assert cu[i, : len(expected_cu)].tolist() == expected_cu
        _check_segments(
            batch["input_ids"][i],
            batch["labels"][i],
            batch["position_ids"][i],
            torch.unique_consecutive(cu[i]),
            real,
        )
    assert batch["num_loss_tokens"] == int((batch["labels"] != -100).sum())
    seg = find_packed_sequence_indices(batch["position_ids"])
    for i in range(3):
        assert torch.equal(torch.bincount(seg[i]), torch.unique_consecutive(cu[i]).diff().long())


@pytest.mark.parametrize("mode", ["flatten", "pad"])
def test_collate_accepts_hf_dataset_rows(packed, mode):
    pytest.importorskip("datasets")
    for out in packed.values():
        hf, ds = load_hf_dataset(out), PackedDataset(out)
        assert len(hf) == len(ds)
        which = (len(ds) - 1, 0, 5)
        a = collate_packed([hf[i] for i in which], mode)
        b = collate_packed([ds[i] for i in which], mode)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]) if torch.is_tensor(a[key]) else a[key] == b[key]


def test_collate_errors(packed):
    ds = PackedDataset(packed["plain"])
    with pytest.raises(ValueError) as info:
        collate_packed([ds[0]], "ragged")
    assert str(info.value) == "unknown mode 'ragged' (choose from flatten, pad)"
    with pytest.raises(ValueError) as info:
        collate_packed([], "flatten")
    assert str(info.value) == "cannot collate an empty batch"
    row = {k: v for k, v in ds[0].items() if k not in ("cu_seqlens", "labels")}  # as Trainer's
    with pytest.raises(KeyError) as info:  # column removal does
        collate_packed([row], "flatten")
    assert info.value.args[0] == (
        "packed rows lack labels, cu_seqlens; with a Hugging Face Trainer, set "
        "remove_unused_columns=False so the collator sees every column"
    )
    for bad in (0, -3):
        with pytest.raises(ValueError) as info:
            collate_packed([ds[0]], "pad", pad_to_multiple_of=bad)
        assert str(info.value) == f"pad_to_multiple_of must be at least 1, got {bad}"
    # 1 is a valid multiple (no rounding); flatten ignores the option
    one = collate_packed([ds[0], ds[1]], "pad", pad_to_multiple_of=1)
    assert one["input_ids"].shape[1] == max(len(ds[0]["input_ids"]), len(ds[1]["input_ids"]))
    assert "cu_seq_lens_q" in collate_packed([ds[0]], pad_to_multiple_of=0)  # default: flatten
    short = min(range(len(ds)), key=lambda i: len(ds[i]["input_ids"]))
    long = max(range(len(ds)), key=lambda i: len(ds[i]["input_ids"]))
    padded = collate_packed([ds[short], ds[long]], "pad")  # default pad id: 0
    assert int(padded["input_ids"][0, -1]) == 0


def test_loss_helpers_agree_with_transformers_normalisation():
    from transformers.loss.loss_utils import ForCausalLMLoss

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 9, 11, generator=gen)
    labels = torch.randint(0, 11, (2, 9), generator=gen)
    labels[:, 0] = -100
    labels[1, 4] = -100
    n = int((labels != -100).sum())
    hf = ForCausalLMLoss(logits, labels, vocab_size=11, num_items_in_batch=n)
    assert torch.allclose(sum_token_loss(logits, labels) / n, hf)
    assert step_loss_tokens([{"num_loss_tokens": 3}, {"num_loss_tokens": 4}]) == 7


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 100), max_size=60),
    batch_size=st.integers(1, 5),
    replicas=st.integers(1, 6),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 50),
    drop_last=st.booleans(),
)
def test_plan_batches_properties(lengths, batch_size, replicas, seed, epoch, drop_last):
    n, per_step = len(lengths), batch_size * replicas
    kwargs = dict(seed=seed, epoch=epoch, drop_last=drop_last, balance="tokens")
    plan = plan_batches(lengths, batch_size, replicas, **kwargs)
    steps = n // per_step if drop_last else -(-n // per_step)
    assert plan.shape == (steps, replicas, batch_size)  # same number and size on every rank
    again = plan_batches(lengths, batch_size, replicas, **kwargs)
    assert np.array_equal(plan, again)
    counts = np.bincount(plan.ravel(), minlength=n)
    if drop_last:
        assert counts.max(initial=0) <= 1 and counts.sum() == steps * per_step
    else:
        assert (counts >= 1).all() and counts.sum() == steps * per_step
        assert counts.max(initial=0) <= max(1, -(-per_step // max(n, 1)) + 1)
    lens = np.asarray(lengths)
    for step in plan:
        loads = lens[step].sum(axis=1)
        spread = lens[step].max() - lens[step].min()
        assert loads.max() - loads.min() <= spread  # snake dealing bound


def test_plan_batches_epoch_and_seed_change_order():
    lengths = list(range(1, 41))
    base = plan_batches(lengths, 2, 2, seed=1, epoch=0, balance="tokens")
    assert not np.array_equal(base, plan_batches(lengths, 2, 2, seed=1, epoch=1, balance="tokens"))
    assert not np.array_equal(base, plan_batches(lengths, 2, 2, seed=2, epoch=0, balance="tokens"))
    ordered = plan_batches(lengths, 2, 2, shuffle=False, balance=False)
    assert ordered[0].tolist() == [[0, 3], [1, 2]]


def test_sampler_ranks_share_rows_and_length(packed):
    ds = PackedDataset(packed["plain"])
    samplers = [
        PackedBatchSampler(ds, batch_size=2, num_replicas=3, rank=r, seed=5, drop_last=True)
        for r in range(3)
    ]
    for s in samplers:
        s.set_epoch(4)
    per_rank = [list(s) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) == len(samplers[0])
    seen = [i for batches in per_rank for batch in batches for i in batch]
    assert len(seen) == len(set(seen)) == len(samplers[0]) * 6
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=samplers[1], collate_fn=functools.partial(collate_packed, mode="pad")
    )
    assert len(list(loader)) == len(samplers[1])
    with pytest.raises(ValueError, match="rank"):
        PackedBatchSampler(ds, batch_size=2, num_replicas=2, rank=2)
