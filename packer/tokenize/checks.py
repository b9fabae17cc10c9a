"""What a raw record is checked for before it is encoded, against the tokenizer and the options:
no text the user wrote holds a control token (it would be read as one, a turn boundary the
user never meant), and no turn of weight 0 meets `train_on="all"` (which trains every token)."""

from __future__ import annotations

import json
import re

from packer.errors import option
from packer.tokenize.records import RawRecordError, Record


def special_tokens(tokenizer) -> list[str]:
    """The texts of the added tokens that are special (control tokens)."""
    tokens = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    return sorted(tokens | set(tokenizer.all_special_tokens))


def control_pattern(tokenizer):
    tokens = sorted(special_tokens(tokenizer), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens))) if tokens else None


def check_control(pattern, record: Record, index: int) -> None:
    """RawRecordError where a text of the record holds a control token (`pattern`, from
    `control_pattern`; None: the tokenizer has none)."""
    if pattern is None:
        return
    for where, text in record_texts(record):
        found = pattern.search(text)
        if found:
            raise RawRecordError(
                f"{where} holds the special token {found.group()!r}, which would be read as a "
                "control token",
                index=index,
            )


def check_weights(train_on: str, record: Record, index: int) -> None:
    """A turn of weight 0 cannot be left out of `train_on="all"`, which trains every token."""
    if train_on == "all" and record.untrained:
        raise RawRecordError(
            f"turn {min(record.untrained)} of the chat (counting from 0) has weight 0, and "
            f"{option('train_on')} all trains every token",
            index=index,
        )


def record_texts(record: Record):
    """(where, text) of every string of a record that is tokenized as the user wrote it."""
    if record.kind == "text":
        yield "text", record.text
    elif record.kind == "completion":
        yield "prompt", record.prompt
        yield "completion", record.completion
    else:
        for i, message in enumerate(record.messages):
            content = message["content"]
            if isinstance(content, str):
                yield f"messages[{i}].content", content
            else:
                for j, part in enumerate(content):
                    yield f"messages[{i}].content[{j}].text", part["text"]
            if len(message) == 2:  # role and content: nothing else to check
                continue
            for key in ("reasoning_content", "thinking"):
                if isinstance(message.get(key), str):
                    yield f"messages[{i}].{key}", message[key]
            for j, call in enumerate(message.get("tool_calls") or ()):
                arguments = (call.get("function") or {}).get("arguments")
                if arguments is not None:
                    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
                    yield f"messages[{i}].tool_calls[{j}].arguments", text
