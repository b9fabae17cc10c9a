"""verify's GPU path: the backend and dtype each GPU gets (probes of fake GPUs: torch.cuda's
capability, name and bf16 answers replaced), flash-attn 3's call with a fake kernel, and, where a
CUDA GPU is present, every backend it can run on real kernels (skipped without one)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from test_verify_attention import make_rows
from test_verify_cli import packed  # noqa: F401 (a module fixture: a small packed output)

from packer.errors import UsageError
from packer.verify import attention as A
from packer.verify import backends, forwards
from packer.verify.result import CheckResult

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V100 = ("Tesla V100-SXM2-16GB", (7, 0))
T4 = ("Tesla T4", (7, 5))
P100 = ("Tesla P100-PCIE-16GB", (6, 0))
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))
L4 = ("NVIDIA L4", (8, 9))
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
B200 = ("NVIDIA B200", (10, 0))


def fake_module(name: str):
    module = types.ModuleType(name)

    def flash_attn_varlen_func(*args, **kwargs):
        raise AssertionError("a fake GPU's kernel is never run")

    module.flash_attn_varlen_func = flash_attn_varlen_func
    return module


@pytest.fixture
def fake_gpu(monkeypatch):
    """fake_gpu((name, capability), flash=(...), triton=True): torch.cuda answers as that GPU
    would (bf16 natively from sm80; emulated below, as torch's is_bf16_supported() says by
    default), with the named flash-attn modules importable."""

    def install(gpu, flash=("flash_attn", "flash_attn_interface"), triton=True):
        name, capability = gpu
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        monkeypatch.setattr(
            torch.cuda,
            "is_bf16_supported",
            lambda including_emulation=True: capability >= (8, 0) or including_emulation,
        )
        monkeypatch.setattr(backends, "_has_triton", lambda: triton)
        for module in ("flash_attn", "flash_attn_interface"):
            if module in flash:
                monkeypatch.setitem(sys.modules, module, fake_module(module))
            else:
                monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError

    return install


@pytest.mark.parametrize(
    ("gpu", "flash", "want"),
    [
        (H100, ("flash_attn", "flash_attn_interface"), ("flash-attn-3", "bf16")),
        (B200, ("flash_attn", "flash_attn_interface"), ("flash-attn", "bf16")),
        (A100, ("flash_attn", "flash_attn_interface"), ("flash-attn", "bf16")),
        (L4, (), ("torch-varlen", "bf16")),
        (V100, ("flash_attn", "flash_attn_interface"), ("flex", "fp16")),
        (T4, (), ("flex", "fp16")),
        (P100, ("flash_attn",), ("cpu", "fp32")),
    ],
)
def test_auto_picks_what_the_gpu_can_run(fake_gpu, gpu, flash, want):
    fake_gpu(gpu, flash)
    backend, dtype = backends.resolve("auto", None)
    assert (backend.name, dtype) == want
    assert backend.device == ("cpu" if want[0] == "cpu" else "cuda")


def test_reasons_name_the_gpu_and_what_each_kernel_needs(fake_gpu):
    fake_gpu(V100)
    found = backends.probe_backends()
    assert found["flash-attn"] == (
        "flash-attn needs sm80 or newer (Ampere, Ada, Hopper); this GPU, Tesla V100-SXM2-16GB, "
        "is sm70"
    )
    assert found["torch-varlen"].startswith("torch-varlen needs sm80 or newer")
    assert found["flash-attn-3"].startswith("flash-attn-3 needs Hopper (sm90)")
    assert found["flex"] is None and found["_gpu"] == backends.Gpu(V100[0], (7, 0), False)
    fake_gpu(B200)
    assert "this GPU, NVIDIA B200, is sm100" in backends.probe_backends()["flash-attn-3"]
    fake_gpu(P100)
    assert backends.probe_backends()["flex"] == (
        "flex needs sm70 or newer (Triton); this GPU, Tesla P100-PCIE-16GB, is sm60"
    )
    fake_gpu(A100, triton=False)
    assert "needs Triton" in backends.probe_backends()["flex"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--backend", "torch-varlen"),
            "error: --backend torch-varlen cannot run here: torch-varlen needs sm80 or newer "
            "(Ampere, Ada, Hopper); this GPU, Tesla V100-SXM2-16GB, is sm70",
        ),
        (
            ("--backend", "flash-attn-3"),
            "error: --backend flash-attn-3 cannot run here: flash-attn-3 needs Hopper (sm90); "
            "this GPU, Tesla V100-SXM2-16GB, is sm70",
        ),
        (
            ("--backend", "flex", "--dtype", "bf16"),
            "error: --dtype bf16: this GPU, Tesla V100-SXM2-16GB (sm70), has no bf16 "
            "(is_bf16_supported is False); pass --dtype fp16",
        ),
    ],
)
def test_a_backend_the_gpu_cannot_run_is_refused_in_one_line(cli, packed, fake_gpu, args, message):  # noqa: F811
    """Before: the first forward ended in 'internal error (RuntimeError: FlashAttention only
    supports Ampere GPUs or newer)', exit 1, the code of a failed check."""
    fake_gpu(V100)
    res = cli("verify", packed[0], *args)
    assert res.exit_code == 2
    assert res.stderr.strip() == message and res.stdout == ""


