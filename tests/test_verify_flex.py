"""FlexAttention in verify: the document BlockMask built from cu_seqlens block by block (equal
to create_block_mask's, without its T x T boolean mask), the power-of-two buckets that bound
compiled flex's recompiles, and the report of what ran (compiled on the CPU in a subprocess)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import python_script
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import flex_attention as flex_module

from packer.verify import attention as A
from packer.verify import forwards

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def reference_block_mask(cu, length):
    doc = forwards.segment_ids(cu, length)

    def document_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    return flex_module.create_block_mask(document_causal, None, None, length, length, "cpu")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 300), min_size=1, max_size=6).filter(lambda s: sum(s) > 0),
    st.booleans(),
)
def test_block_mask_equals_create_block_mask(lengths, bucketed):
    n = sum(lengths)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    length = forwards.bucket_length(n) if bucketed else n
    mine, ref = forwards.document_block_mask(cu, length, "cpu"), reference_block_mask(cu, length)
    assert torch.equal(mine.to_dense(), ref.to_dense())
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(mine, name), getattr(ref, name)), name
    assert mine.seq_lengths == (length, length)


def test_no_dense_mask_is_built(monkeypatch):
    """create_block_mask evaluates the mask_mod over all T x T pairs (1 GiB of booleans at 32k);
    the forward never calls it, nor create_mask."""

    def refuse(*args, **kwargs):
        raise AssertionError("a dense T x T mask was built")

    monkeypatch.setattr(flex_module, "create_block_mask", refuse)
    monkeypatch.setattr(flex_module, "create_mask", refuse)
    cu = torch.tensor([0, 100, 129, 300], dtype=torch.int32)
    q, k, v = A.qkv_from_tokens(np.arange(300), 0, "cpu", torch.float32)
    forward, call = forwards.make_flex_forward("cpu", compiled=False)
    out = forward(q, k, v, cu, 171)
    for a, b in [(0, 100), (100, 129), (129, 300)]:
        assert (out[a:b] - A.reference_attention(q[a:b], k[a:b], v[a:b])).abs().max() < 1e-5
    assert "document mask from cu_seqlens" in call
    blocks = forwards.document_block_mask(cu, 32_768, "cpu")
    assert blocks.kv_indices.numel() == (32_768 // 128) ** 2  # block flags, not tokens


def test_bucket_lengths():
    assert [forwards.bucket_length(n) for n in (1, 127, 128, 129, 4096, 4097, 32_768)] == [
        128,
        128,
        128,
        256,
        4096,
        8192,
        32_768,
    ]
    # every length up to 2^30 tokens has its bucket within the recompile limit verify sets
    assert forwards.bucket_length(2**30).bit_length() - 7 <= forwards.FLEX_BUCKETS


COMPILED = """
import json, numpy as np, torch
torch.set_num_threads(1)
from packer.verify import attention as A, backends, forwards
from packer.verify.picked_rows import RowInput
from packer.verify.result import CheckResult
def row(r, lengths):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return RowInput("s", r, {"input_ids": np.arange(cu[-1]) * 7 + r,
        "position_ids": np.concatenate([np.arange(n) for n in lengths]), "cu_seqlens": cu,
        "sample_index": np.arange(len(lengths)), "sample_offset": np.zeros(len(lengths))})
report = {}
forward, call = forwards.make_flex_forward("cpu", compiled=True, report=report)
backend = backends.Backend("flex", "cpu", forward, call, backends.DTYPES, report)
rows = [row(0, [7, 9, 4]), row(1, [12, 3])]  # 20 and 15 tokens: one bucket (128)
iso, ctl = CheckResult("attention"), CheckResult("negative_control")
A.run_attention(rows, backend, "fp32", 0, iso, ctl)
first = dict(report)
cu = torch.tensor([0, 90, 200], dtype=torch.int32)  # 200 tokens: the 256 bucket
q, k, v = A.qkv_from_tokens(np.arange(200), 0, "cpu", torch.float32)
out = forward(q, k, v, cu, 110)
for n in (130, 180, 200):  # the same bucket again: no recompile
    c = torch.tensor([0, n], dtype=torch.int32)
    forward(q[:n], k[:n], v[:n], c, n)
diff = max(float((out[a:b] - A.reference_attention(q[a:b], k[a:b], v[a:b])).abs().max())
           for a, b in [(0, 90), (90, 200)])
print(json.dumps({"iso": iso.to_dict(),
                  "ok": [iso.ok, ctl.ok], "first": first, "report": report, "diff": diff}))
"""


def test_compiled_flex_compiles_once_per_bucket_and_says_so():
    res = python_script(COMPILED, check=True, timeout=600)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["ok"] == [True, True] and got["diff"] < 1e-5
    first, report = got["first"], got["report"]
    assert first["compiled"] is True and first["lengths"] == [128] and first["compiles"] == 1
    assert report["lengths"] == [128, 256] and report["compiles"] == 2  # 4 more calls, 1 graph
    assert report["calls"] == first["calls"] + 4 and report["recompile_limit"] >= 24
    assert got["iso"]["kernel"] == first  # what verify's report shows


def test_the_human_report_says_what_compiled_flex_did():
    from rich.console import Console

    from packer.cli.render_verify import verify_table
    from packer.verify.result import CheckResult, VerifyResult

    details = {"backend": "flex", "device": "cuda", "dtype": "bf16", "rows": 2, "samples": 5}
    kernel = {"compiled": True, "compiles": 2, "lengths": [128, 4096], "calls": 9}
    checks = {"attention": CheckResult("attention", details={**details, "kernel": kernel})}
    console = Console(record=True, width=400, color_system=None)
    console.print(verify_table(VerifyResult("o", checks)))
    text = " ".join(console.export_text().split())
    assert "s per million tokens; compiled: 2 compiles for lengths 128, 4,096 │" in text
    eager = {**details, "kernel": {**kernel, "compiled": False, "compiles": 0}}
    console = Console(record=True, width=400, color_system=None)
    console.print(
        verify_table(VerifyResult("o", {"attention": CheckResult("attention", details=eager)}))
    )
    assert "compiled:" not in console.export_text()
