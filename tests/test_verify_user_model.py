"""`packer verify OUT --model DIR`: the user's own (local) model, packed vs alone, end to end."""

from __future__ import annotations

import json

import pytest
import test_verify_cli
from test_verify_cli import copy_output, messages, multi_sample_row, run_verify, save_shard

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

packed = test_verify_cli.packed  # the same packed output fixture


def tiny_config(vocab: int = 512, attn: str | None = None):
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    if attn:
        cfg._attn_implementation = attn
    return cfg


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg")
    tiny_config().save_pretrained(path)
    return path


def test_config_only_dir_passes_with_a_working_control(cli, packed, config_dir):
    out, _ = packed
    code, report = run_verify(cli, out, "--model", config_dir, "--rows", "3")
    assert code == 0, messages(report)
    user = report["checks"]["user_model"]
    assert user["ran"] and user["ok"]
    assert user["weights"] == "config only, random weights (seed 0)"
    assert user["use_cache_default"] is True and user["attn_implementation"] == "sdpa"
    assert user["rows"] == 3 and user["samples"] >= 6
    assert (
        user["max_logits_diff"] <= 1e-5 < user["tolerance"] * 10 < user["control_min_logits_leak"]
    )
    assert "user_model" not in report["not_run"]


def test_checkpoint_dir_loads_its_weights_eager(cli, packed, tmp_path):
    """A saved checkpoint on eager attention: weights come from the files, isolation holds."""
    out, _ = packed
    torch.manual_seed(5)
    model = transformers.LlamaForCausalLM(tiny_config())
    model.save_pretrained(tmp_path / "ckpt")
    assert any((tmp_path / "ckpt").glob("*.safetensors"))
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    config["attn_implementation"] = "eager"  # the way to pick the attention for --model
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    code, report = run_verify(cli, out, "--model", tmp_path / "ckpt", "--rows", "2")
    assert code == 0, messages(report)
    user = report["checks"]["user_model"]
    assert user["weights"] == "weights from the checkpoint"
    assert user["attn_implementation"] == "eager"


def test_label_crossing_a_boundary_fails_the_user_model_check(cli, packed, config_dir, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    t = row["cu_seqlens"][1]
    row["labels"][t] = row["input_ids"][t]
    row["num_loss_tokens"] += 1
    save_shard(out, name, rows, recount=True)
    code, report = run_verify(cli, out, "--model", config_dir)
    assert code == 1
    user = messages(report, "user_model")
    sample = row["sample_index"][1]
    assert any(
        m.startswith(f"{name} row {r}, sample {sample} (tokens {t}..")
        and "first token is the target of the previous sample" in m
        for m in user
    ), user
    failure = report["checks"]["user_model"]["failures"][0]
    assert failure["shard"] == name and failure["row"] == r and failure["sample"] == sample


def test_usage_errors(cli, packed, tmp_path):
    out, _ = packed
    res = cli("verify", out, "--model", tmp_path)
    assert res.exit_code == 2
    assert res.stderr.startswith("error: ") and "config.json" in res.stderr
    small = tmp_path / "small"
    tiny_config(vocab=50).save_pretrained(small)
    res = cli("verify", out, "--model", small, "--rows", "1")
    assert res.exit_code == 2 and "outside the model's vocabulary (50)" in res.stderr
    res = cli("verify", out, "--model", small, "--no-attention")
    assert res.exit_code == 2 and "drop it to use --model" in res.stderr
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    res = cli("verify", out, "--model", tmp_path / "broken", "--rows", "1")
    assert res.exit_code == 2 and "cannot load a causal LM" in res.stderr
    assert "Traceback" not in res.stderr