def test_library_refusal_is_a_usage_error(fake_gpu):
    fake_gpu(T4)
    with pytest.raises(UsageError, match="^backend flash-attn cannot run here: flash-attn needs"):
        backends.resolve("flash-attn", None)
    backend, dtype = backends.resolve("cpu", None)  # the reference runs anywhere, in fp32
    assert (backend.name, backend.device, dtype) == ("cpu", "cpu", "fp32")


# --------------------------------------------------------------------------------------------
# flash-attn 3: no dropout_p, (out, lse) or out


def fake_flash_attn_3(returns_lse: bool):
    """hopper/flash_attn_interface.py's varlen signature (positions 8-9 are seqused_q/k)."""
    calls = []

    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q=None,
        seqused_k=None,
        softmax_scale=None,
        causal=False,
        qv=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        window_size=(-1, -1),
        attention_chunk=0,
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        sm_margin=0,
        return_attn_probs=False,
    ):
        calls.append(
            dict(
                cu=(cu_seqlens_q, cu_seqlens_k),
                max=(max_seqlen_q, max_seqlen_k),
                seqused=(seqused_q, seqused_k),
                causal=causal,
                softmax_scale=softmax_scale,
                window_size=window_size,
            )
        )
        return (v, torch.zeros(q.shape[1], q.shape[0])) if returns_lse else v

    return flash_attn_varlen_func, calls


@pytest.mark.parametrize("returns_lse", [True, False])
def test_flash_attn_3_adapter(returns_lse):
    fn, calls = fake_flash_attn_3(returns_lse)
    q, k, v = (torch.full((5, 2, 8), float(i)) for i in range(3))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    forward, call = forwards.make_flash_attn3_forward(fn)
    assert forward(q, k, v, cu, np.int64(3)) is v
    [c] = calls
    assert c["cu"] == (cu, cu) and c["max"] == (3, 3) and all(type(x) is int for x in c["max"])
    assert c["seqused"] == (None, None) and c["causal"] is True and c["softmax_scale"] is None
    assert c["window_size"] == (-1, -1)
    assert call == "flash_attn_interface.flash_attn_varlen_func(..., causal=True)"
    flash2, _ = forwards.make_flash_attn_forward(fn)  # flash-attn 2's call does not fit it
    with pytest.raises(TypeError, match="dropout_p"):
        flash2(q, k, v, cu, 3)


def test_flash_attn_3_backend_runs_through_the_check(fake_gpu, monkeypatch):
    """The ladder's flash-attn-3 rung, built from the module, through run_attention (the fake
    kernel computes the reference, returning (out, lse) as flash-attn 3's early versions do)."""
    cpu, _ = forwards.make_cpu_forward()
    module = types.ModuleType("flash_attn_interface")

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=None, **kw):
        assert kw == {"softmax_scale": None, "causal": True} and seqused_q is None
        return cpu(q, k, v, cu_q, max_q), None

    module.flash_attn_varlen_func = flash_attn_varlen_func
    monkeypatch.setitem(sys.modules, "flash_attn_interface", module)
    backend = backends.build_backend("flash-attn-3", cuda=True)
    backend.device = "cpu"  # the fake kernel's tensors stay on the CPU
    iso, ctl = CheckResult("attention"), CheckResult("negative_control")
    A.run_attention(make_rows(), backend, "fp16", 0, iso, ctl)
    assert iso.ok and ctl.ok, (iso.failures, ctl.failures)
    assert iso.details["backend"] == "flash-attn-3" and ctl.details["margin"] > 10


# --------------------------------------------------------------------------------------------
# Real kernels: only where a CUDA GPU is present

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def segment_rows(lengths: list[int]) -> list:
    rows = make_rows()
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    data = {
        "input_ids": np.random.default_rng(9).integers(0, 50_000, cu[-1]).astype(np.int32),
        "position_ids": np.concatenate([np.arange(n) for n in lengths]).astype(np.int32),
        "cu_seqlens": cu,
        "sample_index": np.arange(len(lengths)),
        "sample_offset": np.zeros(len(lengths), np.int32),
    }
    return [*rows, type(rows[0])("gpu", 0, data)]


@cuda
@pytest.mark.parametrize("name", ["flash-attn-3", "flash-attn", "torch-varlen", "flex"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_real_kernel_isolates_packed_samples(name, dtype):
    found = backends.probe_backends()
    if found[name] is not None:
        pytest.skip(found[name])
    if dtype == "bf16" and not found["_gpu"].bf16:
        pytest.skip("this GPU has no bf16")
    backend = backends.build_backend(name, cuda=True)
    iso, ctl = CheckResult("attention"), CheckResult("negative_control")
    A.run_attention(segment_rows([1, 5, 127, 128, 129, 4096]), backend, dtype, 0, iso, ctl)
    assert iso.ok and ctl.ok, (iso.failures[:3], ctl.failures[:3])
    assert iso.details["max_reference_diff"] <= iso.details["tolerance"]
    assert ctl.details["margin"] > A.LEAK_FACTOR


@cuda
def test_real_gpu_auto_runs_what_it_picks():
    backend, dtype = backends.resolve("auto", None)
    iso, ctl = CheckResult("attention"), CheckResult("negative_control")
    A.run_attention(make_rows(), backend, dtype, 0, iso, ctl)
    assert iso.ok and ctl.ok, (backend.name, dtype, iso.failures, ctl.failures)
