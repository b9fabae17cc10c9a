"""The tiny model behind `--model-check` (and the training example): built offline, seeded."""

from __future__ import annotations

import inspect

import torch

from packer.tiny_model import build_tiny_model


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
