"""`packer verify --model` on the architectures people pack for (tiny configs, random weights,
CPU): hybrids without their kernels are refused in one line (exit 1, never an internal error);
sliding-window models isolate per sample, and the control (the row as one sequence) carries the
window across the sample boundaries."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import write_jsonl
from test_torch_hybrid import HYBRIDS, NO_KERNELS
from test_verify_cli import messages, run_verify

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from packer.torch.tiny_model import TINY_ARCHITECTURES, tiny_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WINDOW = 4
VOCAB = 100


@pytest.fixture(scope="module")
def long_samples(tmp_path_factory):
    """Rows of several samples, each longer than the window (10..29 tokens)."""
    from typer.testing import CliRunner

    from packer.cli import app

    root = tmp_path_factory.mktemp("arch")
    rng = np.random.default_rng(7)
    samples = []
    for n in rng.integers(10, 30, 24):
        ids = rng.integers(0, VOCAB, int(n)).tolist()
        samples.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    src = write_jsonl(root / "long.jsonl", samples)
    out = root / "packed"
    res = CliRunner().invoke(app, ["pack", str(src), "-o", str(out), "-L", "96"])
    assert res.exit_code == 0, res.output
    return out


def config_dir(tmp_path, arch: str, attn: str, window: int | None = WINDOW):
    config = tiny_config(arch, vocab_size=VOCAB, sliding_window=window)
    if config is None:
        pytest.skip(f"this transformers has no {TINY_ARCHITECTURES[arch][0]}")
    path = tmp_path / f"{arch}-{attn}"
    config.save_pretrained(path)
    data = json.loads((path / "config.json").read_text())
    data["attn_implementation"] = attn
    (path / "config.json").write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("arch", list(HYBRIDS))
def test_hybrid_models_are_refused_in_one_line(cli, long_samples, tmp_path, arch):
    if not NO_KERNELS:
        pytest.skip("a kernel package imports here: gpu_check runs these models")
    label, layers, missing = HYBRIDS[arch]
    path = config_dir(tmp_path, arch, "sdpa", window=None)
    res = cli("verify", long_samples, "--model", path, "--rows", "2")
    assert res.exit_code == 1
    assert "internal error" not in res.output + res.stderr
    code, report = run_verify(cli, long_samples, "--model", path, "--rows", "2")
    assert code == 1
    user = report["checks"]["user_model"]
    (line,) = messages(report, "user_model")
    assert line == user["unsupported"]
    assert f"{label} in layers {', '.join(map(str, layers))}" in line
    assert line.endswith(
        f"missing {', '.join(missing)}: pip install {' '.join(missing)} on a CUDA GPU "
        "(collate_packed's batch carries seq_idx and cu_seq_lens_q)"
    )
    assert user["rows"] == 0 and user["samples"] == 0
    # the attention check of the same run still passes
    assert report["checks"]["attention"]["ok"] is True


# (arch, attention) pairs the installed transformers runs; Gemma-2 and gpt-oss have no sdpa
SLIDING = [
    ("gemma2", "eager"),
    ("gemma3", "sdpa"),
    ("gemma3", "eager"),
    ("gemma4", "sdpa"),
    ("gemma4", "eager"),
    ("mistral", "sdpa"),
    ("mistral", "eager"),
]


@pytest.mark.parametrize(("arch", "attn"), SLIDING)
def test_sliding_window_applies_per_sample(cli, long_samples, tmp_path, arch, attn):
    path = config_dir(tmp_path, arch, attn)
    code, report = run_verify(cli, long_samples, "--model", path, "--rows", "3")
    assert code == 0, messages(report)
    user = report["checks"]["user_model"]
    assert user["attn_implementation"] == attn and user["rows"] == 3
    assert user["max_logits_diff"] <= 1e-5
    # the row as one sequence: the window reaches back into the previous sample
    assert user["control_min_logits_leak"] > 10 * user["tolerance"]
    # and the window is real: within a sample longer than it, it changes the logits
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(arch, VOCAB, WINDOW))
    wide = transformers.AutoModelForCausalLM.from_config(tiny_config(arch, VOCAB, 1024))
    wide.load_state_dict(model.state_dict())
    ids = torch.arange(1, 21)[None]
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, wide(ids).logits, atol=1e-4)


def test_all_sliding_layers_leak_only_through_the_window(cli, long_samples, tmp_path):
    """Mistral with every layer sliding: the control's leak is the window crossing a boundary,
    so it reaches only the first 2 x (window - 1) tokens of each later sample (2 layers)."""
    config = tiny_config("mistral", VOCAB, WINDOW)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    a, b = 20, 40
    ids = torch.randint(0, VOCAB, (1, b))
    positions = torch.cat([torch.arange(a), torch.arange(b - a)])[None]
    with torch.no_grad():
        packed = model(ids, position_ids=positions, use_cache=False).logits[0, a:]
        whole = model(ids, position_ids=torch.arange(b)[None], use_cache=False).logits[0, a:]
    moved = (packed - whole).abs().amax(-1) > 1e-5
    reach = 2 * (WINDOW - 1)
    assert moved[:reach].all() and not moved[reach:].any()


def test_gpt_oss_eager_leaks_and_a_block_mask_isolates_it(cli, long_samples, tmp_path):
    """gpt-oss builds its eager mask without position_ids (no packed-sample detection), so its
    packed samples see each other there; check_isolation with the block-diagonal 4D mask passes."""
    from test_torch_isolation import make_rows

    from packer.torch import block_causal_mask, check_isolation, collate_packed

    path = config_dir(tmp_path, "gpt_oss", "eager")
    code, report = run_verify(cli, long_samples, "--model", path, "--rows", "1")
    assert code == 1
    got = messages(report, "user_model")
    assert got and all("the samples of a row see each other" in m for m in got)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        tiny_config("gpt_oss", VOCAB, WINDOW, attn_implementation="eager")
    )
    batch = collate_packed(make_rows(((9, 12, 10),)), "flatten")

    def masked(m, b):
        return m(
            input_ids=b["input_ids"],
            position_ids=b["position_ids"],
            attention_mask=block_causal_mask(b),
            use_cache=False,
        )

    assert check_isolation(model, batch, forward=masked).samples == 3


def test_the_table_line_of_a_refused_hybrid(cli, long_samples, tmp_path):
    from packer.cli.render_verify import _summary

    if not NO_KERNELS:
        pytest.skip("a kernel package imports here")
    path = config_dir(tmp_path, "bamba", "sdpa", window=None)
    res = cli("verify", long_samples, "--model", path, "--rows", "1")
    assert res.exit_code == 1
    text = res.stdout + res.stderr
    assert "Mamba/SSM mixers in layers 0" in text and "internal error" not in text
    code, report = run_verify(cli, long_samples, "--model", path, "--rows", "1")
    assert _summary("user_model", report["checks"]["user_model"]) == (
        "BambaForCausalLM (config only, random weights (seed 0); sdpa, float32): not run, its "
        "layers cannot keep packed samples apart here"
    )
