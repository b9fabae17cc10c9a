"""Hybrid models (Mamba2, Gated DeltaNet, short convolutions) on packed batches: collate_packed
gives them what transformers' DataCollatorWithFlattening gives (seq_idx, cu_seq_lens, max_length),
and check_isolation names, in one line, the layers that cannot keep packed samples apart on this
install (tiny configs, random weights, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_torch_isolation import make_rows  # noqa: E402

from packer.torch import (  # noqa: E402
    IsolationError,
    check_isolation,
    collate_packed,
    hybrid,
    model_inputs,
)
from packer.torch.tiny_model import TINY_ARCHITECTURES, tiny_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HYBRIDS = {  # what each needs, as transformers 5.24's modeling files import it
    "nemotron_h": ("Mamba/SSM mixers", [0], ["mamba-ssm", "causal-conv1d"]),
    "bamba": ("Mamba/SSM mixers", [0], ["mamba-ssm", "causal-conv1d"]),
    "falcon_h1": ("Mamba/SSM mixers", [0, 1], ["mamba-ssm", "causal-conv1d"]),
    "lfm2": ("short convolutions", [0], ["causal-conv1d"]),
    "qwen3_next": ("Gated DeltaNet mixers", [0], ["causal-conv1d", "flash-linear-attention"]),
    "qwen3_5": ("Gated DeltaNet mixers", [0], ["causal-conv1d", "flash-linear-attention"]),
}
NO_KERNELS = not any(hybrid.kernel_available(p) for p in hybrid.DISTRIBUTIONS)


def build(arch: str, attn: str = "sdpa"):
    config = tiny_config(arch, vocab_size=100, attn_implementation=attn)
    if config is None:
        pytest.skip(f"this transformers has no {TINY_ARCHITECTURES[arch][0]}")
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).float()


def features(rows: list[dict]) -> list[dict]:
    """Each packed sample as its own example, the input DataCollatorWithFlattening takes."""
    out = []
    for row in rows:
        cu = np.asarray(row["cu_seqlens"])
        for a, b in zip(cu[:-1], cu[1:]):
            out.append({"input_ids": row["input_ids"][a:b], "labels": row["labels"][a:b]})
    return out


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=4),
    st.integers(0, 10_000),
)
def test_flatten_batch_equals_transformers_flattening_collator(lengths, seed):
    rows = make_rows(lengths, seed=seed)
    ours = collate_packed(rows, "flatten")
    theirs = transformers.DataCollatorWithFlattening(
        return_seq_idx=True, return_flash_attn_kwargs=True
    )(features(rows))
    assert set(theirs) <= set(ours)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and torch.equal(ours[key], value), key
        else:
            assert type(ours[key]) is type(value) and ours[key] == value, key
    assert ours["seq_idx"].dtype == torch.int32 and "seq_idx" in model_inputs(ours)


def test_pad_batch_numbers_the_samples_of_each_row():
    rows = make_rows(((3, 2), (4,), (1, 1, 2)))
    batch = collate_packed(rows, "pad", pad_to_multiple_of=8)
    assert batch["seq_idx"].dtype == torch.int32
    assert batch["seq_idx"].tolist() == [
        [0, 0, 0, 1, 1, 2, 2, 2],  # the padding is a segment of its own
        [0, 0, 0, 0, 1, 1, 1, 1],
        [0, 1, 2, 2, 3, 3, 3, 3],
    ]


@pytest.mark.parametrize("arch", list(HYBRIDS))
def test_hybrid_without_kernels_is_refused_in_one_line(arch):
    if not NO_KERNELS:
        pytest.skip("a kernel package imports here: the GPU proof runs these models")
    label, layers, missing = HYBRIDS[arch]
    model = build(arch).train()
    needs = hybrid.isolation_needs(model)
    assert [(hybrid.KINDS[n.kind][0], n.layers) for n in needs] == [(label, layers)]
    batch = collate_packed(make_rows(), "flatten")
    with pytest.raises(IsolationError) as caught:
        check_isolation(model, batch)
    line = str(caught.value)
    assert "\n" not in line and line == caught.value.report.unsupported
    assert line.startswith(
        f"layers that cannot keep packed samples apart on this install: {label} in layers "
        f"{', '.join(map(str, layers))} (need "
    )
    assert line.endswith(
        f"missing {', '.join(missing)}: pip install {' '.join(missing)} on a CUDA GPU "
        "(collate_packed's batch carries seq_idx and cu_seq_lens_q)"
    )
    assert caught.value.report.failures == [line] and caught.value.report.samples == 0
    # the model itself, given the batch collate_packed builds, refuses it or leaks
    try:
        with torch.no_grad():
            packed = model(**model_inputs(batch)).logits
    except ValueError as exc:
        assert "can't keep packed sequences apart" in str(exc)
    else:  # its torch path ran: the second sample's logits are not its own alone
        a, b = batch["cu_seq_lens_q"][1:3].tolist()
        with torch.no_grad():
            alone = model(input_ids=batch["input_ids"][:, a:b]).logits
        assert float((packed[0, a:b] - alone[0]).abs().max()) > 0


def test_the_models_own_refusal_becomes_the_one_line(monkeypatch):
    """Where packer's look at the modules sees nothing missing (here: told causal_conv1d
    imports), the model's own ValueError about packed sequences is the verdict, not a crash."""
    if not NO_KERNELS:
        pytest.skip("a kernel package imports here")
    model = build("lfm2").train()
    monkeypatch.setattr(hybrid, "kernel_available", lambda package: True)
    report = check_isolation(model, collate_packed(make_rows(), "flatten"), raise_on_failure=False)
    assert report.failures == [report.unsupported]
    assert report.unsupported == (
        "the model refuses packed samples on this install: `causal_conv1d_fn` can't keep packed "
        "sequences apart without `causal_conv1d`. Install `causal_conv1d` to train on packed "
        "sequences."
    )


def test_a_leak_the_comparison_cannot_see_is_still_named():
    """LFM2's short convolution reaches 2 tokens into the previous sample: at random init the
    logits move by ~1e-4, under the fp32 tolerance, so only the look at the layers catches it."""
    if not NO_KERNELS:
        pytest.skip("a kernel package imports here")
    model = build("lfm2").train()
    batch = collate_packed(make_rows(), "flatten")
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        cu = batch["cu_seq_lens_q"].tolist()
        a, b = cu[1], cu[2]
        alone = model(input_ids=batch["input_ids"][:, a:b]).logits
    leak = float((packed[0, a:b] - alone[0]).abs().max())
    assert leak > 0  # the convolution does carry the previous sample over
    report = check_isolation(model, batch, raise_on_failure=False)
    assert report.unsupported and "short convolutions in layers 0" in report.unsupported


def test_attention_only_models_have_no_needs():
    for arch in ("mistral", "gemma3"):
        assert hybrid.isolation_needs(build(arch)) == []
    assert hybrid.needs_line([]) is None
