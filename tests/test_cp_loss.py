"""The loss under context parallelism, with packer's tiny model: the rank-local losses summed over
CP ranks equal the unsplit batch's loss, and padding carries none.

The logits come from one forward pass over the whole flattened batch (CPU, fp32, sdpa; isolation
from `position_ids`), as a correct CP attention would give them; each rank takes its tokens' logits
by its shard's `index` and scores them against its shard's `labels` (shifted before the split).
The reference is the unsplit batch with the model's own shift (`sum_token_loss`) and each sample
run alone. Negative controls: a wrong chunk order gives other per-rank losses than the zigzag
reference, and labels shifted on each rank instead of before the split lose the targets at chunk
ends, so the comparisons below can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_samples, write_jsonl

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402

import packer  # noqa: E402
from packer.torch import PackedDataset, collate_packed, cp_shard, sum_token_loss  # noqa: E402
from packer.torch.tiny_model import build_tiny_model  # noqa: E402

VOCAB = 1000
PAD_ID = 3
SUM_TOL = 2e-4  # on summed token losses of a few hundred tokens (fp32, different sum order)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, one_torch_thread):
    root = tmp_path_factory.mktemp("cp_loss")
    samples = make_samples(30, seed=17, median=20, max_len=120, vocab=VOCAB)
    src = write_jsonl(root / "in.jsonl", samples)
    outs = {}
    for cp_size in (2, 4):
        out = root / f"cp{cp_size}"
        cfg = packer.PackConfig(max_len=128, cp_size=cp_size, pad_id=PAD_ID, overlength="split")
        packer.pack([src], out, cfg)
        outs[cp_size] = PackedDataset(out)
    model = build_tiny_model(seed=0, vocab_size=VOCAB, hidden_size=32, max_positions=256)
    return samples, outs, model


def logits_of(model, batch: dict, input_ids=None) -> torch.Tensor:
    ids = batch["input_ids"] if input_ids is None else input_ids
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=batch["position_ids"], use_cache=False)
    return out.logits[0].float()


def rank_loss(logits: torch.Tensor, index, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[index], targets, ignore_index=-100, reduction="sum")


def zigzag_reference(cu_padded: list[int], rank: int, cp_size: int, order=None) -> list[int]:
    """A rank's positions chunk by chunk; `order(rank)` gives other chunk choices (wrong ones)."""
    chunks = order(rank) if order else (rank, 2 * cp_size - 1 - rank)
    out = []
    for start, end in zip(cu_padded[:-1], cu_padded[1:]):
        c = (end - start) // (2 * cp_size)
        for k in chunks:
            out.extend(range(start + k * c, start + (k + 1) * c))
    return out


@pytest.mark.parametrize("cp_size", [2, 4])
def test_rank_losses_sum_to_the_unsplit_loss(setup, cp_size):
    samples, outs, model = setup
    ds = outs[cp_size]
    batch = collate_packed([ds[i] for i in range(min(3, len(ds)))])
    logits = logits_of(model, batch)
    unsplit = sum_token_loss(logits[None], batch["labels"])
    shards = [cp_shard(batch, r, cp_size) for r in range(cp_size)]
    per_rank = [rank_loss(logits, s["index"], s["labels"][0]) for s in shards]
    assert float(sum(per_rank)) == pytest.approx(float(unsplit), abs=SUM_TOL)
    assert sum(s["local_loss_tokens"] for s in shards) == batch["num_loss_tokens"]
    # the token-mean loss of the step: every rank divides by the batch's count, not its own
    mean = sum(p / s["num_loss_tokens"] for p, s in zip(per_rank, shards))
    assert float(mean) == pytest.approx(float(unsplit) / batch["num_loss_tokens"], abs=1e-6)

    # each sample alone (its real tokens, from the source): the same loss as its share of ranks
    cup, real = batch["cu_seqlens_padded"].tolist(), batch["cu_seqlens"].tolist()
    rows = [ds[i] for i in range(min(3, len(ds)))]
    pieces = [(int(s), int(o)) for r in rows for s, o in zip(r["sample_index"], r["sample_offset"])]
    for k, (s, off) in enumerate(pieces):
        n = real[k + 1] - real[k]
        src = samples[s]
        ids = torch.tensor([src["input_ids"][off : off + n]])
        labels = torch.tensor([[-100] + src["labels"][off + 1 : off + n]])
        with torch.no_grad():
            alone_logits = model(input_ids=ids, use_cache=False).logits.float()
        alone = sum_token_loss(alone_logits, labels)
        mine = 0.0
        for shard in shards:
            at = shard["index"]
            inside = (at >= cup[k]) & (at < cup[k + 1])
            mine += float(rank_loss(logits, at[inside], shard["labels"][0][inside]))
        assert mine == pytest.approx(float(alone), abs=SUM_TOL), (k, s, off)


