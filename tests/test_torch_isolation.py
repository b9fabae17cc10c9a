"""check_isolation on models left at the library defaults (`use_cache=True`), every path a loop
can take: sdpa and eager, train and eval, gradient checkpointing on and off, and the calls a loop
might make. Each case either isolates (measured here independently of check_isolation) or
check_isolation raises; the README's call (`model(**model_inputs(batch))`) always isolates."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packer.torch import (  # noqa: E402
    IsolationError,
    block_causal_mask,
    check_isolation,
    collate_packed,
    model_inputs,
)
from packer.torch.isolation import TOLERANCE  # noqa: E402
from packer.torch.tiny_model import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 100
LEAK = 1e-3  # an independent leak measurement above this is a leak (isolated runs: ~1e-7)


def make_rows(lengths=((5, 7, 4), (9, 6), (8,)), seed=1) -> list[dict]:
    """Packed rows as PackedDataset gives them: first label of every sample -100."""
    rng = np.random.default_rng(seed)
    rows = []
    for lens in lengths:
        ids = rng.integers(0, VOCAB, sum(lens))
        cu = np.cumsum([0, *lens])
        labels = ids.copy()
        labels[cu[:-1]] = -100
        rows.append(
            {
                "input_ids": ids,
                "labels": labels,
                "position_ids": np.concatenate([np.arange(n) for n in lens]),
                "cu_seqlens": cu,
                "sample_index": np.arange(len(lens)),
                "sample_offset": np.zeros(len(lens), np.int64),
                "num_loss_tokens": int((labels != -100).sum()),
            }
        )
    return rows


def tiny(attn: str, train: bool = False, checkpointing: bool = False):
    model = build_tiny_model(seed=0, vocab_size=VOCAB, hidden_size=32, attn_implementation=attn)
    assert model.config.use_cache is True  # the library default, as from_pretrained gives it
    if checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
    return model.train(train)


# the calls a training loop might make; each takes (model, batch)
CALLS = {
    "model_inputs": lambda m, b: m(**model_inputs(b)),  # the README loop
    "whole_batch": lambda m, b: m(
        **{k: v for k, v in b.items() if k != "num_loss_tokens"}
    ),  # no use_cache=False
    "float_mask": lambda m, b: m(**model_inputs(b), attention_mask=block_causal_mask(b)),
    "bool_mask": lambda m, b: m(
        **model_inputs(b), attention_mask=block_causal_mask(b, dtype=torch.bool)
    ),
    "mask_2d": lambda m, b: m(**model_inputs(b), attention_mask=torch.ones_like(b["input_ids"])),
}


def independent_leak(model, batch, call) -> float:
    """Largest |packed - alone| logit over the batch's samples: alone = the sample by itself,
    eval mode, no cache, no mask (independent of check_isolation's own alone runs)."""
    with torch.no_grad():
        packed = call(model, batch).logits
        was = model.training
        model.eval()
        try:
            worst = 0.0
            if "cu_seq_lens_q" in batch:
                cu = batch["cu_seq_lens_q"].tolist()
                spans = [(0, a, b) for a, b in zip(cu, cu[1:])]
            else:
                spans = [
                    (r, a, b)
                    for r, cu in enumerate(batch["cu_seqlens"].tolist())
                    for a, b in zip(cu, cu[1:])
                    if b > a and (batch["labels"][r, a:b] != -100).any()
                ]
            for r, a, b in spans:
                alone = model(input_ids=batch["input_ids"][r : r + 1, a:b], use_cache=False)
                worst = max(worst, float((packed[r, a:b] - alone.logits[0]).abs().max()))
        finally:
            model.train(was)
    return worst


CASES = list(itertools.product(["sdpa", "eager"], [False, True], [False, True], ["flatten", "pad"]))


@pytest.mark.parametrize(("attn", "train", "checkpointing", "mode"), CASES)
def test_every_path_isolates_or_is_caught(attn, train, checkpointing, mode):
    model = tiny(attn, train, checkpointing)
    batch = collate_packed(make_rows(), mode)
    outcomes = {}
    for name, call in CALLS.items():
        leak = independent_leak(model, batch, call)
        assert leak < 1e-5 or leak > LEAK, (name, leak)  # no borderline case
        try:
            report = check_isolation(model, batch, forward=call)
        except IsolationError as exc:
            assert leak > LEAK, f"{name}: flagged without a leak ({leak:.3g}): {exc}"
            assert "batch row " in str(exc) and "tolerance" in str(exc)
            outcomes[name] = "caught"
        else:
            assert leak < 1e-5, f"{name}: a leak of {leak:.3g} was not caught"
            assert report.ok and report.max_logits_diff < 1e-5 and report.samples >= 5
            outcomes[name] = "isolates"
        assert model.training is train  # the model's mode is left as it was
    assert outcomes["model_inputs"] == outcomes["float_mask"] == "isolates"
    assert outcomes["mask_2d"] == "caught"
    # eager adds a boolean mask to the scores as 1 / 0: it masks nothing
    assert outcomes["bool_mask"] == ("caught" if attn == "eager" else "isolates")
    # with a cache transformers skips its packed-sample detection. Gradient checkpointing in
    # train mode switched the cache off on its own up to transformers 5.23 (no leak), not from
    # 5.24 on (a leak): either way the check agrees with the measurement above
    if not (train and checkpointing):
        assert outcomes["whole_batch"] == "caught"


def test_default_call_catches_a_cache_leak_it_would_get_without_model_inputs():
    """The default forward is model(**model_inputs(batch)); model_inputs carries use_cache=False."""
    model = tiny("sdpa")
    batch = collate_packed(make_rows(), "flatten")
    assert model_inputs(batch)["use_cache"] is False
    assert set(model_inputs(batch)) >= {"input_ids", "labels", "position_ids", "cu_seq_lens_q"}
    report = check_isolation(model, batch)
    assert report.ok and report.samples == 6 and report.samples_after_first == 5
    assert report.dtype == "float32" and report.tolerance == TOLERANCE[torch.float32]


def test_two_dimensional_attention_mask_is_caught_with_a_clear_message():
    model = tiny("sdpa", train=True)
    batch = collate_packed(make_rows(), "pad")

    def with_2d_mask(m, b):
        mask = torch.ones_like(b["input_ids"])
        return m(**model_inputs(b), attention_mask=mask)

    with pytest.raises(IsolationError) as info:
        check_isolation(model, batch, forward=with_2d_mask)
    report = info.value.report
    assert not report.ok and report.max_logits_diff > 10 * report.tolerance
    # the first sample of each row cannot leak: only later ones are named
    named = [f.split(":")[0] for f in report.failures]
    assert "batch row 0, sample 1 (tokens 5..11)" in named
    assert all("tokens 0.." not in n for n in named)
    msg = str(info.value)
    assert msg.startswith("batch row 0, sample 1 (tokens 5..11): packed vs alone, the logits")
    assert "tolerance 0.0001 for float32" in msg and "more sample(s)" in msg
    # raise_on_failure=False returns the same verdict
    again = check_isolation(model, batch, forward=with_2d_mask, raise_on_failure=False)
    assert again.failures == report.failures


def test_label_crossing_a_boundary_is_caught():
    rows = make_rows()
    rows[0]["labels"][5] = rows[0]["input_ids"][5]  # sample 1's first token becomes a target
    batch = collate_packed(rows, "flatten")
    with pytest.raises(IsolationError, match=r"batch row 0, sample 1 \(tokens 5..11\): the packed"):
        check_isolation(tiny("sdpa"), batch)


def test_dropout_is_held_at_zero_and_restored():
    model = tiny("eager", train=True)
    model.config.attention_dropout = 0.5
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    extra = torch.nn.Dropout(0.3)
    model.model.add_module("extra_dropout", extra)
    batch = collate_packed(make_rows(), "flatten")
    report = check_isolation(model, batch)
    assert report.ok and report.max_logits_diff < 1e-5
    assert all(layer.self_attn.attention_dropout == 0.5 for layer in model.model.layers)
    assert extra.p == 0.3
    # the dropout was live: two forwards in train mode differ
    with torch.no_grad():
        a, b = (model(**model_inputs(batch)).logits for _ in range(2))
    assert not torch.equal(a, b)


def test_bf16_model_uses_the_bf16_tolerance():
    model = tiny("sdpa").to(torch.bfloat16)
    batch = collate_packed(make_rows(), "flatten")
    report = check_isolation(model, batch)
    assert report.dtype == "bfloat16" and report.tolerance == TOLERANCE[torch.bfloat16]
    with pytest.raises(IsolationError, match="for bfloat16"):
        check_isolation(model, batch, forward=CALLS["mask_2d"])


def test_needs_a_row_with_two_samples():
    batch = collate_packed(make_rows(((6,), (4,))), "pad")
    with pytest.raises(ValueError, match="two or more samples"):
        check_isolation(tiny("sdpa"), batch)


def test_block_causal_mask_dtypes():
    batch = collate_packed(make_rows(), "pad")
    mask = block_causal_mask(batch)
    assert mask.dtype == torch.float32 and mask.shape == (3, 1, 16, 16)
    allowed = block_causal_mask(batch, dtype=torch.bool)
    assert torch.equal(mask == 0, allowed)
    assert float(mask.min()) == torch.finfo(torch.float32).min
    half = block_causal_mask(batch, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half == 0, allowed)
    # row 0: samples at 0..4, 5..11, 12..15; token 5 sees only itself, token 4 sees 0..4
    assert allowed[0, 0, 5].nonzero().flatten().tolist() == [5]
    assert allowed[0, 0, 4].nonzero().flatten().tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="float dtype"):
        block_causal_mask(batch, dtype=torch.int64)
