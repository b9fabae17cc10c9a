"""Token boundaries without offsets (`packer.tokenize.boundaries`), against HF's offsets and
against the prefix property written out here: on tiny trained tokenizers and on the anthropic
vocabulary, with both engines, and where a token straddles the boundary."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("tokenizers")

from engines_util import (  # noqa: E402
    ANTHROPIC_SPECIALS,
    PIECES,
    anthropic_backend,
    generated_texts,
    tiny_backend,
)
from tokenizers_util import SPECIALS  # noqa: E402

from packer.tokenize.boundaries import (  # noqa: E402
    special_anchors,
    special_pattern,
    token_boundaries,
    token_boundaries_batch,
)
from packer.tokenize.engines import HFEngine  # noqa: E402

SETTINGS = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_backend(tmp_path_factory.mktemp("tiny"))


def engines_of(backend):
    found = [HFEngine(backend)]
    try:
        from packer.tokenize.engines import FastokensEngine

        found.append(FastokensEngine.from_backend(backend))
    except Exception:  # not installed, or a tokenizer it cannot load: hf only
        pass
    return found


def prefix_reference(backend, text: str, ids: list[int], b: int):
    """The prefix property, written out: text[:b] tokenized alone starts the whole's ids."""
    alone = backend.encode(text[:b], add_special_tokens=False).ids
    return len(alone) if ids[: len(alone)] == alone else None


def offsets_say(encoding, b: int):
    """From HF's offsets: (a token crosses b, the number of tokens that end at or before b)."""
    crosses = any(start < b < end for start, end in encoding.offsets)
    return crosses, sum(1 for _, end in encoding.offsets if end <= b)


def check(backend, texts: list[str], specials, every: bool = True, rng=None):
    offsets_backend = backend.__class__.from_str(backend.to_str())
    offsets_backend.post_processor = None  # raw offsets, as packer reads them for chats
    for engine in engines_of(backend):
        ids = engine.encode_batch(texts, add_special_tokens=False)
        chars = [
            list(range(len(t) + 1))
            if every
            else sorted({0, len(t), *rng.sample(range(len(t) + 1), min(8, len(t) + 1))})
            for t in texts
        ]
        found = token_boundaries_batch(engine, texts, ids, chars, specials)
        plain = token_boundaries_batch(engine, texts, ids, chars)  # no cuts: every prefix whole
        assert found == plain
        for text, text_ids, wanted, got in zip(texts, ids, chars, found):
            encoding = offsets_backend.encode(text, add_special_tokens=False)
            assert encoding.ids == text_ids
            for b, k in zip(wanted, got):
                assert k == prefix_reference(backend, text, text_ids, b), (text, b)
                crosses, before = offsets_say(encoding, b)
                if crosses:
                    assert k is None, (text, b)
                elif k is not None:
                    assert k == before, (text, b)


@SETTINGS
@given(
    st.lists(st.lists(st.sampled_from([*PIECES, *SPECIALS]), max_size=12), min_size=1, max_size=6)
)
def test_every_boundary_of_tiny_tokenizer_texts(tiny, parts):
    check(tiny, ["".join(p) for p in parts], SPECIALS)


def test_chat_renders_on_a_smaller_tiny_vocabulary(tmp_path):
    check(tiny_backend(tmp_path, vocab_size=300), generated_texts(40, seed=3), SPECIALS)


def test_anthropic_vocabulary_as_shipped_and_without_its_normalizer():
    specials = [ANTHROPIC_SPECIALS[0], "<META_START>", "<EOT>"]
    texts = generated_texts(150, seed=4, specials=specials)
    rng = random.Random(4)
    for normalizer in (True, False):  # NFKC (hf only: fastokens lacks it), then none (both)
        check(anthropic_backend(normalizer), texts, ANTHROPIC_SPECIALS, every=False, rng=rng)


def test_a_token_that_straddles_the_boundary(tiny):
    engine = HFEngine(tiny)
    text = "<|im_start|>assistant\nwater<|im_end|>\n"
    ids = engine.encode_batch([text], add_special_tokens=False)[0]
    water = text.index("water")
    assert len(engine.encode_batch(["water"], add_special_tokens=False)[0]) == 1  # one token
    got = token_boundaries(
        engine, text, ids, [0, water, water + 2, len(text) - 1, len(text)], SPECIALS
    )
    assert got[0] == 0 and got[-1] == len(ids)
    assert got[2] is None  # inside "water"
    assert ids[got[1]] == engine.encode_batch(["water"], add_special_tokens=False)[0][0]
    assert ids[got[3] - 1] == tiny.token_to_id("<|im_end|>")


