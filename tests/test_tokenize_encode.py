"""packer.tokenize: raw records → input_ids and labels, with the assistant masks checked.

Tokenizers are byte-level BPEs trained in the test (tests/tokenizers_util.py), saved with ChatML
templates with and without generation tags; byte-level decoding is exact, so trained tokens are
compared with the texts they must hold character for character. No hub.
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers_util import EOS, EOT, TEMPLATES, build_tokenizer

pytest.importorskip("transformers")

from packer.tokenize import (  # noqa: E402
    Encoder,
    RawColumns,
    RawRecordError,
    Record,
    to_record,
)

CHAT = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "how are you?"},
    {"role": "assistant", "content": "fine, café ☕"},
    {"role": "user", "content": "what is 2 + 2?"},
    {"role": "assistant", "content": "it is 4\nsee: 2 + 2 = 4"},
]


@pytest.fixture(scope="module")
def toks(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tokenizers")
    names = {**TEMPLATES, "bare": None}
    return {name: build_tokenizer(root / name, text) for name, text in names.items()}


@pytest.fixture(scope="module")
def encoders(toks) -> dict:
    return {name: Encoder(toks[name]) for name in ("tagged", "plain")}


def trained(encoder: Encoder, ids, labels) -> str:
    assert ids.dtype == np.int32 and labels.dtype == np.int32 and ids.shape == labels.shape
    kept = labels != -100
    assert (labels[kept] == ids[kept]).all()
    return encoder.tokenizer.decode(ids[kept].tolist())


def encode_one(encoder: Encoder, row: dict):
    return encoder.encode_batch([to_record(row)])[0]


# --------------------------------------------------------------------------------------------
# Records


def test_kinds_are_detected_per_row():
    assert to_record({"text": "a"}) == Record("text", text="a")
    assert to_record({"prompt": "q", "completion": "a"}).kind == "completion"
    chat = to_record({"messages": CHAT, "text": None})
    assert chat.kind == "chat" and chat.messages[2] == CHAT[2]
    share = to_record(
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    )
    assert share.messages == (
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    )
    alpaca = to_record({"instruction": "add", "input": "2 2", "output": "4"})
    assert alpaca.messages == (
        {"role": "user", "content": "add\n\n2 2"},
        {"role": "assistant", "content": "4"},
    )
    renamed = to_record({"chat": CHAT}, RawColumns(messages="chat"))
    assert renamed.kind == "chat"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"messages": []}, "messages is an empty conversation"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ({"messages": [{"role": "bot", "content": "hi"}]}, "messages[0].role is 'bot'"),
        (
            {"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}]},
            "messages[0].content must be a string, got int",
        ),
        (
            {"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": "a"}]},
            "messages[0].content is empty",
        ),
        ({"messages": "hi"}, "messages must be a list of messages, got str"),
        ({"conversations": [{"from": "robot", "value": "x"}]}, "conversations[0].from is 'robot'"),
        ({"text": ""}, "text is empty"),
        ({"prompt": "q"}, "completion must be a string, got null"),
        ({"text": "a", "messages": CHAT}, "both 'messages' and 'text'"),
        ({"other": 1}, "no 'messages', 'conversations', 'text'"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "url": "x"}]},
                    {"role": "assistant", "content": "a"},
                ]
            },
            "messages[0].content[0] is a 'image' part: only text parts",
        ),
    ],
)
def test_bad_records_say_what_is_wrong(row, message):
    with pytest.raises(RawRecordError) as info:
        to_record(row)
    assert message in str(info.value)
    assert info.value.exit_code == 1 and "\n" not in str(info.value)


# --------------------------------------------------------------------------------------------
# Texts and prompt/completion pairs


def test_text_trains_everything_and_eos(encoders):
    enc = encoders["plain"]
    ids, labels = encode_one(enc, {"text": "the water"})
    assert trained(enc, ids, labels) == "the water" + EOS
    assert ids[-1] == enc.eos_id and (labels == ids).all()


def test_completion_masks_the_prompt(encoders):
    enc = encoders["plain"]
    ids, labels = encode_one(enc, {"prompt": "Q: the water", "completion": " is wet"})
    assert enc.tokenizer.decode(ids.tolist()) == "Q: the water is wet" + EOS
    assert trained(enc, ids, labels) == " is wet" + EOS
    assert labels[0] == -100


def test_completion_whose_prompt_tokenizes_otherwise_is_refused(encoders):
    # "water " alone ends in a space token; "water is" tokenizes the space with "is"
    with pytest.raises(RawRecordError, match="not a prefix"):
        encode_one(encoders["plain"], {"prompt": "the water ", "completion": "is wet"})


# --------------------------------------------------------------------------------------------
# Chats


@pytest.mark.parametrize("name", ["tagged", "plain"])
def test_chat_trains_each_reply_and_its_end_of_turn(encoders, name):
    enc = encoders[name]
    ids, labels = encode_one(enc, {"messages": CHAT})
    assert enc.tokenizer.decode(ids.tolist()) == enc.tokenizer.apply_chat_template(
        CHAT, tokenize=False
    )
    assert trained(enc, ids, labels) == f"fine, café ☕{EOT}it is 4\nsee: 2 + 2 = 4{EOT}"
    assert (
        enc.describe()["mask_method"]
        == {"tagged": "generation-tags", "plain": "prefix-rendering"}[name]
    )
