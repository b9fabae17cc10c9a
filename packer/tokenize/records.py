"""One raw row (a dict read from JSONL, Parquet or a 🤗 dataset) → one `Record` to tokenize.

The kind is detected per row, so one file may mix them: OpenAI chats (`messages` with
`role`/`content`), ShareGPT chats (`conversations` with `from`/`value`), Alpaca records
(`instruction`, optional `input`, `output`: a one-turn chat), plain `text`, and
`prompt`/`completion` pairs (strings, or TRL's conversational pairs: two lists of messages,
of which only the completion's replies are trained). A column that is absent or null does not
count, so a Parquet file whose rows are of several kinds (nulls elsewhere) works. A row is refused with one line saying
what is wrong and where in the row; the caller adds the file and line.

A chat's turn may carry a `weight` (axolotl's and LLaMA-Factory's ShareGPT, OpenAI's
fine-tuning chats): 0 keeps the turn out of the loss, 1 (or no weight) leaves it as the mask
would have it; any other value is refused rather than guessed at. The weights travel on the
Record (`untrained`), not on the messages, which are handed to the template as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from packer.errors import InputError

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "assistant",  # LLaMA-Factory's ShareGPT: a call written as the reply
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
# keys of a message that are handed to the template as they are, beside role and content
PASSED_KEYS = ("tool_calls", "tool_call_id", "name", "reasoning_content", "thinking")
WEIGHT = "weight"  # a turn's weight: 0 (not trained) or 1 (trained as usual)


class RawRecordError(InputError):
    """A raw record that cannot be tokenized; the message says what is wrong, without the file
    and line (the driver prefixes "FILE:LINE: "). `index`: the record's place in its batch."""

    def __init__(self, message: str, *, index: int | None = None):
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class RawColumns:
    """The column names each kind is read from (overridable, e.g. for `chat` instead of
    `messages`)."""

    messages: str = "messages"
    conversations: str = "conversations"
    text: str = "text"
    prompt: str = "prompt"
    completion: str = "completion"
    instruction: str = "instruction"
    input: str = "input"
    output: str = "output"
    tools: str = "tools"


@dataclass(frozen=True)
class Record:
    """One sample to tokenize. `messages` (chats): dicts with `role` and `content` (a string,
    or a list of `{"type": "text", "text": ...}` parts) and the PASSED_KEYS present in the row;
    `tools`: the row's tool definitions, handed to the template."""

    kind: str  # "chat" | "text" | "completion"
    messages: tuple[dict, ...] | None = None
    text: str | None = None
    prompt: str | None = None
    completion: str | None = None
    tools: tuple[dict, ...] | None = None
    train_from: int = 0  # messages before it are a conversational prompt: context, not trained
    untrained: frozenset[int] = frozenset()  # the messages of weight 0: never trained


def present(row: dict, column: str) -> bool:
    return row.get(column) is not None


def to_record(row: dict, columns: RawColumns = RawColumns()) -> Record:
    """The row as a Record, or RawRecordError naming the column and what is wrong with it."""
    if not isinstance(row, dict):
        raise RawRecordError(f"expected an object (a row with named columns), got {kind_of(row)}")
    c = columns
    kinds = {
        "messages": present(row, c.messages),
        "conversations": present(row, c.conversations),
        "instruction": present(row, c.instruction) or present(row, c.output),
        "prompt": present(row, c.prompt) or present(row, c.completion),
        "text": present(row, c.text),
    }
    found = [k for k, v in kinds.items() if v]
    if not found:
        names = [c.messages, c.conversations, c.text, f"{c.prompt}/{c.completion}"]
        names.append(f"{c.instruction}/{c.output}")
        raise RawRecordError(f"no {', '.join(repr(n) for n in names)} column in the row")
    if len(found) > 1:
        named = {"messages": c.messages, "conversations": c.conversations, "text": c.text}
        named |= {"instruction": c.instruction, "prompt": c.prompt}
        listed = " and ".join(repr(named[k]) for k in found)
        raise RawRecordError(f"the row has both {listed}: one kind of record per row")
    tools = tool_list(row.get(c.tools), c.tools)
    kind = found[0]
    if kind == "messages":
        messages = openai_messages(row[c.messages], c.messages)
        return chat(messages, tools, untrained=zero_weights(row[c.messages], c.messages))
    if kind == "conversations":
        turns = row[c.conversations]
        messages = sharegpt_messages(turns, c.conversations)
        return chat(messages, tools, untrained=zero_weights(turns, c.conversations))
    if kind == "instruction":
        return chat(alpaca_messages(row, c), tools)
    if kind == "prompt" and isinstance(row.get(c.prompt), list):
        return conversational_pair(row, c, tools)
    if kind == "prompt":
        prompt = string(row.get(c.prompt), c.prompt, empty=True)
        completion = string(row.get(c.completion), c.completion)
        return Record("completion", prompt=prompt, completion=completion)
    return Record("text", text=string(row[c.text], c.text))


