"""`packer verify OUT --model DIR`: the user's own (local) model, packed vs alone, end to end."""

from __future__ import annotations

import json

import pytest
import test_verify_cli
from conftest import make_samples, write_jsonl
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


def test_config_only_dir_passes_with_a_working_control(cli, packed, config_dir, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # asserts the CPU's choices
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
    assert user["max_loss_diff"] <= 1e-5 and user["tolerance"] == 1e-4
    assert user["model"] == "LlamaForCausalLM" and user["model_dir"] == str(config_dir)
    assert user["call"] == "model.train(); model(**model_inputs(batch)) (flatten)"
    assert user["device"] == "cpu" and user["dtype"] == "float32"
    assert "user_model" not in report["not_run"]
    # the picked rows all hold several samples: the same rows and samples as attention's
    att = report["checks"]["attention"]
    assert user["rows"] == att["rows"] and user["samples"] == att["samples"]
    assert user["seconds"] > 0


def test_dtype_option_sets_the_model_dtype_and_tolerance(cli, packed, config_dir):
    code, report = run_verify(
        cli, packed[0], "--model", config_dir, "--rows", "1", "--dtype", "bf16"
    )
    assert code == 0, messages(report)
    user = report["checks"]["user_model"]
    assert user["dtype"] == "bfloat16" and user["tolerance"] == 5e-2
    assert report["checks"]["attention"]["dtype"] == "bf16"
    code, report = run_verify(
        cli, packed[0], "--model", config_dir, "--rows", "1", "--dtype", "fp16"
    )
    assert code == 0, messages(report)
    assert report["checks"]["user_model"]["dtype"] == "float16"


def test_a_model_blind_to_context_fails_its_control(cli, packed, tmp_path):
    """No layers: each logit depends on its own token only, so the check could not see a leak."""
    cfg = tiny_config()
    cfg.num_hidden_layers = 0
    cfg.save_pretrained(tmp_path / "blind")
    code, report = run_verify(cli, packed[0], "--model", tmp_path / "blind", "--rows", "2")
    assert code == 1
    user = report["checks"]["user_model"]
    assert user["max_logits_diff"] == 0.0 and user["control_min_logits_leak"] == 0.0
    got = messages(report, "user_model")
    assert len(got) == 2
    for m in got:
        assert m.endswith(
            ": run as one sequence (positions 0..T-1, no sample boundaries) the model's "
            "logits change by only 0 (needs > 0.0002): the check could not see a leak here"
        )
        assert m.startswith("shard-")
    for failure in report["checks"]["user_model"]["failures"]:
        assert failure["check"] == "user_model" and failure["shard"].startswith("shard-")
        assert failure["row"] is not None


def test_rows_of_one_sample_leave_nothing_to_check(cli, config_dir, tmp_path):
    samples = make_samples(12, seed=1, median=100, vocab=500)
    for s in samples:
        s["input_ids"] = (s["input_ids"] * 100)[:100]
        s.pop("labels")
    src = write_jsonl(tmp_path / "long.jsonl", samples)
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", 128).exit_code == 0
    code, report = run_verify(cli, out, "--model", config_dir)
    assert code == 0, messages(report)
    user = report["checks"]["user_model"]
    assert user["ran"] is False and user["ok"] is None
    assert user["skipped_reason"] == "no picked row holds two samples"
    assert user["rows"] == 0 and user["samples"] == 0 and user["tolerance"] is None


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
    code, report = run_verify(
        cli, out, "--model", tmp_path / "ckpt", "--rows", "2", "--dtype", "fp32"
    )
    assert code == 0, messages(report)
    user = report["checks"]["user_model"]
    assert user["weights"] == "weights from the checkpoint"
    assert (user["attn_implementation"], user["dtype"]) == ("eager", "float32")
    # --dtype loads the checkpoint's weights in that dtype
    code, report = run_verify(
        cli, out, "--model", tmp_path / "ckpt", "--rows", "1", "--dtype", "bf16"
    )
    assert code == 0, messages(report)
    assert report["checks"]["user_model"]["dtype"] == "bfloat16"


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
    end = row["cu_seqlens"][2] - 1
    n = sum(1 for x in row["labels"][t + 1 : end + 1] if x != -100)
    assert (
        f"{name} row {r}, sample {sample} (tokens {t}..{end}): the packed batch trains "
        f"{n + 1} targets of this sample, alone it has {n}: its first token is the target of "
        "the previous sample"
    ) in user
    failure = report["checks"]["user_model"]["failures"][0]
    assert failure["shard"] == name and failure["row"] == r and failure["sample"] == sample
    assert failure["check"] == "user_model" and failure["segment"] == 1


def test_usage_errors(cli, packed, tmp_path):
    out, _ = packed
    res = cli("verify", out, "--model", tmp_path)
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        f"error: {tmp_path}: --model needs a local directory with a config.json"
    )
    small = tmp_path / "small"
    tiny_config(vocab=50).save_pretrained(small)
    res = cli("verify", out, "--model", small, "--rows", "1")
    assert res.exit_code == 2 and "outside the model's vocabulary (50)" in res.stderr
    assert res.stderr.startswith(f"error: {small}: shard-") and "holds token id " in res.stderr
    res = cli("verify", out, "--model", small, "--no-attention")
    assert res.stderr.strip() == (
        "error: --no-attention runs the structural checks alone; drop it to use --model"
    )
    res = cli("verify", out, "--model-check", "--no-attention")
    assert res.stderr.strip() == (
        "error: --no-attention runs the structural checks alone; drop it to use --model-check"
    )
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    res = cli("verify", out, "--model", tmp_path / "broken", "--rows", "1")
    assert res.exit_code == 2
    assert res.stderr.startswith(
        f"error: {tmp_path / 'broken'}: cannot load a causal LM from it (The checkpoint you are "
        "trying to load has model type `no-such-model`"
    )
    assert "Traceback" not in res.stderr


