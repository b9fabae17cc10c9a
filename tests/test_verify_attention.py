"""The attention backend ladder on the CPU: selection, signature adapters with fake kernels,
FlexAttention and the reference, and that both a leaking kernel and a blind check fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import python_script

from packer.errors import UsageError
from packer.verify import attention as A
from packer.verify import backends, forwards, picked_rows
from packer.verify.result import CheckResult
from packer.verify.tolerance import tolerance

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------------------------
# Signature adapters: torch 2.10 (is_causal=) and 2.11+ (window_size=) varlen_attn


def fake_varlen_2_10(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    return_aux=None,
    is_causal=False,
    scale=None,
):
    fake_varlen_2_10.calls.append(
        {"cu_q": cu_seq_q, "cu_k": cu_seq_k, "max_q": max_q, "max_k": max_k, "is_causal": is_causal}
    )
    return query


def fake_varlen_2_11(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    return_aux=None,
    scale=None,
    window_size=(-1, -1),
    enable_gqa=False,
):
    fake_varlen_2_11.calls.append({"cu_q": cu_seq_q, "max_q": max_q, "window_size": window_size})
    return key


def fake_varlen_unknown(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None):
    return query


def test_varlen_call_form_from_signature():
    assert forwards.varlen_call_form(fake_varlen_2_10) == "is_causal"
    assert forwards.varlen_call_form(fake_varlen_2_11) == "window_size"
    with pytest.raises(UsageError, match="neither window_size= nor is_causal="):
        forwards.varlen_call_form(fake_varlen_unknown)
    assert forwards.varlen_causal_kwargs("window_size") == {"window_size": (-1, 0)}
    assert forwards.varlen_causal_kwargs("is_causal") == {"is_causal": True}


def test_varlen_forward_passes_causal_in_each_form():
    q, k, v = (torch.full((5, 2, 8), float(i)) for i in range(3))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    fake_varlen_2_10.calls = []
    fwd, call = forwards.make_varlen_forward(fake_varlen_2_10)
    assert fwd(q, k, v, cu, np.int64(3)) is q
    [c] = fake_varlen_2_10.calls
    assert c["is_causal"] is True and c["cu_q"] is cu and c["cu_k"] is cu
    assert c["max_q"] == c["max_k"] == 3 and type(c["max_q"]) is int  # Python ints, not numpy
    assert "is_causal=True" in call

    fake_varlen_2_11.calls = []
    fwd, call = forwards.make_varlen_forward(fake_varlen_2_11)
    assert fwd(q, k, v, cu, 3) is k
    [c] = fake_varlen_2_11.calls
    assert c["window_size"] == (-1, 0)  # (-1, -1), the default, would not be causal
    assert "window_size=(-1, 0)" in call


def test_installed_torch_varlen_signature_is_understood():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        pytest.skip("this torch has no torch.nn.attention.varlen")
    assert forwards.varlen_call_form(varlen_attn) in ("window_size", "is_causal")


def test_flash_attn_and_aten_adapters():
    seen = {}

    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_q,
        max_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
    ):
        seen.update(
            cu_q=cu_q,
            cu_k=cu_k,
            max_q=max_q,
            dropout_p=dropout_p,
            causal=causal,
            softmax_scale=softmax_scale,
        )
        return v

    q = torch.zeros(3, 1, 8)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    fwd, _ = forwards.make_flash_attn_forward(flash_attn_varlen_func)
    assert fwd(q, q, q + 1, cu, 3).sum() == 24
    assert seen == {
        "cu_q": cu,
        "cu_k": cu,
        "max_q": 3,
        "dropout_p": 0.0,
        "causal": True,
        "softmax_scale": None,
    }

    def aten_op(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, return_debug_mask):
        seen.update(aten=(dropout_p, is_causal, return_debug_mask))
        return (v, None, None, None, None)

    fwd, _ = forwards.make_aten_flash_forward(aten_op)
    assert fwd(q, q, q + 2, cu, 3).sum() == 48 and seen["aten"] == (0.0, True, False)


def test_adapters_pass_every_argument_in_place():
    """The GPU kernels are only faked on the CPU: each adapter must hand them q, k, v, the same
    cu_seqlens twice and the max length twice as Python ints, causal, no dropout."""
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return (args[2], None) if len(args) > 7 else args[2]

    q, k, v = (torch.full((4, 1, 8), float(i)) for i in range(3))
    cu = torch.tensor([0, 1, 4], dtype=torch.int32)
    flash, flash_call = forwards.make_flash_attn_forward(record)
    aten, aten_call = forwards.make_aten_flash_forward(record)
    assert flash(q, k, v, cu, np.int64(3)) is v and aten(q, k, v, cu, np.int64(3)) is v
    (f_args, f_kwargs), (a_args, a_kwargs) = calls
    assert f_args[:5] == (q, k, v, cu, cu) and f_args[5:] == (3, 3)
    assert all(type(x) is int for x in f_args[5:]) and all(type(x) is int for x in a_args[5:7])
    assert f_kwargs == {"dropout_p": 0.0, "softmax_scale": None, "causal": True}
    assert a_args[:5] == (q, k, v, cu, cu) and a_args[5:] == (3, 3, 0.0, True, False)
    assert a_kwargs == {}
    assert flash_call == "flash_attn.flash_attn_varlen_func(..., dropout_p=0.0, causal=True)"
    assert aten_call == (
        "torch.ops.aten._flash_attention_forward(..., dropout_p=0.0, is_causal=True)"
    )
    calls.clear()

    def varlen(query, key, value, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1)):
        calls.append(((query, key, value, cu_q, cu_k, max_q, max_k), {"window_size": window_size}))
        return value

    fwd, call = forwards.make_varlen_forward(varlen)
    assert fwd(q, k, v, cu, np.int64(3)) is v
    [(args, kwargs)] = calls
    assert args[:5] == (q, k, v, cu, cu) and args[5:] == (3, 3) and type(args[6]) is int
    assert call == (
        "torch.nn.attention.varlen.varlen_attn(q, k, v, cu, cu, max, max, window_size=(-1, 0))"
    )


def test_unreadable_or_unknown_varlen_signatures():
    with pytest.raises(UsageError) as info:
        forwards.varlen_call_form(object())  # no signature
    assert str(info.value) == "cannot read the signature of torch's varlen_attn"
    with pytest.raises(UsageError) as info:
        forwards.varlen_call_form(fake_varlen_unknown)
    assert str(info.value) == (
        "torch's varlen_attn takes neither window_size= nor is_causal=; this torch version is "
        "not supported by --backend torch-varlen"
    )
    with pytest.raises(ValueError, match="^unknown varlen call form 'other'$"):
        forwards.varlen_causal_kwargs("other")


# --------------------------------------------------------------------------------------------
# Choosing a backend


def probes(**missing) -> dict:
    found = {name: None for name in backends.BACKENDS}
    found["_cuda"] = None
    found.update({k.replace("_", "-") if k != "_cuda" else k: v for k, v in missing.items()})
    return found


def test_auto_takes_the_best_available():
    assert backends.select_backend("auto", probes()) == "flash-attn-3"
    assert backends.select_backend("auto", probes(flash_attn_3="no")) == "flash-attn"
    no_flash = {"flash_attn_3": "no", "flash_attn": "no"}
    assert backends.select_backend("auto", probes(**no_flash)) == "torch-varlen"
    assert backends.select_backend("auto", probes(**no_flash, torch_varlen="no")) == "flex"
    cpu_only = probes(**no_flash, torch_varlen="no", _cuda="no CUDA GPU")
    assert backends.select_backend("auto", cpu_only) == "cpu"  # flex on a CPU runs unfused
    assert backends.select_backend("flex", cpu_only) == "flex"  # but can be asked for
    assert (
        backends.select_backend("auto", probes(**no_flash, torch_varlen="no", flex="no")) == "cpu"
    )


def test_unavailable_or_unknown_backend_is_a_usage_error():
    with pytest.raises(UsageError, match="^backend torch-varlen cannot run here: needs GPU$"):
        backends.select_backend("torch-varlen", probes(torch_varlen="needs GPU"))
    with pytest.raises(UsageError, match="^unknown backend 'cuda'"):
        backends.select_backend("cuda", probes())


def test_probe_and_resolve_on_this_machine():
    found = backends.probe_backends()
    assert found["cpu"] is None
    if not torch.cuda.is_available():
        assert found["torch-varlen"] and "CUDA" in found["torch-varlen"]
        backend, dtype = backends.resolve("auto", None)
        assert (backend.name, backend.device, dtype) == ("cpu", "cpu", "fp32")
    with pytest.raises(UsageError, match="^unknown dtype 'fp8'"):
        backends.resolve("cpu", "fp8")


# --------------------------------------------------------------------------------------------
# Kernels on the CPU


def test_cpu_and_flex_match_per_sample_runs():
    cu = torch.tensor([0, 5, 17, 40], dtype=torch.int32)
    ids = np.random.default_rng(0).integers(0, 10_000, 40)
    q, k, v = A.qkv_from_tokens(ids, seed=1, device="cpu", dtype=torch.float32)
    cpu, _ = forwards.make_cpu_forward()
    flex, call = forwards.make_flex_forward("cpu", compiled=False)
    assert "flex_attention" in call
    packed_cpu = cpu(q, k, v, cu, 23)
    packed_flex = flex(q, k, v, cu, 23)
    for a, b in [(0, 5), (5, 17), (17, 40)]:
        alone = A.reference_attention(q[a:b], k[a:b], v[a:b])
        assert (packed_cpu[a:b] - alone).abs().max() < 1e-5
        assert (packed_flex[a:b] - alone).abs().max() < 1e-5
    whole = torch.tensor([0, 40], dtype=torch.int32)
    assert (
        cpu(q, k, v, whole, 40)[5:17] - A.reference_attention(q[5:17], k[5:17], v[5:17])
    ).abs().max() > 0.1


def test_qkv_is_seeded_and_token_derived():
    ids = np.array([3, 9, 3])
    q1, k1, _ = A.qkv_from_tokens(ids, 0, "cpu", torch.float32)
    q2, _, _ = A.qkv_from_tokens(ids, 0, "cpu", torch.float32)
    q3, _, _ = A.qkv_from_tokens(ids, 1, "cpu", torch.float32)
    assert torch.equal(q1, q2) and not torch.equal(q1, q3)
    assert torch.equal(q1[0], q1[2]) and not torch.equal(q1[0], k1[0])
    assert q1.shape == (3, A.HEADS, A.HEAD_DIM)


def test_alone_segments_come_from_positions():
    assert picked_rows.alone_segments(np.array([0, 1, 2, 0, 1, 0])) == [(0, 3), (3, 5), (5, 6)]
    assert picked_rows.alone_segments(np.array([4, 5, 0])) == [(0, 2), (2, 3)]


def test_pick_rows_prefers_rows_with_several_samples():
    cands = [(0, r, 1 if r % 3 else 4) for r in range(12)] + [(1, 0, 2)]
    picked = picked_rows.pick_rows(cands, 3, seed=0)
    assert len(picked) == 3 and all(p in {(0, 0), (0, 3), (0, 6), (0, 9), (1, 0)} for p in picked)
    assert picked == picked_rows.pick_rows(cands, 3, seed=0) and picked == sorted(picked)
    assert len(picked_rows.pick_rows(cands, 100, seed=0)) == 13
    assert picked_rows.pick_rows(cands, None, seed=0) == [(s, r) for s, r, _ in cands]


# --------------------------------------------------------------------------------------------
# The check fails when the kernel leaks, and when it cannot see a leak


def make_rows() -> list[picked_rows.RowInput]:
    rng = np.random.default_rng(2)
    rows = []
    for r, lengths in enumerate([[7, 9, 4], [12, 3]]):
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        data = {
            "input_ids": rng.integers(0, 500, cu[-1]).astype(np.int32),
            "position_ids": np.concatenate([np.arange(n) for n in lengths]).astype(np.int32),
            "cu_seqlens": cu,
            "sample_index": np.arange(len(lengths)) + 10 * r,
            "sample_offset": np.zeros(len(lengths), np.int32),
        }
        rows.append(picked_rows.RowInput("shard-00000.arrow", r, data))
    return rows


def run(forward, name="fake", rows=None):
    backend = backends.Backend(name, "cpu", forward, "fake()", backends.DTYPES)
    iso, ctl = CheckResult("attention"), CheckResult("negative_control")
    A.run_attention(rows or make_rows(), backend, "fp32", 0, iso, ctl)
    return iso, ctl


def test_isolating_kernel_passes_with_leak_in_report():
    iso, ctl = run(forwards.make_cpu_forward()[0], "cpu")
    assert iso.ok and ctl.ok
    assert iso.details["max_isolated_diff"] < 1e-6 and iso.details["samples"] == 5
    assert ctl.details["samples_measured"] == 3 and ctl.details["min_leak"] > 0.1
    assert iso.details["backend"] == "cpu" and iso.details["seconds_per_million_tokens"] > 0


def test_leaking_kernel_fails_isolation():
    cpu = forwards.make_cpu_forward()[0]

    def ignores_cu_seqlens(q, k, v, cu, max_seqlen):
        whole = torch.tensor([0, q.shape[0]], dtype=torch.int32)
        return cpu(q, k, v, whole, q.shape[0])

    iso, ctl = run(ignores_cu_seqlens)
    assert not iso.ok and iso.failure_count == 3  # every sample after the first of each row
    msg = iso.failures[0].message
    assert msg.startswith(
        "shard-00000.arrow row 0, sample 1 (tokens 7..15): the packed fake "
        "forward differs from the sample run alone by"
    )
    assert "attention crosses a sample boundary" in msg


def test_blind_check_fails_the_negative_control():
    def no_attention(q, k, v, cu, max_seqlen):  # returns v: nothing can ever leak, or be seen
        return v

    iso, ctl = run(no_attention)
    assert not ctl.ok and ctl.failure_count == 3
    assert "could not see a leak" in ctl.failures[0].message


def test_control_uses_joined_samples_when_no_row_has_two():
    rows = [
        picked_rows.RowInput(
            "s",
            i,
            {
                "input_ids": np.arange(8) + i,
                "position_ids": np.arange(8),
                "cu_seqlens": np.array([0, 8], np.int32),
                "sample_index": np.array([i]),
                "sample_offset": np.array([0], np.int32),
            },
        )
        for i in range(2)
    ]
    iso, ctl = run(forwards.make_cpu_forward()[0], "cpu", rows)
    assert ctl.ok and ctl.details["synthetic"] and ctl.details["min_leak"] > 0.1


def _joined_leak(first: np.ndarray, second: np.ndarray, seed: int = 0) -> float:
    """The synthetic control's number, from the fp32 reference: the second sample's output under
    causal attention over both, against the second alone."""
    ids = np.concatenate([first, second])
    q, k, v = A.qkv_from_tokens(ids, seed, "cpu", torch.float32)
    a = len(first)
    both = A.reference_attention(q, k, v)[a:]
    alone = A.reference_attention(q[a:], k[a:], v[a:])
    return float((both - alone).abs().max())


def test_synthetic_control_joins_the_first_two_rows():
    rows = [
        picked_rows.RowInput(
            "s",
            i,
            {
                "input_ids": np.arange(8) * (i + 1) + 3 * i,
                "position_ids": np.arange(8),
                "cu_seqlens": np.array([0, 8], np.int32),
                "sample_index": np.array([i]),
                "sample_offset": np.array([0], np.int32),
            },
        )
        for i in range(3)
    ]
    _, ctl = run(forwards.make_cpu_forward()[0], "cpu", rows)
    want = _joined_leak(rows[0].data["input_ids"], rows[1].data["input_ids"])
    assert abs(ctl.details["min_leak"] - want) < 1e-6 and want > 0.1
    assert ctl.details["samples_measured"] == 1
    # with one row, it is joined with itself reversed
    _, ctl = run(forwards.make_cpu_forward()[0], "cpu", rows[2:])
    ids = rows[2].data["input_ids"]
    assert abs(ctl.details["min_leak"] - _joined_leak(ids, ids[::-1].copy())) < 1e-6


def test_blind_kernel_fails_the_synthetic_control():
    rows = [
        picked_rows.RowInput(
            "s",
            i,
            {
                "input_ids": np.arange(6) + i,
                "position_ids": np.arange(6),
                "cu_seqlens": np.array([0, 6], np.int32),
                "sample_index": np.array([i]),
                "sample_offset": np.array([0], np.int32),
            },
        )
        for i in range(2)
    ]
    _, ctl = run(lambda q, k, v, cu, max_seqlen: v, "blind", rows)
    [failure] = ctl.failures
    assert failure.check == "negative_control"
    threshold = A.LEAK_FACTOR * tolerance("fp32", 6, A.value_bound(0, torch.float32))
    assert ctl.details["threshold"] == threshold
    assert failure.message == (
        "plain causal attention over two joined samples changes the second by only 0 (needs > "
        f"{threshold:g}): the check could not see a leak"
    )
    assert ctl.details["synthetic"] is True and ctl.details["min_leak"] == 0.0


def test_no_rows_means_not_run():
    iso, ctl = CheckResult("attention"), CheckResult("negative_control")
    backend = backends.Backend("cpu", "cpu", forwards.make_cpu_forward()[0], "x", backends.DTYPES)
    A.run_attention([], backend, "fp32", 0, iso, ctl)
    for check in (iso, ctl):
        assert check.ran is False and check.skipped_reason == "no usable row to run"
    assert iso.details["tokens"] == 0 and iso.details["seconds_per_million_tokens"] is None


def test_qkv_are_three_different_table_slices():
    q, k, v = A.qkv_from_tokens(np.array([5, 4100]), 3, "cpu", torch.float16)
    table = A._qkv_table(3)
    for i, x in enumerate((q, k, v)):
        assert x.dtype == torch.float16 and x.shape == (2, A.HEADS, A.HEAD_DIM)
        assert torch.equal(x, table[[5, 4100 % A.TABLE_ROWS], i].half())


# --------------------------------------------------------------------------------------------
# The references hold callers to the varlen kernels' contract


@pytest.mark.parametrize(
    "make", [forwards.make_cpu_forward, lambda: forwards.make_flex_forward("cpu", False)]
)
@pytest.mark.parametrize(
    ("cu", "max_seqlen", "error"),
    [
        ([0, 3, 8], 5, None),
        (torch.tensor([0, 3, 8]), 5, "cu_seqlens must be 1-D int32 on cpu, got torch.int64 cpu"),
        ([[0, 3, 8]], 5, "cu_seqlens must be 1-D int32 on cpu, got torch.int32 cpu"),
        ([1, 3, 8], 5, r"cu_seqlens must rise from 0 to 8, got \[1, 3, 8\]"),
        ([0, 3, 7], 4, r"cu_seqlens must rise from 0 to 8, got \[0, 3, 7\]"),
        ([0, 5, 3, 8], 5, r"cu_seqlens must rise from 0 to 8, got \[0, 5, 3, 8\]"),
        ([8], 8, r"cu_seqlens must rise from 0 to 8, got \[8\]"),
        ([0, 3, 8], 8, "max_seqlen is 8 but the longest segment has 5 tokens"),
        ([0, 3, 8], None, "max_seqlen is None but the longest segment has 5 tokens"),
    ],
)
def test_reference_forwards_enforce_the_varlen_contract(make, cu, max_seqlen, error):
    forward, _ = make()
    q = torch.randn(8, 2, 16)
    cu = cu if isinstance(cu, torch.Tensor) else torch.tensor(cu, dtype=torch.int32)
    if error is None:
        assert forward(q, q, q, cu, max_seqlen).shape == q.shape
    else:
        with pytest.raises(ValueError, match=f"^{error}$"):
            forward(q, q, q, cu, max_seqlen)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's start-up: no CUDA GPU here")
def test_probing_on_the_cpu_leaves_torch_dynamo_unloaded():
    """torch's varlen module loads torch._dynamo (about 3 s of every `packer verify` start-up);
    without a CUDA GPU that backend cannot run, so the probe does not import it."""
    code = (
        "import sys; from packer.verify.backends import probe_backends; "
        "found = probe_backends(); assert 'CUDA' in found['torch-varlen'], found; "
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))"
    )
    res = python_script(code, check=True)
    assert res.stdout.strip() == "[]", res.stdout
