"""The tiny model behind `--model-check` (and the training example), and the model check itself
run on rows built by hand, so each of its verdicts can be planted and read word for word."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from packer.torch.tiny_model import build_tiny_model
from packer.verify.model_check import run_model_check
from packer.verify.picked_rows import RowInput
from packer.verify.result import CheckResult


def test_build_tiny_model_signature_and_determinism():
    params = inspect.signature(build_tiny_model).parameters
    assert list(params)[:2] == ["seed", "vocab_size"]
    a = build_tiny_model(3, vocab_size=50, max_positions=64)
    b = build_tiny_model(3, 50, max_positions=64)
    c = build_tiny_model(4, vocab_size=50, max_positions=64)
    ids = torch.arange(10)[None]
    with torch.inference_mode():
        la, lb, lc = (m(ids, use_cache=False).logits for m in (a, b, c))
    assert torch.equal(la, lb) and not torch.equal(la, lc)
    assert la.shape == (1, 10, 50) and la.dtype == torch.float32 and not a.training
    assert a.config._attn_implementation == "sdpa"


def _row(lengths: list[int], start: int = 0, **columns) -> dict:
    """A correct packed row of samples of `lengths` (token ids counting up from `start + 1`),
    as `ShardArrays.row` gives it; `columns` replace columns after the fact."""
    ids = np.arange(start + 1, start + 1 + sum(lengths), dtype=np.int32)
    cu = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    labels = ids.copy()
    labels[cu[:-1]] = -100
    row = {
        "input_ids": ids,
        "labels": labels,
        "position_ids": np.concatenate([np.arange(n) for n in lengths]).astype(np.int32),
        "cu_seqlens": cu,
        "sample_index": np.arange(10, 10 + len(lengths), dtype=np.int64),
        "sample_offset": np.zeros(len(lengths), np.int32),
        "num_loss_tokens": int(sum(lengths) - len(lengths)),
    }
    row.update(columns)
    return row


def _check(rows: list[dict], seed: int = 0) -> CheckResult:
    result = CheckResult("model")
    run_model_check([RowInput("s.arrow", 3 + i, r) for i, r in enumerate(rows)], seed, result)
    return result


def test_model_check_without_rows_is_not_run():
    result = _check([])
    assert (result.ran, result.skipped_reason, result.details) == (
        False,
        "no usable row to run",
        {},
    )


def test_model_check_details_name_the_model_and_its_measures():
    result = _check([_row([5, 6]), _row([7], start=40)], seed=2)
    assert result.ok and result.failures == []
    d = result.details
    assert d["model"] == "LlamaForCausalLM, 2 layers, hidden 64, vocab 49, random (seed 2)"
    assert (d["rows"], d["samples"]) == (2, 3)
    assert d["max_loss_diff"] < 1e-5 and d["max_logits_diff"] < 1e-4
    # one later sample (the 6 after the 5) is measured under the plain causal mask
    assert 1e-3 < d["control_min_logits_leak"] == d["control_max_logits_leak"]
    assert 0 < d["seconds"] < 120
    # the seed reaches the weights: the same rows under another seed see another leak
    rows = [_row([5, 6]), _row([7], start=40)]
    again, other = _check(rows, seed=2).details, _check(rows, seed=3).details
    assert again["control_min_logits_leak"] == d["control_min_logits_leak"]
    assert other["control_min_logits_leak"] != pytest.approx(d["control_min_logits_leak"], rel=1e-3)


def test_rows_of_single_samples_have_no_control_figure():
    d = _check([_row([9]), _row([4], start=20)]).details
    assert d["samples"] == 2
    assert d["control_min_logits_leak"] is None and d["control_max_logits_leak"] is None


def test_a_label_across_the_boundary_is_named():
    row = _row([5, 6])
    row["labels"][5] = row["input_ids"][5]  # sample 11's first token, trained from sample 10
    result = _check([row])
    [failure] = result.failures
    assert failure.to_dict() == {
        "check": "model",
        "message": "s.arrow row 3, sample 11 (tokens 5..10): the packed row trains 6 targets of "
        "this sample, alone it has 5: its first token is the target of the previous sample's "
        "last token",
        "shard": "s.arrow",
        "row": 3,
        "sample": 11,
        "segment": 1,
    }


def test_logits_that_leak_fail_even_where_no_label_is_trained():
    """cu_seqlens merges two samples, so the second attends to the first; its labels are all
    -100, so its loss is 0 both ways: only the logits show the leak."""
    row = _row([5, 6], cu_seqlens=np.array([0, 11], np.int32))
    row["labels"][5:] = -100
    result = _check([row])
    [failure] = result.failures
    assert failure.message.startswith(
        "s.arrow row 3, sample 11 (tokens 5..10): the tiny model's loss differs by 0 and its "
        "logits by "
    )
    assert failure.message.endswith(
        " between the packed row and the sample alone (tolerance 0.0001)"
    )
    assert (failure.sample, failure.segment) == (11, 1)
