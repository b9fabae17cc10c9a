"""packer.tokenize: raw records → input_ids and labels, with the assistant masks checked.

Tokenizers are byte-level BPEs trained in the test (tests/tokenizers_util.py), saved with ChatML
templates with and without generation tags; byte-level decoding is exact, so trained tokens are
compared with the texts they must hold character for character. No hub.
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers_util import EOS, EOT, TEMPLATES, build_tokenizer

from packer.errors import UsageError

pytest.importorskip("transformers")

from packer.tokenize import (  # noqa: E402
    Encoder,
    RawColumns,
    RawRecordError,
    Record,
    TemplateError,
    TokenizerError,
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
        enc.describe()["mask_method"] == {"tagged": "generation-tags", "plain": "full-render"}[name]
    )


@pytest.mark.parametrize("name", ["tagged", "plain"])
def test_train_on_last_and_all(toks, name):
    last = Encoder(toks[name], train_on="last")
    ids, labels = encode_one(last, {"messages": CHAT})
    assert trained(last, ids, labels) == f"it is 4\nsee: 2 + 2 = 4{EOT}"
    every = Encoder(toks[name], train_on="all")
    ids, labels = encode_one(every, {"messages": CHAT})
    assert (labels == ids).all()
    assert every.fingerprint != last.fingerprint


def test_a_reply_that_opens_the_chat(encoders):
    chat = [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "hi"}]
    for enc in encoders.values():
        ids, labels = encode_one(enc, {"messages": chat})
        assert trained(enc, ids, labels) == "hello" + EOT


def test_batch_mixes_kinds_in_order(encoders):
    enc = encoders["plain"]
    rows = [{"text": "the oil"}, {"messages": CHAT}, {"prompt": "a", "completion": " b"}]
    batch = enc.encode_batch([to_record(r) for r in rows])
    assert [trained(enc, *pair) for pair in batch] == [
        "the oil" + EOS,
        f"fine, café ☕{EOT}it is 4\nsee: 2 + 2 = 4{EOT}",
        " b" + EOS,
    ]
    for row, pair in zip(rows, batch):  # the same as one at a time
        alone = encode_one(enc, row)
        assert all((a == b).all() for a, b in zip(pair, alone))


# --------------------------------------------------------------------------------------------
# Templates that are refused, and checks that fire


def chat_with_reasoning(turns: int) -> list[dict]:
    chat = []
    for t in range(turns):
        chat.append({"role": "user", "content": f"question {t}"})
        chat.append({"role": "assistant", "content": f"answer {t}", "reasoning_content": "hmm"})
    return chat


def test_a_template_that_rewrites_earlier_turns_trains_its_full_render(toks):
    """Like Qwen3, the template keeps only the last turn's reasoning: each turn is trained as
    the full render holds it (prefix rendering refused such a template)."""
    enc = Encoder(toks["reasoning"])
    one = to_record({"messages": chat_with_reasoning(1)})
    ids, labels = enc.encode_batch([one])[0]
    assert trained(enc, ids, labels) == f"<think>\nhmm\n</think>\n\nanswer 0{EOT}"
    ids, labels = enc.encode_batch([to_record({"messages": chat_with_reasoning(2)})])[0]
    text = enc.tokenizer.decode(ids.tolist())
    assert text.count("<think>") == 1 and "answer 0" in text
    assert trained(enc, ids, labels) == f"answer 0{EOT}<think>\nhmm\n</think>\n\nanswer 1{EOT}"


def tagged_without_end_of_turn() -> str:
    return TEMPLATES["tagged"].replace(
        "{%- generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}",
        "{%- generation %}{{ message['content'] }}{% endgeneration %}{{- '<|im_end|>' }}",
    )


def test_generation_block_that_leaves_out_the_end_of_turn_is_caught(toks, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(tagged_without_end_of_turn())
    assert template.read_text() != TEMPLATES["tagged"]
    enc = Encoder(toks["bare"], chat_template=template)
    with pytest.raises(
        RawRecordError, match="do not end with an end-of-turn token such as '<\\|im_end\\|>'"
    ):
        encode_one(enc, {"messages": CHAT})


def test_a_token_crossing_into_the_reply_is_caught(toks, tmp_path):
    # the generation prompt ends in a space, which byte-level BPE joins to the reply's first word
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATES["plain"].replace("\\n' }}", " ' }}"))
    enc = Encoder(toks["bare"], chat_template=template)
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the water"}]
    with pytest.raises(RawRecordError, match="a token crosses the start of assistant turn 1"):
        encode_one(enc, {"messages": chat})


def test_a_prompt_that_tokenizes_otherwise_alone_is_caught(toks, tmp_path):
    # "\n\n" ends the prompt: alone it is one token; before a word the regex splits it in two
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATES["plain"].replace("\\n' }}", "\\n\\n' }}"))
    enc = Encoder(toks["bare"], chat_template=template)
    backend = enc.tokenizer.backend_tokenizer
    assert len(backend.encode("\n\n", add_special_tokens=False).ids) == 1
    assert len(backend.encode("\n\nthe", add_special_tokens=False).ids) == 3
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the water"}]
    with pytest.raises(RawRecordError, match="before assistant turn 1 tokenizes differently alone"):
        encode_one(enc, {"messages": chat})


def test_a_prompt_tail_seen_before_is_still_checked_on_every_chat(toks, tmp_path):
    # the second chat's tail comes from the encoder's memo of pieces: the check still fires
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATES["plain"].replace("\\n' }}", "\\n\\n' }}"))
    enc = Encoder(toks["bare"], chat_template=template)
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the water"}]
    for _ in range(2):
        with pytest.raises(RawRecordError, match="before assistant turn 1 tokenizes differently"):
            encode_one(enc, {"messages": chat})
    assert "<|im_start|>assistant\n\n" in enc.memo


def test_long_prompt_tails_are_tokenized_each_time_not_kept(toks, tmp_path):
    # no special token between the user's text and the reply: each tail holds the user's text
    from packer.tokenize.boundaries import MEMO_CHARS

    template = tmp_path / "t.jinja"
    template.write_text(
        "{%- for message in messages %}{%- if message['role'] == 'assistant' %}"
        "{{- 'A:\\n' + message['content'] + '<|im_end|>\\n' }}{%- else %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '\\n' }}"
        "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- 'A:\\n' }}{%- endif %}"
    )
    enc = Encoder(toks["bare"], chat_template=template)
    short = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the oil"}]
    long = [{"role": "user", "content": "the water " * 40}, *short[1:]]
    records = [to_record({"messages": c}) for c in (short, long, long)]
    first = enc.encode_batch(records)
    again = enc.encode_batch(records)
    fresh = Encoder(toks["bare"], chat_template=template).encode_batch(records[1:2])
    assert all((a == b).all() for x, y in zip(first, again) for a, b in zip(x, y))
    assert all((a == b).all() for a, b in zip(first[1], fresh[0]))
    assert trained(enc, *first[1]) == f"the oil{EOT}"
    kept = [piece for piece in enc.memo if piece not in enc.specials]
    assert kept == ["<|im_start|>user\nhi\nA:\n"]
    assert all(isinstance(piece, str) and len(piece) <= MEMO_CHARS for piece in enc.memo)


def test_content_holding_a_control_token_is_refused(encoders):
    chat = [{"role": "user", "content": f"hi{EOT}"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(RawRecordError, match=r"messages\[0\].content holds the special token"):
        encode_one(encoders["plain"], {"messages": chat})
    with pytest.raises(RawRecordError, match="text holds the special token"):
        encode_one(encoders["plain"], {"text": f"a{EOS}b"})


def test_empty_mask_is_refused_unless_allowed(toks):
    strict, lenient = Encoder(toks["plain"]), Encoder(toks["plain"], allow_empty_mask=True)
    backend = strict.tokenizer.backend_tokenizer
    listed = backend.encode("<|im_start|>user\nhi<|im_end|>\n", add_special_tokens=False).ids
    with pytest.raises(RawRecordError, match="no token is trained"):
        strict.chat_sample(listed, [], [], 0)
    ids, labels = lenient.chat_sample(listed, [], [], 0)
    assert (labels == -100).all() and len(ids) > 0


def test_template_with_no_special_token_after_a_reply_is_refused(toks, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    with pytest.raises(TemplateError) as info:
        Encoder(toks["bare"], chat_template=template)
    assert info.value.exit_code == 2
    assert str(info.value).startswith("chat_template: ") and "no special token" in str(info.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{% for %}", "fails on a two-turn chat"),
        ("{{ raise_exception('no') }}", "fails on a two-turn chat (the template raises): no"),
    ],
)
def test_bad_template_files_name_the_option(toks, tmp_path, content, message):
    template = tmp_path / "t.jinja"
    if content is not None:
        template.write_text(content)
    with pytest.raises(TemplateError) as info:
        Encoder(toks["bare"], chat_template=template)
    assert str(info.value).startswith("chat_template: ") and message in str(info.value)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_chats_need_a_template(toks):
    enc = Encoder(toks["bare"])
    assert encode_one(enc, {"text": "the"})[0][-1] == enc.eos_id  # texts do not
    with pytest.raises(TemplateError, match="has no chat template: pass one"):
        encode_one(enc, {"messages": CHAT})


def test_tokenizer_errors_are_one_line(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as with no network
    with pytest.raises(TokenizerError, match=r"^tokenizer: \./nope is not a directory$"):
        Encoder("./nope")
    with pytest.raises(TokenizerError) as info:
        Encoder("no-such-org/no-such-model")
    text = str(info.value)
    assert text.startswith("tokenizer: no-such-org/no-such-model is not a local directory and ")
    assert "\n" not in text and info.value.exit_code == 2
    with pytest.raises(TokenizerError, match="holds no tokenizer"):
        Encoder(tmp_path)  # an empty directory
    with pytest.raises(UsageError, match="unknown train_on 'users'"):
        Encoder(tmp_path, train_on="users")


# --------------------------------------------------------------------------------------------
# Tool calls and multi-part content

CALL = {"type": "function", "function": {"name": "weather", "arguments": {"city": "paris"}}}
TOOL_CHAT = [
    {
        "role": "user",
        "content": [{"type": "text", "text": "the "}, {"type": "text", "text": "weather?"}],
    },
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": "sun", "tool_call_id": "1"},
    {"role": "assistant", "content": [{"type": "text", "text": "it is sun"}]},
]


def test_tool_calls_and_text_parts_go_through_a_template_that_renders_them(toks):
    enc = Encoder(toks["tools"])
    assert enc.template.parts and enc.template.tool_calls
    ids, labels = encode_one(enc, {"messages": TOOL_CHAT})
    text = enc.tokenizer.decode(ids.tolist())
    assert "<|im_start|>user\nthe weather?<|im_end|>" in text
    call = '<tool_call>weather {"city": "paris"}</tool_call>'
    assert trained(enc, ids, labels) == f"{call}{EOT}it is sun{EOT}"


def test_text_parts_are_joined_for_a_template_that_renders_strings_only(encoders):
    enc = encoders["plain"]
    assert not enc.template.parts
    chat = [TOOL_CHAT[0], TOOL_CHAT[3]]
    ids, labels = encode_one(enc, {"messages": chat})
    assert "user\nthe weather?<|im_end|>" in enc.tokenizer.decode(ids.tolist())
    assert trained(enc, ids, labels) == f"it is sun{EOT}"


def test_tool_calls_with_a_template_that_ignores_them_are_refused(encoders):
    with pytest.raises(RawRecordError, match=r"does not render messages\[1\]'s tool calls"):
        encode_one(encoders["plain"], {"messages": TOOL_CHAT})


# --------------------------------------------------------------------------------------------
# Identity: fingerprint, spec, describe


def test_fingerprint_follows_files_template_and_options_only(toks, tmp_path):
    import shutil

    base = Encoder(toks["plain"])
    copy = shutil.copytree(toks["plain"], tmp_path / "elsewhere")
    assert Encoder(copy).fingerprint == base.fingerprint  # the path does not count
    assert Encoder(copy).describe()["tokenizer_sha256"] == base.tokenizer_sha256
    (copy / "notes.bin").write_bytes(b"weights are not read")
    assert Encoder(copy).fingerprint == base.fingerprint
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATES["plain"])
    assert Encoder(copy, chat_template=template).fingerprint == base.fingerprint  # same text
    template.write_text(TEMPLATES["plain"] + " ")
    assert Encoder(copy, chat_template=template).fingerprint != base.fingerprint
    assert Encoder(copy, allow_empty_mask=True).fingerprint != base.fingerprint
    config = copy / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", '{"model_max_length": 7, ', 1))
    changed = Encoder(copy)
    assert changed.fingerprint != base.fingerprint
    assert changed.tokenizer_sha256 != base.tokenizer_sha256


def test_describe_names_what_the_manifest_records(toks, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATES["tagged"])
    described = Encoder(toks["bare"], chat_template=template, train_on="last").describe()
    assert described["tokenizer"] == str(toks["bare"])
    assert described["chat_template"] == str(template)
    assert described["mask_method"] == "generation-tags" and described["train_on"] == "last"
    assert described["end_of_turn"] == EOT
    assert len(described["tokenizer_sha256"]) == len(described["chat_template_sha256"]) == 64


def test_spec_rebuilds_the_encoder_in_another_process(toks, tmp_path):
    import json
    import pickle
    import subprocess
    import sys

    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATES["tagged"])
    enc = Encoder(toks["bare"], chat_template=template, train_on="last")
    spec = pickle.loads(pickle.dumps(enc.spec))
    template.unlink()  # the template travels as text
    rows = [{"messages": CHAT}, {"text": "the oil"}]
    expected = [
        [ids.tolist(), labels.tolist()]
        for ids, labels in enc.encode_batch([to_record(r) for r in rows])
    ]
    code = (
        "import json, sys\n"
        "from packer.tokenize import Encoder, to_record\n"
        "spec, rows = json.loads(sys.stdin.read())\n"
        "enc = Encoder.from_spec(spec)\n"
        "out = enc.encode_batch([to_record(r) for r in rows])\n"
        "print(json.dumps([[i.tolist(), l.tolist()] for i, l in out]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([spec, rows]),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout) == expected
    changed = dict(spec, fingerprint="0" * 64)
    with pytest.raises(TokenizerError, match="changed since the run started"):
        Encoder.from_spec(changed)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (
            {"role": "user", "content": "x", "tool_calls": [CALL]},
            "only assistant messages make tool calls",
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": []},
            "tool_calls must be a non-empty list",
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [{"function": {}}]},
            "must have a function with a name",
        ),
        ({"role": "assistant", "content": None}, "messages[1].content must be a string, got null"),
    ],
)
def test_bad_tool_calls_are_refused(message, error):
    with pytest.raises(RawRecordError) as info:
        to_record({"messages": [{"role": "user", "content": "hi"}, message]})
    assert error in str(info.value)


def test_cli_names_the_flags(toks, tmp_path):
    from packer.errors import flag_names

    with flag_names():
        with pytest.raises(TokenizerError, match=r"^--tokenizer: \./nope is not a directory$"):
            Encoder("./nope")
        with pytest.raises(TemplateError, match=r"^--chat-template: cannot read "):
            Encoder(toks["bare"], chat_template=tmp_path / "missing.jinja")
        with pytest.raises(UsageError, match="--train-on"):
            Encoder(toks["bare"], train_on="x")


def test_skip_errors_keeps_the_good_records_and_returns_the_errors(encoders):
    enc = encoders["plain"]
    rows = [
        {"text": "the oil"},
        {"text": f"a{EOT}"},  # refused before rendering
        {"messages": CHAT},
        {"prompt": "the water ", "completion": "is wet"},  # refused after tokenizing
        {"prompt": "a", "completion": " b"},
    ]
    records = [to_record(r) for r in rows]
    with pytest.raises(RawRecordError) as info:
        enc.encode_batch(records)
    assert info.value.index == 1
    out = enc.encode_batch(records, skip_errors=True)
    assert [type(o).__name__ for o in out] == [
        "tuple",
        "RawRecordError",
        "tuple",
        "RawRecordError",
        "tuple",
    ]
    assert out[1].index == 1 and out[3].index == 3 and "not a prefix" in str(out[3])
    for i in (0, 2, 4):
        assert all((a == b).all() for a, b in zip(out[i], encode_one(enc, rows[i])))
    with pytest.raises(RawRecordError, match="unknown record kind 'image'"):
        enc.encode_batch([Record("image")])


@pytest.mark.parametrize("name", ["tagged", "plain"])
def test_conversational_prompt_completion_trains_the_completion_only(encoders, name):
    enc = encoders[name]
    row = {"prompt": CHAT[:4], "completion": CHAT[4:]}
    record = to_record(row)
    assert record.kind == "chat" and record.train_from == 4 and record.messages == tuple(CHAT)
    ids, labels = encode_one(enc, row)
    assert (ids == encode_one(enc, {"messages": CHAT})[0]).all()
    assert trained(enc, ids, labels) == f"it is 4\nsee: 2 + 2 = 4{EOT}"
    with pytest.raises(RawRecordError, match="the completion has no assistant turn"):
        to_record({"prompt": CHAT[:3], "completion": [CHAT[3]]})
    with pytest.raises(
        RawRecordError, match="completion must be a list of messages like prompt, got str"
    ):
        to_record({"prompt": CHAT[:4], "completion": "x"})


def test_an_unreachable_hub_fails_at_once_in_one_line(monkeypatch):
    import time

    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for key in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    start = time.monotonic()
    with pytest.raises(TokenizerError) as info:
        Encoder("no-such-org/no-such-model")
    assert time.monotonic() - start < 20  # no minute of retries
    text = str(info.value)
    assert (
        "cannot be loaded from the Hugging Face hub: the hub is unreachable (127.0.0.1:9: " in text
    )
    assert "\n" not in text


def test_a_template_that_drops_a_message_is_caught(toks, tmp_path):
    """A template that leaves a user message out is refused on the chat; one that leaves the
    system prompt out (as Mistral-Nemo's does in a chat that ends with a reply) is what the
    template renders, and trains the same replies."""
    for role, refused in (("user", True), ("system", False)):
        template = tmp_path / f"no-{role}.jinja"
        template.write_text(
            TEMPLATES["plain"].replace(
                "{%- for message in messages %}",
                f"{{%- for message in messages if message['role'] != '{role}' %}}",
            )
        )
        enc = Encoder(toks["bare"], chat_template=template)
        if refused:
            with pytest.raises(RawRecordError, match=r"does not render messages\[1\]'s content \("):
                encode_one(enc, {"messages": CHAT})
            continue
        ids, labels = encode_one(enc, {"messages": CHAT})
        assert "be brief" not in enc.tokenizer.decode(ids.tolist())
        assert trained(enc, ids, labels) == f"fine, café ☕{EOT}it is 4\nsee: 2 + 2 = 4{EOT}"


def test_generation_tags_around_the_wrong_text_are_caught(toks, tmp_path):
    template = tmp_path / "t.jinja"  # the tags mark the header, the reply falls outside
    template.write_text(
        TEMPLATES["tagged"].replace(
            "{%- generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}",
            "{%- generation %}{{ 'ok' }}{% endgeneration %}{{ message['content'] + '<|im_end|>' }}",
        )
    )
    enc = Encoder(toks["bare"], chat_template=template)
    with pytest.raises(RawRecordError, match=r"block for messages\[2\] does not hold its reply"):
        encode_one(enc, {"messages": CHAT})


def test_a_template_that_raises_on_a_chat_names_the_chat(toks, tmp_path):
    template = tmp_path / "t.jinja"
    check = "{%- if messages and messages[0]['role'] == 'assistant' %}{{ raise_exception('roles must alternate') }}{%- endif %}"
    template.write_text(check + TEMPLATES["plain"])
    enc = Encoder(toks["bare"], chat_template=template)
    chat = [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "hi"}]
    records = [to_record({"messages": CHAT}), to_record({"messages": chat})]
    with pytest.raises(RawRecordError) as info:
        enc.encode_batch(records)
    assert str(info.value) == "the chat template raises on this chat: roles must alternate"
    assert info.value.index == 1


def test_a_rows_tools_reach_the_template(toks, tmp_path):
    template = tmp_path / "t.jinja"
    header = "{%- if tools %}{{- '<|im_start|>system\\n' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
    template.write_text(header + TEMPLATES["plain"])
    enc = Encoder(toks["bare"], chat_template=template)
    tools = [{"type": "function", "function": {"name": "weather"}}]
    ids, labels = encode_one(enc, {"messages": CHAT[1:3], "tools": tools})
    assert enc.tokenizer.decode(ids.tolist()).startswith('<|im_start|>system\n[{"type": "function"')
    assert trained(enc, ids, labels) == f"fine, café ☕{EOT}"
    with pytest.raises(RawRecordError, match="tools must be a list of tool definitions"):
        to_record({"messages": CHAT, "tools": "weather"})


@pytest.mark.parametrize("name", ["tagged", "plain", "tools"])
def test_the_direct_render_equals_transformers_renderer(toks, name):
    fast, slow = Encoder(toks[name]), Encoder(toks[name])
    assert fast.template.compiled is not None
    slow.template.compiled = None  # every render through render_jinja_template
    rows = [{"messages": CHAT}, {"messages": TOOL_CHAT if name == "tools" else CHAT[1:3]}]
    for row in rows:
        assert all((a == b).all() for a, b in zip(encode_one(fast, row), encode_one(slow, row)))


def test_a_tokenizer_json_directory_loads_without_torch(toks, tmp_path):
    """A bare tokenizer directory loads as PreTrainedTokenizerFast (no torch: ~3 CPU s per
    worker); a model directory (config.json) goes through AutoTokenizer; the ids are the same."""
    import importlib.util
    import json
    import shutil
    import subprocess
    import sys

    model = tmp_path / "model"
    shutil.copytree(toks["plain"], model)
    (model / "config.json").write_text("{}")
    rows = [{"messages": CHAT}, {"text": "the oil"}, {"prompt": "what", "completion": " is"}]
    code = (
        "import json, sys\n"
        "from packer.tokenize import Encoder, to_record\n"
        "path, rows = json.loads(sys.stdin.read())\n"
        "out = Encoder(path).encode_batch([to_record(r) for r in rows])\n"
        "print(json.dumps(['torch' in sys.modules, [[i.tolist(), l.tolist()] for i, l in out]]))\n"
    )
    runs = {
        name: json.loads(
            subprocess.run(
                [sys.executable, "-c", code],
                input=json.dumps([str(path), rows]),
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for name, path in (("bare", toks["plain"]), ("model", model))
    }
    assert runs["bare"][0] is False
    if importlib.util.find_spec("torch") is not None:  # torch is optional
        assert runs["model"][0] is True  # the fallback: AutoTokenizer, as before
    assert runs["bare"][1] == runs["model"][1]
    expected = Encoder(toks["plain"]).encode_batch([to_record(r) for r in rows])
    assert runs["bare"][1] == [[i.tolist(), lab.tolist()] for i, lab in expected]


@pytest.mark.parametrize("on_error", ["error", "skip"])
def test_a_chat_whose_reply_cannot_be_located_names_the_file_and_line(toks, tmp_path, on_error):
    """A template that cuts a reply (here to 30 characters) writes it other than whole: the
    chat is refused in one line naming its FILE:LINE and the message, inside a worker, like
    every other bad record (exit 1, nothing written; `--on-error skip` leaves it out)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    template = tmp_path / "cut.jinja"
    template.write_text(TEMPLATES["plain"].replace("message['content']", "message['content'][:30]"))
    long = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the oil " * 6}]
    rows = [{"text": "the oil"}, {"messages": chat_with_reasoning(1)}]
    rows += [{"messages": long}, {"text": "the water"}]
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "PACKER_CACHE_DIR": str(tmp_path / "cache")}
    args = ["pack", raw, "--tokenizer", toks["bare"], "--chat-template", template, "-L", 512]
    args += ["-o", out, "--workers", 2, "--on-error", on_error]
    done = subprocess.run(
        [sys.executable, "-m", "packer", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    expected = f"{raw}:3: the chat template renders messages[1] differently once its text"
    if on_error == "error":
        assert done.returncode == 1
        assert done.stderr.startswith(f"error: {expected}"), done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert not out.exists()
        assert not [p.name for p in tmp_path.iterdir() if ".packer-" in p.name]
    else:
        assert done.returncode == 0, done.stderr
        assert "4 lines into 3 samples" in done.stderr and "1 rejected" in done.stderr
        assert (out / "manifest.json").exists()


def test_a_render_that_ends_with_the_last_reply_trains_it_to_the_end(toks, tmp_path):
    """The last reply's end is the render's end, where no token starts: the mask runs to the
    last token (the lookup's fallback, not a token at that character)."""
    template = tmp_path / "t.jinja"
    template.write_text(
        "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
        "{{- message['content'] + '<|im_end|>' }}{%- if not loop.last %}{{- '\\n' }}{%- endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '\\n<|im_start|>assistant\\n' }}"
        "{%- endif %}"
    )
    enc = Encoder(toks["bare"], chat_template=template)
    ids, labels = encode_one(enc, {"messages": CHAT})
    text = enc.tokenizer.decode(ids.tolist())
    assert text.endswith(f"see: 2 + 2 = 4{EOT}")  # nothing after the last reply's end-of-turn
    assert labels[-1] == ids[-1]
    assert trained(enc, ids, labels) == f"fine, café ☕{EOT}it is 4\nsee: 2 + 2 = 4{EOT}"
