"""A tiny transformers model on collated packed batches: loss == mean of per-sample losses.

CPU, fp32, sdpa. There is no flash-attention on CPU, so isolation comes from one of two paths,
each tested on its own:

- `position_ids`: the batch goes to the model as collated, with no `attention_mask`; transformers
  (masking_utils.find_packed_sequence_indices) detects the restarts in `position_ids` and builds
  a block-diagonal causal mask. This is transformers' own packed-sequence path.
- `block_mask`: `block_causal_mask(batch)` builds the 4D mask from the batch's cu_seqlens, which
  transformers uses as-is; this checks the boundaries the collator hands to varlen kernels.

The reference runs each packed sample alone, from the source data (not from the shards), with its
first label set to -100 as the contract requires, and weights samples by their loss tokens.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402

import packer  # noqa: E402
from packer.torch import (  # noqa: E402
    PackedDataset,
    block_causal_mask,
    collate_packed,
    model_inputs,
    step_loss_tokens,
    sum_token_loss,
)
from packer.torch.tiny_model import build_tiny_model  # noqa: E402

TOL = 1e-5  # on token-mean losses (~6.9 = ln 1000)
SUM_TOL = 5e-5  # on one sample's summed token loss (up to ~50 tokens; fp32 error seen <= 1e-5)
VOCAB = 1000
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("model")
    # SFT-style labels (masked prompts); a few samples longer than a row, split across rows
    samples = make_samples(40, seed=11, median=16, vocab=VOCAB)
    src = write_jsonl(root / "in.jsonl", samples)
    # the plan's row order: the negative control's per-sample margins were measured on these rows
    config = packer.PackConfig(max_len=80, overlength="split", row_order="plan")
    packer.pack([src], root / "out", config)
    ds = PackedDataset(root / "out")
    model = build_tiny_model(seed=0, vocab_size=VOCAB, hidden_size=32, max_positions=256)
    return samples, ds, model


def _rows(ds, which=(0, -1, 3, 5)):
    return [ds[i] for i in which]  # includes the last, shortest row, so `pad` pads


def _per_sample_reference(model, samples, rows) -> list[tuple[float, int]]:
    """(summed token loss, loss tokens) of every packed sample run alone, in packed order."""
    out = []
    for row in rows:
        cu = row["cu_seqlens"][: len(row["sample_index"]) + 1]
        for index, offset, n in zip(row["sample_index"], row["sample_offset"], cu[1:] - cu[:-1]):
            sample = samples[int(index)]
            ids = torch.tensor(sample["input_ids"][offset : offset + n])[None]
            labels = torch.tensor(sample["labels"][offset : offset + n])[None]
            labels[0, 0] = -100
            with torch.no_grad():
                logits = model(input_ids=ids).logits
            out.append((sum_token_loss(logits, labels).item(), int((labels != -100).sum())))
    return out


def _mean(per_sample: list[tuple[float, int]]) -> float:
    """Token-weighted mean: every loss token counts once, whichever sample it is in."""
    return sum(s for s, _ in per_sample) / sum(n for _, n in per_sample)


def _segments(batch, rows) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of every packed sample in a collated batch, in packed order."""
    if "cu_seq_lens_q" in batch:
        cu = batch["cu_seq_lens_q"].tolist()
        return [(0, a, b) for a, b in zip(cu, cu[1:])]
    return [
        (i, int(a), int(b))
        for i, row in enumerate(rows)
        for a, b in zip(
            row["cu_seqlens"][: len(row["sample_index"])],
            row["cu_seqlens"][1 : len(row["sample_index"]) + 1],
        )
    ]


def _packed_per_sample(model, batch, rows, path: str) -> list[tuple[float, int]]:
    """(summed token loss, loss tokens) of every sample, read off one forward of the batch."""
    inputs = model_inputs(batch)
    labels = inputs.pop("labels")
    if path == "position_ids":
        mask = None  # transformers finds the samples in position_ids on its own
    elif path == "block_mask":
        mask = block_causal_mask(batch)
    else:  # "plain_causal": the negative control, no sample boundaries at all
        b, t = labels.shape
        mask = torch.ones(t, t, dtype=torch.bool).tril().expand(b, 1, t, t)
    with torch.no_grad():
        logits = model(**inputs, attention_mask=mask).logits
    # token loss aligned with labels: position t is predicted by the logits at t - 1
    token_loss = torch.zeros(labels.shape)
    token_loss[:, 1:] = F.cross_entropy(
        logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100, reduction="none"
    )
    return [
        (token_loss[r, a:b].sum().item(), int((labels[r, a:b] != -100).sum()))
        for r, a, b in _segments(batch, rows)
    ]


def _hf_loss(model, batch) -> float:
    """What a trainer computes: every key the collator returns, no attention_mask, no cache
    (Trainer sets `config.use_cache = False`; TRL passes `use_cache=False`)."""
    with torch.no_grad():
        return model(
            **batch, use_cache=False, num_items_in_batch=batch["num_loss_tokens"]
        ).loss.item()


