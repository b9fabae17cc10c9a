"""`packer.verify.verify` from Python: its progress callback reports every stage it runs, and its
usage errors name the parameters (the CLI's flags are checked in test_verify_cli)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import packer  # noqa: E402
from packer.errors import UsageError  # noqa: E402
from packer.verify import (  # noqa: E402
    STAGE_ATTENTION,
    STAGE_MODEL,
    STAGE_STRUCTURE,
    STAGE_USER_MODEL,
    verify,
)


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("verify_library")
    src = root / "x.jsonl"
    lines = [
        json.dumps({"input_ids": [(7 * i + j) % 400 + 1 for j in range(5 + i % 9)]})
        for i in range(40)
    ]
    src.write_text("\n".join(lines) + "\n")
    packer.pack(src, root / "out", packer.PackConfig(max_len=32, overlength="split"))
    return root / "out"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model")
    transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ).save_pretrained(path)
    return path


def test_progress_reports_every_stage_it_runs(output, model_dir):
    seen: list[tuple[str, int, int]] = []
    result = verify(
        output,
        backend="cpu",
        rows=2,
        model_check=True,
        model_dir=model_dir,
        progress=lambda stage, done, total: seen.append((stage, done, total)),
    )
    assert result.ok, result.to_dict()
    stages = [s for s, _, _ in seen]
    assert [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s] == [
        STAGE_STRUCTURE,
        STAGE_ATTENTION,
        STAGE_MODEL,
        STAGE_USER_MODEL,
    ]
    for stage in (STAGE_ATTENTION, STAGE_MODEL, STAGE_USER_MODEL):
        last = [(d, t) for s, d, t in seen if s == stage][-1]
        assert last[0] == last[1] > 0, (stage, last)
    structure = [(d, t) for s, d, t in seen if s == STAGE_STRUCTURE]
    assert structure[-1][0] == structure[-1][1] > 0


def test_structural_checks_alone_name_the_parameter_they_exclude(output, model_dir):
    with pytest.raises(UsageError) as info:
        verify(output, attention=False, model_check=True)
    assert str(info.value) == (
        "attention=False runs the structural checks alone; drop it to use model_check"
    )
    with pytest.raises(UsageError) as info:
        verify(output, attention=False, model_dir=model_dir)
    assert str(info.value) == (
        "attention=False runs the structural checks alone; drop it to use model_dir"
    )
    assert verify(output, attention=False).ok


def test_flags_under_the_cli_and_the_torch_hint(output, model_dir, monkeypatch):
    from packer.errors import flag_names

    with flag_names(), pytest.raises(UsageError) as info:
        verify(output, attention=False, model_check=True)
    assert str(info.value) == (
        "--no-attention runs the structural checks alone; drop it to use --model-check"
    )
    with flag_names(), pytest.raises(UsageError) as info:
        verify(output, attention=False, model_dir=model_dir)
    assert str(info.value).endswith("drop it to use --model")
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # `import torch` fails
    with pytest.raises(UsageError) as info:
        verify(output)
    assert str(info.value) == (
        "the attention check needs torch (packer's 'verify' extra): pip install torch, or pass "
        "attention=False for the structural checks alone"
    )


def test_an_output_that_keeps_changing_is_refused_after_two_tries(output, monkeypatch):
    from packer.verify.output_version import OutputVersion

    opened = []
    real_init = OutputVersion.__init__

    def counting_init(self, output_dir):
        opened.append(output_dir)
        real_init(self, output_dir)

    monkeypatch.setattr(OutputVersion, "__init__", counting_init)
    monkeypatch.setattr(OutputVersion, "changed", lambda self: True)
    with pytest.raises(UsageError) as info:
        verify(output, attention=False)
    assert str(info.value) == (
        f"{output}: the output changed while it was being verified, twice (a pack --overwrite "
        "of it?); verify it once nothing writes it"
    )
    assert opened == [output, output]