def test_vocabulary_boundary_and_missing_transformers(cli, packed, tmp_path, monkeypatch):
    """A token id equal to vocab_size is outside the vocabulary; one below it is inside."""
    import sys

    from conftest import read_shards

    out, _ = packed
    top = max(max(ids) for ids in read_shards(out).column("input_ids").to_pylist())
    tiny_config(vocab=top).save_pretrained(tmp_path / "edge")
    res = cli("verify", out, "--model", tmp_path / "edge", "--rows", "all")
    assert res.exit_code == 2
    assert f"holds token id {top}, outside the model's vocabulary ({top})" in res.stderr
    tiny_config(vocab=top + 1).save_pretrained(tmp_path / "fits")
    code, report = run_verify(cli, out, "--model", tmp_path / "fits", "--rows", "1")
    assert code == 0, messages(report)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    res = cli("verify", out, "--model", tmp_path / "fits", "--rows", "1")
    assert res.exit_code == 2
    assert res.stderr.strip() == "error: --model needs transformers: pip install transformers"


def test_control_leaks_under_a_flash_attention_path(cli, packed, tmp_path):
    """A flash-style attention (transformers' flash branches, on CPU): an all-ones 2D mask is
    dropped and cu_seq_lens keep the samples apart, so only the row run as one sequence can
    leak. The check passes through the varlen branch, and the control leaks through the causal
    one."""
    import fake_flash

    name = fake_flash.register()
    tiny_config(attn=name).save_pretrained(tmp_path / "flash")
    config = json.loads((tmp_path / "flash" / "config.json").read_text())
    config["attn_implementation"] = name
    (tmp_path / "flash" / "config.json").write_text(json.dumps(config))
    fake_flash.calls.clear()
    code, report = run_verify(cli, packed[0], "--model", tmp_path / "flash", "--rows", "2")
    assert code == 0, messages(report)
    user = report["checks"]["user_model"]
    assert user["attn_implementation"] == name and user["rows"] == 2
    assert user["max_logits_diff"] <= 1e-5
    assert user["control_min_logits_leak"] > 10 * user["tolerance"]
    assert {"varlen", "causal"} <= set(fake_flash.calls)  # packed: cu_seq_lens; control: none
    # the fake is a real flash stand-in: an all-ones 2D mask with cu_seq_lens stays isolated
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(tmp_path / "flash")
    )
    from test_torch_isolation import make_rows

    from packer.torch import collate_packed, model_inputs

    batch = collate_packed(make_rows(), "flatten")
    with torch.no_grad():
        plain = model(**model_inputs(batch)).logits
        ones = model(**model_inputs(batch), attention_mask=torch.ones_like(batch["input_ids"]))
    assert torch.equal(plain, ones.logits)
