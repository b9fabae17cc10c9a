"""packer.tokenize against an independent reference, on a few hundred generated records.

The reference knows ChatML's structure and builds each chat turn by turn, tokenizing the pieces
apart (`<|im_start|>`, `role\\n`, content, `<|im_end|>`, `\\n`) with no template, no rendering and
no character offsets; it trains an assistant turn's content and its `<|im_end|>`. The encoder
renders the template and maps spans found by generation tags or by prefix rendering: both must
give the same ids and labels on every chat (OpenAI, ShareGPT or Alpaca; system prompt or not;
1-4 turns), text and pair.
For the tagged template, transformers' own `return_assistant_tokens_mask` is checked too.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from tokenizers_util import TEMPLATES, WORDS, build_tokenizer, generated_chat, sentence

pytest.importorskip("transformers")

from packer.tokenize import Encoder, to_record  # noqa: E402

IGNORE = -100
N = 300


@pytest.fixture(scope="module")
def toks(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tokenizers")
    return {name: build_tokenizer(root / name, TEMPLATES[name]) for name in ("tagged", "plain")}


def reference_chat(tok, chat: list[dict], train_on: str) -> tuple[list[int], list[int]]:
    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    start, end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    replies = [i for i, m in enumerate(chat) if m["role"] == "assistant"]
    ids, labels = [], []
    for i, message in enumerate(chat):
        head, body, tail = (
            [start, *enc(message["role"] + "\n")],
            [*enc(message["content"]), end],
            enc("\n"),
        )
        train = message["role"] == "assistant" and (train_on == "assistant" or i == replies[-1])
        ids += head + body + tail
        labels += (
            [IGNORE] * len(head) + (body if train else [IGNORE] * len(body)) + [IGNORE] * len(tail)
        )
    return ids, labels


def records(seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(N):
        pick = rng.random()
        if pick < 0.5:
            rows.append({"messages": generated_chat(rng)})
        elif pick < 0.6:  # ShareGPT
            speakers = {"system": "system", "user": "human", "assistant": "gpt"}
            chat = [
                {"from": speakers[m["role"]], "value": m["content"]} for m in generated_chat(rng)
            ]
            rows.append({"conversations": chat})
        elif pick < 0.7:  # Alpaca, with or without an input
            extra = sentence(rng) if rng.random() < 0.5 else ""
            rows.append({"instruction": sentence(rng), "input": extra, "output": sentence(rng)})
        elif pick < 0.85:
            rows.append({"text": sentence(rng)})
        else:
            rows.append(
                {
                    "prompt": sentence(rng),
                    "completion": " " + rng.choice(WORDS) + " " + sentence(rng),
                }
            )
    return rows


def reference(tok, row: dict, train_on: str) -> tuple[list[int], list[int]]:
    eos = tok.eos_token_id
    if "messages" in row:
        return reference_chat(tok, row["messages"], train_on)
    if "conversations" in row:
        roles = {"system": "system", "human": "user", "gpt": "assistant"}
        chat = [{"role": roles[t["from"]], "content": t["value"]} for t in row["conversations"]]
        return reference_chat(tok, chat, train_on)
    if "instruction" in row:
        user = row["instruction"] + (f"\n\n{row['input']}" if row["input"] else "")
        chat = [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]
        return reference_chat(tok, chat, train_on)
    if "text" in row:
        ids = [*tok.encode(row["text"]), eos]
        return ids, ids
    prompt, completion = (
        tok.encode(row["prompt"]),
        [*tok.encode(row["completion"], add_special_tokens=False), eos],
    )
    return prompt + completion, [IGNORE] * len(prompt) + completion


@pytest.mark.parametrize("train_on", ["assistant", "last"])
@pytest.mark.parametrize("name", ["tagged", "plain"])
def test_encoder_matches_the_reference(toks, name, train_on):
    enc = Encoder(toks[name], train_on=train_on)
    rows = records(seed=sum(map(ord, name + train_on)))
    assert sum("messages" in r for r in rows) > N // 3
    assert (
        sum("conversations" in r for r in rows) > 10 and sum("instruction" in r for r in rows) > 10
    )
    assert {len(r["messages"]) for r in rows if "messages" in r} >= {
        2,
        3,
        8,
        9,
    }  # 1-4 turns, system or not
    got = enc.encode_batch([to_record(r) for r in rows])
    for i, (row, (ids, labels)) in enumerate(zip(rows, got)):
        want_ids, want_labels = reference(enc.tokenizer, row, train_on)
        assert ids.tolist() == want_ids, i
        assert labels.tolist() == want_labels, i


def test_tagged_masks_match_transformers(toks):
    enc = Encoder(toks["tagged"])
    rng = random.Random(7)
    chats = [generated_chat(rng) for _ in range(100)]
    got = enc.encode_batch([to_record({"messages": c}) for c in chats])
    for chat, (ids, labels) in zip(chats, got):
        out = enc.tokenizer.apply_chat_template(
            chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        assert ids.tolist() == list(out["input_ids"])
        assert ((labels != IGNORE).astype(int) == np.asarray(out["assistant_masks"])).all()
