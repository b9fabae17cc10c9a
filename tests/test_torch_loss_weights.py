"""`collate_packed(..., loss_weighting=...)`: the weighted packed loss equals the unpacked loss of
the chosen kind, on a tiny model, in both layouts and across micro-batches."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402
from test_torch_isolation import VOCAB, make_rows  # noqa: E402

from packer.torch import collate_packed, model_inputs, step_loss_tokens, sum_token_loss  # noqa: E402
from packer.torch.tiny_model import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LENGTHS = ((5, 17, 4), (9, 6), (21,), (3, 3, 8, 2))


def rows_with_masks(lengths=LENGTHS, seed=1) -> list[dict]:
    """Packed rows with SFT-like masks: each sample's prompt is -100, one sample has no target."""
    rows = make_rows(lengths, seed=seed)
    rng = np.random.default_rng(seed)
    for r, row in enumerate(rows):
        cu = row["cu_seqlens"]
        for j, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
            prompt = b - a if (r, j) == (1, 1) else int(rng.integers(1, max(b - a, 2)))
            row["labels"][a : a + prompt] = -100
        row["num_loss_tokens"] = int((row["labels"] != -100).sum())
    return rows


def unpacked_losses(model, rows) -> list[tuple[float, int]]:
    """(summed token loss, targets) of every sample run alone, the shift within the sample."""
    out = []
    with torch.no_grad():
        for row in rows:
            cu = row["cu_seqlens"]
            for a, b in zip(cu[:-1], cu[1:]):
                ids = torch.as_tensor(row["input_ids"][a:b])[None]
                labels = torch.as_tensor(row["labels"][a:b])
                logits = model(input_ids=ids, use_cache=False).logits[0]
                ce = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")
                out.append((float(ce), int((labels[1:] != -100).sum())))
    return out


def expected(losses, kind: str) -> float:
    if kind == "token":  # one mean over the concatenated samples' targets
        return sum(s for s, _ in losses) / sum(n for _, n in losses)
    per_sample = [s / n for s, n in losses if n]  # the mean of each sample's mean
    return sum(per_sample) / len(per_sample)


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(seed=0, vocab_size=VOCAB, hidden_size=32)


@pytest.mark.parametrize("mode", ["flatten", "pad"])
@pytest.mark.parametrize("kind", ["token", "sample"])
def test_weighted_packed_loss_equals_the_unpacked_loss(model, mode, kind):
    rows = rows_with_masks()
    batch = collate_packed(rows, mode, loss_weighting=kind)
    with torch.no_grad():
        logits = model(**model_inputs(batch)).logits
    got = float(sum_token_loss(logits, batch["labels"], loss_weights=batch["loss_weights"]))
    got /= batch["num_items_in_batch"]
    losses = unpacked_losses(model, rows)
    assert got == pytest.approx(expected(losses, kind), rel=1e-5)
    samples = sum(1 for _, n in losses if n)
    assert batch["num_items_in_batch"] == (batch["num_loss_tokens"] if kind == "token" else samples)
    # the two kinds differ on these rows: the check can tell them apart
    assert abs(expected(losses, "token") - expected(losses, "sample")) > 1e-3


def test_token_weighting_is_what_transformers_computes(model):
    batch = collate_packed(rows_with_masks(), "flatten", loss_weighting="token")
    with torch.no_grad():
        out = model(**model_inputs(batch), num_items_in_batch=batch["num_items_in_batch"])
    ours = sum_token_loss(out.logits, batch["labels"], loss_weights=batch["loss_weights"])
    assert float(ours / batch["num_items_in_batch"]) == pytest.approx(float(out.loss), rel=1e-5)


def test_sample_weighting_across_micro_batches(model):
    """Two micro-batches of one step: dividing by the step's num_items_in_batch gives the mean of
    every sample's mean over the whole step."""
    rows = rows_with_masks()
    parts = [rows[:2], rows[2:]]
    batches = [collate_packed(p, "flatten", loss_weighting="sample") for p in parts]
    n = step_loss_tokens(batches, key="num_items_in_batch", all_reduce=False)
    total = 0.0
    with torch.no_grad():
        for b in batches:
            logits = model(**model_inputs(b)).logits
            total += float(sum_token_loss(logits, b["labels"], loss_weights=b["loss_weights"])) / n
    assert total == pytest.approx(expected(unpacked_losses(model, rows), "sample"), rel=1e-5)
    assert step_loss_tokens(batches, all_reduce=False) == sum(r["num_loss_tokens"] for r in rows)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=4),
    st.integers(0, 1000),
    st.sampled_from(["flatten", "pad"]),
)
def test_weights_sum_to_one_per_sample(lengths, seed, mode):
    rows = rows_with_masks(lengths, seed=seed)
    batch = collate_packed(rows, mode, loss_weighting="sample")
    w, labels = batch["loss_weights"], batch["labels"]
    assert w.shape == labels.shape and w.dtype == torch.float32
    assert bool((w[labels == -100] == 0).all()) and bool((w[labels != -100] > 0).all())
    assert float(w.sum()) == pytest.approx(batch["num_items_in_batch"], abs=1e-4)
    for r, row_idx in enumerate(batch["seq_idx"]):  # each sample's weights: 1, or 0 untrained
        for j in row_idx.unique().tolist():
            sample = row_idx == j
            trained = bool((labels[r][sample] != -100).any())
            assert float(w[r][sample].sum()) == pytest.approx(float(trained), abs=1e-5)
    token = collate_packed(rows, mode, loss_weighting="token")
    assert torch.equal(token["loss_weights"], (labels != -100).float())
    assert token["num_items_in_batch"] == batch["num_loss_tokens"]


def test_unknown_weighting_is_refused():
    with pytest.raises(ValueError, match=r"^loss_weighting: unknown 'mean' \(choose from token, "):
        collate_packed(make_rows(), loss_weighting="mean")
    assert "loss_weights" not in collate_packed(make_rows())
