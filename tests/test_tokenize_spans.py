"""Assistant masks from the full render of real chat templates (packer/tokenize/spans.py).

The templates are the stock ones llama.cpp ships (read from the llama-cpp-python sdist that
`make setup` downloads into .whl/; skipped where it is absent), each with a tiny byte-level BPE
trained in the test that holds the template's special tokens (Llama 3's pre-tokenizer regex,
so newlines stay together as in the real vocabularies). Expected trained texts are written
here by hand from the contract (docs/tokenize.md): from the end of each reply's header through
its end-of-turn token, nothing the template adds after the last turn.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from tokenizers_util import LLAMA3_SPLIT, build_tokenizer

pytest.importorskip("transformers")

from packer.tokenize import Encoder, RawRecordError, TemplateError, to_record  # noqa: E402

SDIST = Path(__file__).resolve().parents[1] / ".whl" / "llama_cpp_python-0.3.36.tar.gz"
CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
R1 = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
R1 += [
    f"<｜{t}｜>"
    for t in [
        "tool▁calls▁begin",
        "tool▁calls▁end",
        "tool▁call▁begin",
        "tool▁call▁end",
        "tool▁outputs▁begin",
        "tool▁outputs▁end",
        "tool▁output▁begin",
        "tool▁output▁end",
        "tool▁sep",
    ]
]
FAMILIES = {  # name: (template file, special tokens, eos, bos)
    "phi-3.5": (
        "microsoft-Phi-3.5-mini-instruct.jinja",
        ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"],
        "<|endoftext|>",
        None,
    ),
    "llama-3.1": (
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]
        + ["<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
        "<|eot_id|>",
        "<|begin_of_text|>",
    ),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", CHATML, "<|im_end|>", None),
    "qwen3.5": ("Qwen3.5-4B.jinja", [*CHATML, "<think>", "</think>"], "<|im_end|>", None),
    "gpt-oss": (
        "openai-gpt-oss-120b.jinja",
        ["<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>"]
        + ["<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"],
        "<|return|>",
        None,
    ),
    "mistral-nemo": (
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]"]
        + ["[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
        "</s>",
        "<s>",
    ),
    "gemma-2": (
        "google-gemma-2-2b-it.jinja",
        ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
        "<eos>",
        "<bos>",
    ),
    "r1-distill": (
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        R1,
        "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>",
    ),
    "hermes-2-pro": (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        [*CHATML, "<|begin_of_text|>"],
        "<|im_end|>",
        "<|begin_of_text|>",
    ),
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "the weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def call(arguments) -> dict:
    return {
        "id": "abcdefghi",
        "type": "function",
        "function": {"name": "weather", "arguments": arguments},
    }


def tool_chat(arguments) -> dict:
    return {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "weather in paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call(arguments)]},
            {"role": "tool", "tool_call_id": "abcdefghi", "name": "weather", "content": 'sun "C"'},
            {"role": "assistant", "content": "it is sun"},
        ],
    }


ONE = {
    "messages": [
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "fine, café"},
    ]
}
TWO = {
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "one", "reasoning_content": "think 1"},
        {"role": "user", "content": "two?"},
        {"role": "assistant", "content": "two", "reasoning_content": "think 2"},
    ]
}
OPENS = {  # a ShareGPT chunk: the assistant speaks first; reasoning inline
    "messages": [
        {"role": "assistant", "content": "first reply"},
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nsecond"},
    ]
}


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict:
    if not SDIST.exists():
        pytest.skip(f"{SDIST.name} absent (make setup downloads it)")
    names = {f for f, *_ in FAMILIES.values()}
    found = {}
    with tarfile.open(SDIST) as tar:
        for member in tar:
            name = member.name.rsplit("/", 1)[-1]
            if "/models/templates/" in member.name and name in names:
                found[name] = tar.extractfile(member).read().decode()
    return found


@pytest.fixture(scope="module")
def family(templates, tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    made = {}

    def get(name: str, **options) -> Encoder:
        if name not in made:
            file, specials, eos, bos = FAMILIES[name]
            made[name] = build_tokenizer(
                root / name,
                templates[file],
                specials=specials,
                eos=eos,
                bos=bos,
                split=LLAMA3_SPLIT,
            )
        return Encoder(made[name], **options)

    return get


def pieces(encoder: Encoder, ids, labels) -> list[str]:
    """The trained runs of tokens, decoded, and a check that the ids are the render's."""
    out, run = [], []
    for token, label in zip(ids.tolist(), labels.tolist()):
        if label != -100:
            assert label == token
            run.append(token)
        elif run:
            out.append(encoder.tokenizer.decode(run))
            run = []
    if run:
        out.append(encoder.tokenizer.decode(run))
    return out


