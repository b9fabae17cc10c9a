"""Preference losses on packed pairs equal the losses on the same pairs padded, as TRL pads them.

The pairs are packed by `packer pack --pairs` into real shards, read with `PackedDataset` and
collated by `collate_pairs`; the reference side is TRL's own `DataCollatorForPreference`
(chosen and rejected padded to one length, an attention mask, a completion mask) and the
log-probabilities summed over its completion mask. The model is the tiny random Llama in fp32,
on transformers' sdpa and eager paths; the loss and every parameter's gradient must agree
within 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")

from packer.config import PackConfig  # noqa: E402
from packer.pipelines.pack import pack  # noqa: E402
from packer.torch import PackedDataset, model_inputs  # noqa: E402
from packer.torch.preference import (  # noqa: E402
    collate_pairs,
    dpo_loss,
    last_token_scores,
    pair_logps,
    reward_loss,
    segment_logps,
)
from packer.torch.tiny_model import build_tiny_model  # noqa: E402

VOCAB = 512
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _pairs(n: int = 12, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt_input_ids": rng.integers(3, VOCAB, rng.integers(2, 14)).tolist(),
            "chosen_input_ids": rng.integers(3, VOCAB, rng.integers(1, 12)).tolist(),
            "rejected_input_ids": rng.integers(3, VOCAB, rng.integers(1, 12)).tolist(),
        }
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = tmp_path_factory.mktemp("pairs")
    pairs = _pairs()
    ids = pa.list_(pa.int32())
    pq.write_table(
        pa.table({k: pa.array([p[k] for p in pairs], ids) for k in pairs[0]}), tmp / "p.parquet"
    )
    pack(tmp / "p.parquet", tmp / "out", PackConfig(max_len=64, pairs=True))
    ds = PackedDataset(tmp / "out")
    rows = [ds[i] for i in range(len(ds))]
    assert len(rows) > 1 and max(len(r["sample_index"]) for r in rows) >= 4  # pairs share rows
    return pairs, rows


def _padded(model, pairs: list[dict]):
    """Per pair (chosen, rejected, chosen tokens, rejected tokens), as TRL batches them."""
    collator = trl_dpo.DataCollatorForPreference(pad_token_id=0)
    examples = [
        {
            "prompt_ids": p["prompt_input_ids"],
            "chosen_ids": p["chosen_input_ids"],
            "rejected_ids": p["rejected_input_ids"],
        }
        for p in pairs
    ]
    batch = collator(examples)
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    token = logp.gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    mask = batch["completion_mask"][:, 1:].float()
    sums, counts = (token * mask).sum(1), mask.sum(1)
    n = len(pairs)
    return sums[:n], sums[n:], counts[:n], counts[n:], logits, batch


def _by_pair(lp, order):
    """Packed per-pair values reordered to input order."""
    idx = torch.argsort(lp.pair_index)
    assert lp.pair_index[idx].tolist() == order
    return [t[idx] for t in (lp.chosen, lp.rejected, lp.chosen_tokens, lp.rejected_tokens)]


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("mode", ["flatten", "pad"])
@pytest.mark.parametrize(
    ("loss_type", "reference_free"),
    [("sigmoid", False), ("sigmoid", True), ("ipo", False), ("hinge", False)],
)
def test_dpo_loss_and_gradients_match_padded(packed, impl, mode, loss_type, reference_free):
    pairs, rows = packed
    policy = build_tiny_model(seed=0, vocab_size=VOCAB, attn_implementation=impl)
    reference = build_tiny_model(seed=1, vocab_size=VOCAB, attn_implementation=impl)
    batch = collate_pairs(rows, mode)
    if mode == "flatten":
        assert {"cu_seq_lens_q", "max_length_q"} <= set(batch)  # flash kwargs ride along

    lp = pair_logps(policy(**model_inputs(batch)).logits, batch)
    with torch.no_grad():
        ref = None if reference_free else pair_logps(reference(**model_inputs(batch)).logits, batch)
    loss = dpo_loss(lp, ref, beta=0.5, loss_type=loss_type).mean()
    loss.backward()
    packed_grads = _grads(policy)
    policy.zero_grad()

    c, r, nc, nr, _, _ = _padded(policy, pairs)
    c_sum = c.detach()
    with torch.no_grad():
        rc, rr, rnc, rnr, _, _ = _padded(reference, pairs)
    if loss_type == "ipo":
        c, r, rc, rr = c / nc, r / nr, rc / rnc, rr / rnr
    logits = (c - r) - (0 if reference_free else (rc - rr))
    if loss_type == "sigmoid":
        expected = -torch.nn.functional.logsigmoid(0.5 * logits).mean()
    elif loss_type == "hinge":
        expected = torch.relu(1 - 0.5 * logits).mean()
    else:
        expected = ((logits - 1 / (2 * 0.5)) ** 2).mean()
    expected.backward()
    padded_grads = _grads(policy)

    pc, pr, pnc, pnr = _by_pair(lp, list(range(len(pairs))))
    assert torch.equal(pnc, nc) and torch.equal(pnr, nr)  # the same targets counted
    torch.testing.assert_close(pc, c_sum, rtol=0, atol=1e-4)  # sums of ~20 log-probs
    assert abs(loss.item() - expected.item()) < 1e-5
    assert packed_grads.keys() == padded_grads.keys() and packed_grads
    for name, g in packed_grads.items():
        assert (g - padded_grads[name]).abs().max().item() < 1e-5, name


def test_the_check_can_fail(packed):
    """A packed batch whose segments attend across (one causal segment per row) does not match."""
    pairs, rows = packed
    policy = build_tiny_model(seed=0, vocab_size=VOCAB)
    batch = collate_pairs(rows, "pad")
    leaky = {k: batch[k] for k in ("input_ids",)}
    with torch.no_grad():
        lp_leak = pair_logps(policy(**leaky, use_cache=False).logits, batch)
        c, r, *_ = _padded(policy, pairs)
    pc, pr, *_ = _by_pair(lp_leak, list(range(len(pairs))))
    assert (pr - r).abs().max().item() > 1e-2  # the rejected side saw the chosen one


def test_reward_loss_at_last_tokens_matches_padded(packed):
    pairs, rows = packed
    model = build_tiny_model(seed=2, vocab_size=VOCAB)
    head = torch.nn.Linear(model.config.hidden_size, 1, bias=False)
    torch.nn.init.normal_(head.weight, std=0.5, generator=torch.Generator().manual_seed(0))
    batch = collate_pairs(rows, "flatten")
    out = model(**model_inputs(batch), output_hidden_states=True)
    scores = last_token_scores(head(out.hidden_states[-1]), batch)
    order = torch.argsort(batch["pair_index"][0::2])
    packed_loss = reward_loss(scores)[order]

    collator = trl_dpo.DataCollatorForPreference(pad_token_id=0)
    b = collator(
        [
            {
                "prompt_ids": p["prompt_input_ids"],
                "chosen_ids": p["chosen_input_ids"],
                "rejected_ids": p["rejected_input_ids"],
            }
            for p in pairs
        ]
    )
    hidden = model(
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        output_hidden_states=True,
        use_cache=False,
    ).hidden_states[-1]
    last = b["attention_mask"].sum(1) - 1  # a padded reward model's pooled token
    padded_scores = head(hidden)[torch.arange(len(last)), last, 0]
    n = len(pairs)
    expected = -torch.nn.functional.logsigmoid(padded_scores[:n] - padded_scores[n:])
    torch.testing.assert_close(packed_loss, expected, rtol=0, atol=1e-5)


def test_segment_logps_on_a_known_row():
    """Hand-made logits: each segment sums exactly its own targets, prompts excluded."""
    row = {
        "input_ids": np.array([5, 6, 7, 8, 5, 6, 9], np.int32),
        "labels": np.array([-100, -100, 7, 8, -100, -100, 9], np.int32),
        "position_ids": np.array([0, 1, 2, 3, 0, 1, 2], np.int32),
        "cu_seqlens": np.array([0, 4, 7], np.int32),
        "sample_index": np.array([6, 7]),
        "num_loss_tokens": 3,
    }
    batch = collate_pairs([row])
    assert batch["segment_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1]]
    assert batch["pair_index"].tolist() == [3, 3] and batch["pair_side"].tolist() == [0, 1]
    logits = torch.zeros(1, 7, 10)
    logits[0, 1, 7] = logits[0, 2, 8] = logits[0, 5, 9] = 3.0
    logps, counts = segment_logps(logits, batch)
    expected_one = torch.log_softmax(logits[0, 1], -1)[7]
    torch.testing.assert_close(logps, torch.stack([2 * expected_one, expected_one]))
    assert counts.tolist() == [2.0, 1.0]


def test_collate_refuses_broken_pairs():
    row = {
        "input_ids": np.arange(4, dtype=np.int32),
        "labels": np.array([-100, 1, -100, 3], np.int32),
        "position_ids": np.array([0, 1, 0, 1], np.int32),
        "cu_seqlens": np.array([0, 2, 4], np.int32),
        "num_loss_tokens": 2,
    }
    with pytest.raises(ValueError, match="whole pairs, chosen then rejected"):
        collate_pairs([{**row, "sample_index": np.array([7, 6])}])  # sides swapped
    with pytest.raises(ValueError, match="sides are not adjacent"):
        collate_pairs([{**row, "sample_index": np.array([6, 9])}])
    with pytest.raises(ValueError, match="unknown loss_type"):
        dpo_loss(
            pair_logps(torch.zeros(1, 4, 8), collate_pairs([{**row, "sample_index": [6, 7]}])),
            loss_type="x",
        )


@pytest.mark.parametrize("mode", ["flatten", "pad"])
def test_rows_padded_to_l_give_the_same_pair_logps(packed, tmp_path, mode):
    """Stored padding (`--pad`) belongs to no segment: the same log-probabilities per pair."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs, rows = packed
    ids = pa.list_(pa.int32())
    pq.write_table(
        pa.table({k: pa.array([p[k] for p in pairs], ids) for k in pairs[0]}),
        tmp_path / "p.parquet",
    )
    pack(tmp_path / "p.parquet", tmp_path / "o", PackConfig(max_len=64, pairs=True, pad=True))
    ds = PackedDataset(tmp_path / "o")
    padded_rows = [ds[i] for i in range(len(ds))]
    assert all(len(r["input_ids"]) == 64 for r in padded_rows)
    model = build_tiny_model(seed=0, vocab_size=VOCAB)
    with torch.no_grad():
        a = collate_pairs(rows, mode)
        b = collate_pairs(padded_rows, mode)
        assert (b["segment_ids"] == -1).any() or mode == "flatten"
        lp_a = pair_logps(model(**model_inputs(a)).logits, a)
        lp_b = pair_logps(model(**model_inputs(b)).logits, b)
    order = list(range(len(pairs)))
    for x, y in zip(_by_pair(lp_a, order), _by_pair(lp_b, order)):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-4)