def kind_of(value) -> str:
    return "null" if value is None else type(value).__name__


def string(value, where: str, *, empty: bool = False) -> str:
    """`value` if it is a string, non-blank unless `empty`."""
    if not isinstance(value, str):
        raise RawRecordError(f"{where} must be a string, got {kind_of(value)}")
    if not empty and not value.strip():
        raise RawRecordError(f"{where} is empty")
    return value


def tool_list(value, where: str) -> tuple[dict, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RawRecordError(f"{where} must be a list of tool definitions (objects)")
    return tuple(value)


def chat(
    messages: list[dict], tools, train_from: int = 0, untrained: frozenset[int] = frozenset()
) -> Record:
    messages = [inline_reasoning(m) for m in messages]
    if not any(m["role"] == "assistant" for m in messages[train_from:]):
        where = "the completion" if train_from else "the chat"
        raise RawRecordError(f"{where} has no assistant turn: nothing to train on")
    return Record(
        "chat", messages=tuple(messages), tools=tools, train_from=train_from, untrained=untrained
    )


def zero_weights(turns: list[dict], where: str, first: int = 0) -> frozenset[int]:
    """The places (from `first`) of the turns whose weight is 0. A weight that is neither 0 nor
    1 (0.5, "0", true, null) is refused: a loss weight packer cannot honour, or a typo."""
    zero = set()
    for i, turn in enumerate(turns):
        if WEIGHT not in turn:
            continue
        value = turn[WEIGHT]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in (0, 1):
            raise RawRecordError(
                f"{where}[{i}].{WEIGHT} is {json_text(value)}: a turn's weight is 0 (not "
                "trained) or 1 (trained)"
            )
        if value == 0:
            zero.add(first + i)
    return frozenset(zero)


def json_text(value) -> str:
    """A value as JSON writes it (null, true, "0", 0.5), cut to 40 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def conversational_pair(row: dict, c: RawColumns, tools) -> Record:
    """TRL's conversational prompt/completion: two lists of messages, one chat whose
    completion's assistant turns are trained."""
    prompt = openai_messages(row[c.prompt], c.prompt)
    completion = row.get(c.completion)
    if not isinstance(completion, list):
        raise RawRecordError(
            f"{c.completion} must be a list of messages like {c.prompt}, got {kind_of(completion)}"
        )
    replies = openai_messages(completion, c.completion)
    untrained = zero_weights(row[c.prompt], c.prompt)
    untrained |= zero_weights(completion, c.completion, len(prompt))
    return chat(prompt + replies, tools, len(prompt), untrained)


def message_list(value, where: str) -> list:
    if not isinstance(value, list):
        raise RawRecordError(f"{where} must be a list of messages, got {kind_of(value)}")
    if not value:
        raise RawRecordError(f"{where} is an empty conversation")
    return value


def openai_messages(value, where: str) -> list[dict]:
    messages = []
    for i, message in enumerate(message_list(value, where)):
        at = f"{where}[{i}]"
        if not isinstance(message, dict):
            raise RawRecordError(
                f"{at} must be an object with role and content, got {kind_of(message)}"
            )
        role = message.get("role")
        if role not in ROLES:
            raise RawRecordError(f"{at}.role is {role!r}; roles are {', '.join(ROLES)}")
        out = {"role": role}
        out.update({k: message[k] for k in PASSED_KEYS if message.get(k) is not None})
        if "tool_calls" in out:
            check_tool_calls(out["tool_calls"], f"{at}.tool_calls", role)
        content = message.get("content")
        if content is None and "tool_calls" in out:
            content = ""
        out["content"] = message_content(content, f"{at}.content", empty="tool_calls" in out)
        messages.append(out)
    return messages


def message_content(content, where: str, *, empty: bool = False):
    """A string, or a list of text parts (each `{"type": "text", "text": str}`)."""
    if isinstance(content, list):
        if not content:
            raise RawRecordError(f"{where} is an empty list of parts")
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise RawRecordError(f"{where}[{j}] must be an object, got {kind_of(part)}")
            if part.get("type", "text") != "text":
                raise RawRecordError(
                    f"{where}[{j}] is a {part.get('type')!r} part: only text parts can be tokenized"
                )
            string(part.get("text"), f"{where}[{j}].text", empty=True)
        if not empty and not "".join(p["text"] for p in content).strip():
            raise RawRecordError(f"{where} is empty")
        return [dict(part, type="text") for part in content]
    return string(content, where, empty=empty)


def check_tool_calls(calls, where: str, role: str) -> None:
    if role != "assistant":
        raise RawRecordError(f"{where}: only assistant messages make tool calls")
    if not isinstance(calls, list) or not calls:
        raise RawRecordError(f"{where} must be a non-empty list of calls")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RawRecordError(f"{where}[{j}] must have a function with a name")


def sharegpt_messages(value, where: str) -> list[dict]:
    messages = []
    for i, turn in enumerate(message_list(value, where)):
        at = f"{where}[{i}]"
        if not isinstance(turn, dict):
            raise RawRecordError(f"{at} must be an object with from and value, got {kind_of(turn)}")
        speaker = turn.get("from")
        if speaker not in SHAREGPT_ROLES:
            known = ", ".join(SHAREGPT_ROLES)
            raise RawRecordError(f"{at}.from is {speaker!r}; known speakers are {known}")
        messages.append(
            {"role": SHAREGPT_ROLES[speaker], "content": string(turn.get("value"), f"{at}.value")}
        )
    return messages


def alpaca_messages(row: dict, c: RawColumns) -> list[dict]:
    """Alpaca's instruction (and input, after a blank line) is the user turn; output replies."""
    instruction = string(row.get(c.instruction), c.instruction)
    extra = row.get(c.input)
    if extra is not None:
        extra = string(extra, c.input, empty=True)
    user = f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction
    return [
        {"role": "user", "content": user},
        {"role": "assistant", "content": string(row.get(c.output), c.output)},
    ]


THINK, UNTHINK = "<think>", "</think>"


def inline_reasoning(message: dict) -> dict:
    """An assistant reply that opens with `<think>…</think>` and has no reasoning field: the
    reasoning moved to `reasoning_content` (what the templates read; `\n` around it and
    before the reply dropped, as Qwen3's template drops them), the rest left as the content."""
    content = message.get("content")
    if (
        message["role"] != "assistant"
        or not isinstance(content, str)
        or message.get("reasoning_content") is not None
        or message.get("thinking") is not None
        or not content.lstrip().startswith(THINK)
        or UNTHINK not in content
    ):
        return message
    head, _, rest = content.partition(UNTHINK)
    reasoning = head.lstrip()[len(THINK) :].strip("\n")
    return dict(message, content=rest.lstrip("\n"), reasoning_content=reasoning)
