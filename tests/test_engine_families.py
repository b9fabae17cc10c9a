"""The tokenizer engines on the real-template matrix (tests/test_template_families.py): for every
family whose vocabulary fastokens loads, every sample's ids and labels are the same with
`fastokens` as with `hf`, and both meet the mask contract; a vocabulary fastokens refuses falls
back to `hf` with one line under `auto` and fails in one line under `fastokens`.

In one process, with the families' own chats and reference (`check`): the encoder is what
`packer tokenize` runs in each worker, and the CLI's bytes are compared between the engines in
tests/test_engine_wiring.py."""

from __future__ import annotations

import pytest

pytest.importorskip("fastokens")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from test_template_families import (  # noqa: E402
    NAMES,
    chats,  # noqa: F401 (a fixture)
    check,
    families,  # noqa: F401 (a fixture)
    grouped,
)

from packer.tokenize import Encoder, to_record  # noqa: E402
from packer.tokenize.engines import EngineError  # noqa: E402


def samples(encoder, records) -> list[tuple[list, list]]:
    return [(ids.tolist(), labels.tolist()) for ids, labels in encoder.encode_batch(records)]


@pytest.fixture(autouse=True, scope="module")
def cache_dir(tmp_path_factory):
    """One cache for the module, as for a user's runs: a family on a vocabulary an earlier
    family probed reads the proof's verdict, and its own renders are still compared."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACKER_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.mark.parametrize("name", grouped(NAMES))
def test_engines_agree_on_the_family(families, chats, name):  # noqa: F811
    family = families(name)
    rows, _ = chats(name)
    records = [to_record(r) for r in rows]
    template = family.family.template_path

    def encoder(engine: str):
        return Encoder(family.dir, chat_template=template, tokenizer_engine=engine)

    # `check` compares each sample with the contract's reference, whose ids are the 🤗
    # tokenizer's encoding of the full render: equal to it, the samples are hf's
    auto = encoder("auto")
    got = samples(auto, records)
    if auto.engine_name == "hf":  # a vocabulary fastokens refuses
        note = auto.take_note()
        assert note.startswith("tokenizer_engine auto: tokenizing with hf, not fastokens (")
        assert "\n" not in note
        with pytest.raises(EngineError) as raised:
            encoder("fastokens").encode_batch(records)
        assert str(raised.value).startswith("tokenizer_engine fastokens: ")
        assert "\n" not in str(raised.value)
        pytest.skip(f"fastokens cannot be used for {name}: {note}")
    assert auto.engine_name == "fastokens"
    check(family, rows, got, "assistant")