def test_an_added_token_that_strips_the_whitespace_before_it(tmp_path):
    """`<sep>` (lstrip) eats the spaces before it: the prefix up to it is not the ids before
    it, and the ids still give the anchors for the boundaries after it."""
    from tokenizers import AddedToken

    backend = tiny_backend(tmp_path)
    backend.add_special_tokens([AddedToken("<sep>", lstrip=True, special=True)])
    text = "hello   <sep> water <sep>the"
    engine = HFEngine(backend)
    ids = engine.encode_batch([text], add_special_tokens=False)[0]
    chars = list(range(len(text) + 1))
    pattern = special_pattern(["<sep>"])
    sep = backend.token_to_id("<sep>")
    assert special_anchors(text, ids, pattern, {"<sep>": sep})[1] == [0, ids.index(sep), 5]
    got = token_boundaries(engine, text, ids, chars, ["<sep>"])
    assert got == [prefix_reference(backend, text, ids, b) for b in chars]
    assert got[text.index("<sep>")] is None  # the spaces before it belong to <sep>
    assert got[text.index("<sep>") + 5] == ids.index(sep) + 1


def test_ids_that_do_not_hold_the_special_tokens_make_every_prefix_whole(tmp_path):
    """A single-word added token does not match inside a word, and under NFKC a full-width
    `＜x＞` is the added token `<x>`: the ids do not hold the special tokens where the text
    does (here as many, in another order), so no anchor is taken from them, and every prefix is
    tokenized whole."""
    from tokenizers import AddedToken, normalizers

    backend = tiny_backend(tmp_path)
    backend.normalizer = normalizers.NFKC()
    backend.add_special_tokens(
        [
            AddedToken("<w>", single_word=True, special=True),
            AddedToken("<x>", special=True, normalized=True),
        ]
    )
    w, x = backend.token_to_id("<w>"), backend.token_to_id("<x>")
    token = {"<w>": w, "<x>": x}
    engine = HFEngine(backend)
    texts = ["the<w>water <w> the", "the<w>water \uff1cx\uff1e <x> the", "\uff1cx\uff1e <x> the"]
    for text in texts:
        ids = engine.encode_batch([text], add_special_tokens=False)[0]
        assert ids.count(w) == max(0, text.count("<w>") - 1)  # not inside a word
        assert ids.count(x) == text.count("<x>") + text.count("\uff1cx\uff1e")
        assert special_anchors(text, ids, special_pattern(token), token) == ([0], [0])
        chars = list(range(len(text) + 1))
        got = token_boundaries(engine, text, ids, chars, list(token))
        assert got == [prefix_reference(backend, text, ids, b) for b in chars]


def test_the_memo_holds_short_pieces_only_and_gives_the_same_answers(tiny):
    engine = HFEngine(tiny)
    texts = generated_texts(30, seed=5)
    ids = engine.encode_batch(texts, add_special_tokens=False)
    chars = [[0, len(t) // 2, len(t)] for t in texts]
    memo: dict = {}
    first = token_boundaries_batch(engine, texts, ids, chars, SPECIALS, memo)
    assert memo and all(isinstance(k, str) and len(k) <= 256 for k in memo)
    assert token_boundaries_batch(engine, texts, ids, chars, SPECIALS, memo) == first
    assert token_boundaries_batch(engine, texts, ids, chars, SPECIALS) == first


def test_a_boundary_outside_the_text_is_refused(tiny):
    engine = HFEngine(tiny)
    with pytest.raises(ValueError, match="character boundary 9 is outside the text"):
        token_boundaries(
            engine, "hello", engine.encode_batch(["hello"], add_special_tokens=False)[0], [9]
        )


def test_a_special_token_longer_than_the_memo_keeps_is_found(tmp_path):
    """An added token of more than MEMO_CHARS characters is tokenized, kept until the batch is
    done, and anchors the boundaries after it as a short one does."""
    from tokenizers import AddedToken

    from packer.tokenize.boundaries import MEMO_CHARS

    long = "<" + "x" * MEMO_CHARS + ">"
    backend = tiny_backend(tmp_path)
    backend.add_special_tokens([AddedToken(long, special=True)])
    engine = HFEngine(backend)
    text = f"the water{long}assistant\nwater the"
    ids = engine.encode_batch([text], add_special_tokens=False)[0]
    chars = list(range(len(text) + 1))
    memo: dict = {}
    got = token_boundaries_batch(engine, [text], [ids], [chars], [long], memo)[0]
    assert got == [prefix_reference(backend, text, ids, b) for b in chars]
    assert got[text.index(long) + len(long)] == ids.index(backend.token_to_id(long)) + 1
    assert long not in memo and ("", long) not in memo