def encode(encoder: Encoder, row: dict):
    record = to_record(row)
    ids, labels = encoder.encode_batch([record])[0]
    messages = encoder.template.prepare(record.messages)
    text = encoder.template.render(messages, record.tools)[0]
    assert ids.tolist() == encoder.tokenizer(text, add_special_tokens=False)["input_ids"]
    return text, pieces(encoder, ids, labels)


def test_phi_trains_nothing_after_the_last_end_of_turn(family):
    """Phi-3.5 appends <|endoftext|> once after the whole chat: never trained (prefix
    rendering trained it with the last reply)."""
    enc = family("phi-3.5")
    text, trained = encode(enc, ONE)
    assert text.endswith("fine, café<|end|>\n<|endoftext|>")
    assert trained == ["fine, café<|end|>"]
    text, trained = encode(enc, TWO)
    assert trained == ["one<|end|>", "two<|end|>"]


def test_llama_tool_results_written_through_tojson(family):
    enc = family("llama-3.1")
    for arguments in ({"city": "paris"}, '{"city": "paris"}'):
        text, trained = encode(enc, tool_chat(arguments))
        assert '"sun \\"C\\""' in text  # the tool result, through tojson
        call_text = '{"name": "weather", "parameters": ' + (
            '{"city": "paris"}' if isinstance(arguments, dict) else json.dumps(arguments)
        )
        assert trained == [call_text + "}<|eot_id|>", "it is sun<|eot_id|>"]


def test_qwen3_trains_the_reasoning_its_full_render_keeps(family):
    enc = family("qwen3")
    assert encode(enc, ONE)[1] == ["<think>\n\n</think>\n\nfine, café<|im_end|>"]
    text, trained = encode(enc, TWO)
    assert "think 1" not in text  # dropped from the earlier turn by the template
    assert trained == ["one<|im_end|>", "<think>\nthink 2\n</think>\n\ntwo<|im_end|>"]
    assert encode(enc, OPENS)[1] == [
        "first reply<|im_end|>",
        "<think>\nhmm\n</think>\n\nsecond<|im_end|>",
    ]
    assert encode(enc, tool_chat({"city": "paris"}))[1] == [
        '<tool_call>\n{"name": "weather", "arguments": {"city": "paris"}}\n</tool_call><|im_end|>',
        "<think>\n\n</think>\n\nit is sun<|im_end|>",
    ]


def test_qwen3_options_reasoning_tool_calls_and_one_sample_per_turn(family):
    enc = family("qwen3", train_reasoning=False)
    assert encode(enc, TWO)[1] == ["one<|im_end|>", "two<|im_end|>"]
    enc = family("qwen3", train_tool_calls=False)
    assert encode(enc, tool_chat({"city": "paris"}))[1] == [
        "<think>\n\n</think>\n\nit is sun<|im_end|>"
    ]
    enc = family("qwen3", turns="one-per-sample")
    samples = enc.encode_batch([to_record(TWO)])[0]
    assert len(samples) == 2
    first, second = (pieces(enc, ids, labels) for ids, labels in samples)
    # the first turn rendered as the last one: its reasoning is kept and trained
    assert first == ["<think>\nthink 1\n</think>\n\none<|im_end|>"]
    assert second == ["<think>\nthink 2\n</think>\n\ntwo<|im_end|>"]
    last = family("qwen3", turns="one-per-sample", train_on="last")
    assert len(last.encode_batch([to_record(TWO)])[0]) == 1
    with pytest.raises(Exception, match="one-per-sample"):
        family("qwen3", turns="one-per-sample", train_on="all")


def test_qwen35_header_ends_where_a_token_ends(family):
    """Qwen3.5's generation prompt ends `<think>\\n`, and its render's `<think>\\n\\n` makes one
    `\\n\\n` token: the header is the longest held prefix of it that ends where a token ends,
    `...<think>`. A reply with reasoning holds the whole G: its header ends after `<think>\\n`."""
    enc = family("qwen3.5")
    assert enc.template.prompt == "<|im_start|>assistant\n<think>\n"
    assert encode(enc, ONE)[1] == ["\n\n</think>\n\nfine, café<|im_end|>"]
    text, trained = encode(enc, TWO)  # with reasoning, `<think>\\n` is the header's: G holds it
    assert trained == ["one<|im_end|>", "think 2\n</think>\n\ntwo<|im_end|>"]