@pytest.mark.parametrize("mode", ["flatten", "pad"])
@pytest.mark.parametrize("path", ["position_ids", "block_mask"])
def test_packed_loss_equals_per_sample_mean(setup, mode, path):
    samples, ds, model = setup
    rows = _rows(ds)
    batch = collate_packed(rows, mode)
    reference = _per_sample_reference(model, samples, rows)
    packed = _packed_per_sample(model, batch, rows, path)
    assert len(reference) >= 8
    assert [n for _, n in packed] == [n for _, n in reference]  # same token weighting
    assert batch["num_loss_tokens"] == sum(n for _, n in reference)
    assert abs(_mean(packed) - _mean(reference)) <= TOL
    for (got, _), (want, _) in zip(packed, reference):
        assert abs(got - want) <= SUM_TOL  # each sample, not just the mean
    if path == "position_ids":
        assert abs(_hf_loss(model, batch) - _mean(reference)) <= TOL


@pytest.mark.parametrize("mode", ["flatten", "pad"])
def test_negative_control_plain_causal_leaks(setup, mode):
    """Without the boundaries the same batch gives other losses, so the test above can fail."""
    samples, ds, model = setup
    rows = _rows(ds)
    batch = collate_packed(rows, mode)
    reference = _per_sample_reference(model, samples, rows)
    leaked = _packed_per_sample(model, batch, rows, "plain_causal")
    assert abs(_mean(leaked) - _mean(reference)) > TOL
    # a random tiny model barely uses context, so the mean moves little; per sample it is clear.
    # The leak is attention's: a sample at the start of a batch row has nothing before it to
    # see (in `flatten` only the batch's first sample), every later one sees its neighbours.
    diffs = [abs(got - want) for (got, _), (want, _) in zip(leaked, reference)]
    for (_, start, _), (_, n), diff in zip(_segments(batch, rows), reference, diffs):
        if start == 0:
            assert diff <= SUM_TOL
        elif n:
            assert diff > 20 * SUM_TOL  # seen: 3e-3 to 0.17
    assert max(diffs) > 1e-2


def test_flatten_batch_passes_transformers_packed_path(setup):
    """A collate_packed batch, as is, through transformers: kwargs well-formed, samples isolated."""
    samples, ds, model = setup
    rows = _rows(ds, (1, 2, 4))
    batch = collate_packed(rows, "flatten")
    t = batch["input_ids"].shape[1]
    cu = batch["cu_seq_lens_q"]
    assert cu.dtype == torch.int32 and cu.is_contiguous() and int(cu[0]) == 0 and int(cu[-1]) == t
    assert torch.equal(batch["cu_seq_lens_k"], cu)
    assert isinstance(batch["max_length_q"], int) and isinstance(batch["max_length_k"], int)
    assert batch["max_length_q"] == batch["max_length_k"] == int(cu.diff().max())
    assert "attention_mask" not in batch  # a 2D mask would switch transformers' detection off
    reference = _mean(_per_sample_reference(model, samples, rows))
    # every key the collator returns, num_loss_tokens included, as a Trainer passes them (with
    # use_cache=False, as Trainer and TRL set it); the default transformers loss is the mean
    # over shifted targets, which num_loss_tokens counts
    with torch.no_grad():
        loss = model(**batch, use_cache=False).loss.item()
        cached = model(**batch).loss.item()  # the config's use_cache=True: a cache is built
    assert abs(loss - reference) <= TOL
    # with a cache transformers skips its packed-sample detection: the samples leak
    assert abs(cached - reference) > TOL
    # the same batch with positions that do not restart is one sequence to transformers
    plain = dict(batch, position_ids=torch.arange(t)[None])
    with torch.no_grad():
        assert abs(model(**plain, use_cache=False).loss.item() - loss) > TOL


def test_gradient_accumulation_weights_every_token_once(setup):
    """Micro-batch losses scaled by the step's loss tokens == one batch of all rows, grads too."""
    _, ds, model = setup
    micro = [collate_packed([ds[0]], "flatten"), collate_packed([ds[-1], ds[2]], "pad")]
    assert micro[0]["num_loss_tokens"] != micro[1]["num_loss_tokens"]
    n = step_loss_tokens(micro)

    def grads_of(losses_fn):
        model.zero_grad(set_to_none=True)
        loss = losses_fn()
        return loss, [p.grad.clone() for p in model.parameters()]

    def accumulated():
        total = 0.0
        for batch in micro:
            loss = model(**model_inputs(batch), num_items_in_batch=n).loss
            loss.backward()
            total += loss.item()
        return total

    def whole():
        batch = collate_packed([ds[0], ds[-1], ds[2]], "flatten")
        assert batch["num_loss_tokens"] == n
        loss = model(**model_inputs(batch), num_items_in_batch=n).loss
        loss.backward()
        return loss.item()

    acc_loss, acc_grads = grads_of(accumulated)
    one_loss, one_grads = grads_of(whole)
    model.zero_grad(set_to_none=True)
    assert abs(acc_loss - one_loss) <= TOL
    for a, b in zip(acc_grads, one_grads):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_train_tiny_script_runs(tmp_path, monkeypatch, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(30, seed=2, median=30, vocab=32000))
    out = tmp_path / "out"
    packer.pack([src], out, packer.PackConfig(max_len=64, overlength="split"))
    script = ROOT / "scripts" / "train_tiny.py"
    monkeypatch.setattr(
        sys, "argv", [str(script), "--packed", str(out), "--steps", "2", "--mode", "pad"]
    )
    runpy.run_path(str(script), run_name="__main__")  # in-process: torch is already imported
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step")]
    assert len(lines) == 2
    losses = [float(ln.split("loss")[1].split()[0]) for ln in lines]
    assert all(9.0 < x < 12.0 for x in losses)  # about ln(32000) for random tokens
