"""The real vocabularies of tests/real_templates.py give the ids llama.cpp expects: every text of
each GGUF's `.inp` file, encoded without special tokens by the converted and saved 🤗 tokenizer,
equals the ids of its `.out` file. The files come from `make setup` (skipped where absent)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

import real_templates as rt  # noqa: E402

# Conversion gaps left as they are, each pinned so that a change is seen: transformers' GGUF
# reader gives these vocabularies GPT-2's pre-tokenizer, which joins a space to a number; their
# own (a chain of regexes) split " ½" into " " and "½". Text 0 is "ied 4 ½ months". The family
# tests compare packer with the same tokenizer, so the gap does not touch them.
KNOWN = {"deepseek-v3": {0}, "command-r": {0}}


@pytest.mark.parametrize("name", sorted(rt.VOCABS))
def test_conversion_gives_llama_cpp_ids(name):
    vocab = rt.VOCABS[name]
    if reason := rt.missing(vocab):
        pytest.skip(reason)
    tokenizer = rt.load(vocab)
    cases = rt.expected_ids(vocab.check_path)
    assert len(cases) > 20
    wrong = {
        i
        for i, (text, ids) in enumerate(cases)
        if tokenizer.encode(text, add_special_tokens=False) != ids
    }
    assert wrong == KNOWN.get(name, set()), [cases[i][0] for i in sorted(wrong)]


@pytest.mark.parametrize("name", sorted(rt.VOCABS))
def test_added_tokens_are_whole_and_marked(name):
    """Every token the table adds encodes as one id, special or not as the table says, and
    bos/eos are the table's."""
    vocab = rt.VOCABS[name]
    if reason := rt.missing(vocab):
        pytest.skip(reason)
    tokenizer = rt.load(vocab)
    specials = rt.special_tokens(tokenizer)
    for token in vocab.special + vocab.plain:
        ids = tokenizer.encode(f"a{token}b", add_special_tokens=False)
        assert len(ids) == 3 and tokenizer.convert_ids_to_tokens(ids[1]) == token, token
        assert (token in specials) == (token in vocab.special), token
    if vocab.eos:
        assert tokenizer.eos_token == vocab.eos
    if vocab.bos:
        assert tokenizer.bos_token == vocab.bos


def test_llama3_from_metas_tokenizer_model():
    """The Llama 3 vocabulary holds Meta's control tokens at Meta's ids, including the two the
    Llama 3 GGUF lacks, and not the `<|endoftext|>` the GGUF adds."""
    if reason := rt.missing(rt.VOCABS["llama3"]):
        pytest.skip(reason)
    tokenizer = rt.load("llama3")
    ids = tokenizer.convert_tokens_to_ids(["<|begin_of_text|>", "<|eom_id|>", "<|eot_id|>"])
    assert ids == [128000, 128008, 128009]
    assert tokenizer.convert_tokens_to_ids("<|python_tag|>") == 128010
    assert len(tokenizer) == 128256
    assert "<|endoftext|>" not in tokenizer.get_vocab()
    text = "<|start_header_id|>assistant<|end_header_id|>\n\nhi<|eot_id|>"
    assert tokenizer.encode(text, add_special_tokens=False) == [
        128006,
        78191,
        128007,
        271,
        6151,
        128009,
    ]