def test_gpt_oss_channels_between_pieces_are_trained(family):
    enc = family("gpt-oss")
    assert encode(enc, ONE)[1] == ["<|channel|>final<|message|>fine, café<|return|>"]
    text, trained = encode(enc, TWO)
    assert trained == [
        "<|channel|>final<|message|>one<|end|>",
        "<|channel|>analysis<|message|>think 2<|end|><|start|>assistant"
        "<|channel|>final<|message|>two<|return|>",
    ]
    text, trained = encode(enc, tool_chat({"city": "paris"}))
    assert trained == [
        ' to=functions.weather<|channel|>commentary json<|message|>{"city": "paris"}<|call|>',
        "<|channel|>final<|message|>it is sun<|return|>",
    ]
    enc = family("gpt-oss", train_reasoning=False)
    assert encode(enc, TWO)[1][1] == "two<|return|>"


def test_mistral_nemo_empty_prompt_and_tools(family):
    """No generation prompt: a reply starts after the [/INST] before it; [TOOL_CALLS], which
    only a reply of tool calls opens with, is the model's to write."""
    enc = family("mistral-nemo")
    assert encode(enc, ONE) == ("<s>[INST]hi there[/INST]fine, café</s>", ["fine, café</s>"])
    text, trained = encode(enc, tool_chat({"city": "paris"}))
    assert trained == [
        '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "paris"}, "id": "abcdefghi"}]</s>',
        "it is sun</s>",
    ]


def test_r1_distill_header_is_the_part_of_the_prompt_the_render_holds(family):
    enc = family("r1-distill")
    assert enc.template.prompt.startswith("<｜Assistant｜><think>\n")
    assert encode(enc, OPENS)[1] == [
        "first reply<｜end▁of▁sentence｜>",
        "second<｜end▁of▁sentence｜>",
    ]
    text, trained = encode(enc, tool_chat({"city": "paris"}))
    assert trained[1] == "it is sun<｜end▁of▁sentence｜>"  # after a tool result: no header


def test_gemma2_and_its_own_refusals(family):
    enc = family("gemma-2")
    assert encode(enc, ONE)[1] == ["fine, café<end_of_turn>"]
    with pytest.raises(RawRecordError, match="the chat template raises on this chat: System role"):
        encode(enc, TWO)


def test_hermes_tool_use_template_needs_the_chats_tools(family):
    enc = family("hermes-2-pro")  # probed with a tool: its render iterates `tools`
    assert enc.template.needs_tools
    assert encode(enc, tool_chat({"city": "paris"}))[1] == [
        '<tool_call>\n{"name": "weather", "arguments": {"city": "paris"}}\n</tool_call><|im_end|>',
        "it is sun<|im_end|>",
    ]
    with pytest.raises(RawRecordError, match="needs the chat's tools and the record has none"):
        encode(enc, ONE)


