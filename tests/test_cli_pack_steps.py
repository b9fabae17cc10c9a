"""`packer pack` hands its tokenize step the flags it reads by name (`PackTokenizing`), not its
`locals()`: a flag renamed in `pack` fails where it is passed instead of dropping out."""

from __future__ import annotations

import inspect
import json
from dataclasses import fields

import pytest
from tokenizers_util import PLAIN, build_tokenizer

pytest.importorskip("transformers")


def test_every_tokenize_flag_is_a_parameter_of_pack():
    from packer.cli.pack import pack
    from packer.cli.raw import PackTokenizing

    parameters = inspect.signature(pack).parameters
    names = [f.name for f in fields(PackTokenizing)]
    assert names and all(name in parameters for name in names), names
    with pytest.raises(TypeError):  # no defaults: a flag left out is an error, not a None
        PackTokenizing(tokenizer="t")


def test_the_tokenize_flags_reach_the_tokenize_step(cli, tmp_path, monkeypatch):
    """--workers, --memory-budget, --train-on and --json, each seen by the step that uses it."""
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    tok = build_tokenizer(tmp_path / "tok", PLAIN)
    chat = {
        "messages": [
            {"role": "user", "content": "the way"},
            {"role": "assistant", "content": "the day"},
            {"role": "user", "content": "one more"},
            {"role": "assistant", "content": "water call"},
        ]
    }
    raw = tmp_path / "chats.jsonl"
    raw.write_text(json.dumps(chat) + "\n")
    seen = {}
    from packer.tokenize import cache

    real = cache.tokenized_input

    def spy(inputs, make_encoder, **options):
        seen.update(options, train_on=make_encoder().train_on)
        return real(inputs, make_encoder, **options)

    monkeypatch.setattr(cache, "tokenized_input", spy)
    args = ("pack", raw, "--tokenizer", tok, "-L", "64", "--workers", "1")
    res = cli(
        *args, "--memory-budget", "1GiB", "--train-on", "last", "-o", tmp_path / "a", "--json"
    )
    assert res.exit_code == 0, res.stderr
    assert seen["workers"] == 1 and seen["memory_budget"] == "1GiB" and seen["train_on"] == "last"
    assert "tokenized" not in res.stderr  # --json: no summary line
    assert json.loads(res.stdout)["samples_in"] == 1
    res = cli(*args, "-o", tmp_path / "b")
    assert res.exit_code == 0 and "tokenized 1 lines into 1 samples" in res.stderr, res.stderr
    assert seen["train_on"] == "assistant" and seen["resume"] is False