def test_padding_carries_no_loss(setup):
    _, outs, model = setup
    ds = outs[4]
    batch = collate_packed([ds[i] for i in range(min(3, len(ds)))])
    cup, real = batch["cu_seqlens_padded"].tolist(), batch["cu_seqlens"].tolist()
    is_pad = torch.zeros(batch["input_ids"].shape[1], dtype=torch.bool)
    for k in range(len(cup) - 1):
        is_pad[cup[k] + real[k + 1] - real[k] : cup[k + 1]] = True
    assert is_pad.any(), "the fixture must hold CP padding"
    assert (batch["input_ids"][0][is_pad] == PAD_ID).all()
    logits = logits_of(model, batch)
    # other ids on the padding: no real token's logits move, and no rank's loss changes
    noise = torch.randint(
        0, VOCAB, batch["input_ids"].shape, generator=torch.Generator().manual_seed(1)
    )
    other_ids = torch.where(is_pad[None], noise, batch["input_ids"])
    assert not torch.equal(other_ids, batch["input_ids"])
    other = logits_of(model, batch, other_ids)
    assert torch.allclose(logits[~is_pad], other[~is_pad], atol=1e-5)
    for r in range(4):
        shard = cp_shard(batch, r, 4)
        pad_here = is_pad[shard["index"]]
        assert (shard["labels"][0][pad_here] == -100).all()  # padding predicts nothing
        a = rank_loss(logits, shard["index"], shard["labels"][0])
        b = rank_loss(other, shard["index"], shard["labels"][0])
        assert float(a) == pytest.approx(float(b), abs=SUM_TOL)


def test_wrong_orders_and_local_shifts_are_caught(setup):
    """The comparisons above fail on a wrong split: they are not true of any split."""
    _, outs, model = setup
    cp_size = 4
    ds = outs[cp_size]
    batch = collate_packed([ds[i] for i in range(min(3, len(ds)))])
    logits = logits_of(model, batch)
    cup = batch["cu_seqlens_padded"].tolist()
    targets = torch.cat([batch["labels"][0, 1:], torch.tensor([-100])])
    reference = []
    for r in range(cp_size):
        where = zigzag_reference(cup, r, cp_size)
        shard = cp_shard(batch, r, cp_size)
        assert shard["index"].tolist() == where
        reference.append(float(rank_loss(logits, torch.tensor(where), targets[where])))
        assert float(rank_loss(logits, shard["index"], shard["labels"][0])) == pytest.approx(
            reference[-1], abs=SUM_TOL
        )
    wrong_orders = {
        "contiguous halves": lambda r: (2 * r, 2 * r + 1),
        "chunks swapped": lambda r: (2 * cp_size - 1 - r, r),
        "mirror off by one": lambda r: (r, (2 * cp_size - r) % (2 * cp_size)),
    }
    for name, order in wrong_orders.items():
        got = []
        for r in range(cp_size):
            where = zigzag_reference(cup, r, cp_size, order)
            got.append(float(rank_loss(logits, torch.tensor(where), targets[where])))
            if name == "chunks swapped":  # the same tokens in another order: positions differ
                pos = batch["position_ids"][0, where]
                assert not torch.equal(pos, cp_shard(batch, r, cp_size)["position_ids"][0])
        if name != "chunks swapped":
            assert not np.allclose(got, reference, atol=SUM_TOL), name
    # labels shifted on each rank, after the split: every chunk end predicts the wrong token
    unsplit = float(sum_token_loss(logits[None], batch["labels"]))
    local = 0.0
    for r in range(cp_size):
        shard = cp_shard(batch, r, cp_size)
        unshifted = batch["labels"][0, shard["index"]]
        local += float(sum_token_loss(logits[shard["index"]][None], unshifted[None]))
    assert abs(local - unsplit) > 50 * SUM_TOL  # far beyond the tolerance the sums pass with