def test_generation_tags_around_the_header_are_refused(family, tmp_path):
    """A {% generation %} block that holds the role header would train it: refused at once."""
    tagged = tmp_path / "tagged.jinja"
    tagged.write_text(
        "{%- for message in messages %}{%- if message['role'] == 'assistant' %}"
        "{% generation %}{{- '<|im_start|>assistant\\n' + message['content'] + '<|im_end|>' }}"
        "{% endgeneration %}{{- '\\n' }}{%- else %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    with pytest.raises(TemplateError, match="block holds the assistant's role header") as info:
        family("qwen3", chat_template=tagged)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    fixed = tmp_path / "fixed.jinja"
    fixed.write_text(
        tagged.read_text().replace(
            "{% generation %}{{- '<|im_start|>assistant\\n' + ",
            "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- ",
        )
    )
    assert encode(family("qwen3", chat_template=fixed), ONE)[1] == ["fine, café<|im_end|>"]


def test_on_error_skip_encodes_a_batch_in_one_pass(tmp_path, monkeypatch):
    """Rejected chats are left out of the same one encode_batch call (it was called again, on
    the whole batch, once per rejected chat), and the rejects name their lines."""
    import pyarrow.parquet as pq
    from tokenizers_util import TEMPLATES

    from packer.tokenize import worker
    from packer.tokenize.files import RawBatch
    from packer.tokenize.records import RawColumns

    enc = Encoder(build_tokenizer(tmp_path / "tok", TEMPLATES["plain"]))
    calls = []
    original = enc.encode_batch

    def counted(records, **kwargs):
        calls.append(len(records))
        return original(records, **kwargs)

    monkeypatch.setattr(enc, "encode_batch", counted)
    rows = []
    for n in range(10):
        reply = f"reply {n}" + (" <|im_end|>" if n % 3 == 0 else "")
        chat = [*ONE["messages"][:1], {"role": "assistant", "content": reply}]
        rows.append(json.dumps({"messages": chat}).encode())
    worker.setup(None, RawColumns(), "skip", encoder=enc)
    batch = RawBatch(0, 0, "raw.jsonl", list(range(1, 11)), rows)
    done = worker.tokenize_batch(batch, str(tmp_path))
    assert calls == [10]
    assert done.samples == 6 and len(done.rejects) == 4
    assert done.rejects[0].startswith("raw.jsonl:1: messages[1].content holds the special token")
    assert pq.read_table(tmp_path / done.shard).num_rows == 6


def test_one_sample_per_turn_through_a_worker(family, tmp_path):
    import pyarrow.parquet as pq

    from packer.tokenize import worker
    from packer.tokenize.files import RawBatch
    from packer.tokenize.records import RawColumns

    enc = family("qwen3", turns="one-per-sample")
    worker.setup(None, RawColumns(), "error", encoder=enc)
    batch = RawBatch(
        0, 0, "raw.jsonl", [1, 2], [json.dumps(TWO).encode(), json.dumps(ONE).encode()]
    )
    done = worker.tokenize_batch(batch, str(tmp_path))
    assert done.samples == 3 and pq.read_table(tmp_path / done.shard).num_rows == 3


def cli(*args, env=None):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), **(env or {})}
    cmd = [sys.executable, "-m", "packer", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_mask_options_through_the_cli_and_the_cache(family, tmp_path):
    """--no-train-reasoning and --turns one-per-sample reach the encoder from `tokenize` and
    `pack`, and a pack under other options does not reuse the cache entry of the first."""
    import pyarrow.parquet as pq

    enc = family("qwen3")
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps(TWO) + "\n" + json.dumps(ONE) + "\n")
    out = tmp_path / "tok"
    done = cli("tokenize", raw, "--tokenizer", enc.source, "-o", out, "--no-train-reasoning",
               "--turns", "one-per-sample", "--workers", 1)  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = pq.read_table(next(out.glob("part-*.parquet")))
    assert table.num_rows == 3
    trained = [
        pieces(enc, np.array(i), np.array(lab))
        for i, lab in zip(table["input_ids"].to_pylist(), table["labels"].to_pylist())
    ]
    assert trained == [
        ["one<|im_end|>"],
        ["two<|im_end|>"],
        ["<think>\n\n</think>\n\nfine, café<|im_end|>"],
    ]
    meta = json.loads((out / "tokenized.json").read_text())
    assert "one-per-sample" in json.dumps(meta)
    env = {"PACKER_CACHE_DIR": str(tmp_path / "cache")}
    base = ["pack", raw, "--tokenizer", enc.source, "-L", 256, "--workers", 1]
    first = cli(*base, "-o", tmp_path / "p1", env=env)
    again = cli(*base, "-o", tmp_path / "p2", env=env)
    other = cli(*base, "-o", tmp_path / "p3", "--turns", "one-per-sample", env=env)
    assert first.returncode == again.returncode == other.returncode == 0, other.stderr
    assert "reused from the cache" in again.stderr and "reused" not in other.stderr
    refused = cli("pack", raw, "-L", 256, "-o", tmp_path / "p4", "--no-train-tool-calls")
    assert refused.returncode == 2
    assert "--train-tool-calls needs --tokenizer" in refused.stderr
    bad = cli("tokenize", raw, "--tokenizer", enc.source, "-o", tmp_path / "t2", "--turns", "x")
    assert bad.returncode == 2 and "turns" in bad.stderr


def test_pack_dataset_takes_the_mask_options_through_an_encoder(family):
    import pyarrow as pa

    from packer import pack_dataset
    from packer.errors import UsageError

    enc = family("qwen3", turns="one-per-sample")
    table = pa.Table.from_pylist([{"messages": TWO["messages"]}])
    packed = pack_dataset(table, max_len=256, tokenizer=enc)
    assert sum(len(s) for s in packed["seq_lengths"].to_pylist()) == 2
    with pytest.raises(UsageError, match="the Encoder's own"):
        pack_dataset(table, max_len=256, tokenizer=enc, train_on="last")
