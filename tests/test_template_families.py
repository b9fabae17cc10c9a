"""packer's assistant masks on the real chat templates of 21 model families (issue 45).

For each family (tests/real_templates.py: llama.cpp's template, a real vocabulary), seeded chats
of its own (system or not, 1-4 turns, tool calls and tool results where the template renders
them, reasoning, unicode) are written to a JSONL file and tokenized by `packer tokenize` once per
mode. Every sample read back is checked:

- ids == the tokenizer's encoding of the full render (transformers' `apply_chat_template`,
  `tokenize=False`, no special tokens added beyond the template's);
- labels == a reference computed here from the mask contract (CONTRACT-45, docs/tokenize.md),
  not from packer's code: each message's pieces are unique strings, located in the render by
  plain string search (the test may; packer may not). For a trained assistant message:
  its *header* is the longest prefix of the generation prompt G that the render holds before its
  first piece (after the previous message's pieces); its *end-of-turn token* the first control
  token of the vocabulary at or after the end of its last piece; every token whose characters
  lie from the header's end through the end-of-turn token is trained, nothing else.

The render hands a message's reasoning to the template under both names that templates read,
`reasoning_content` (Qwen3, Qwen3.5, Gemma-4) and `thinking` (gpt-oss): the test expects packer
to do the same with reasoning given under either name or inline as `<think>…</think>`.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from unittest import mock

import pyarrow.parquet as pq
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

import real_templates as rt  # noqa: E402
from conftest import python_script, read_shards  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from packer.cli import app  # noqa: E402

IGNORE = -100
CHATS = 20
# the date packer's renders write where a template writes today's date (`strftime_now`:
# gpt-oss, Llama-3.2, Mistral-Small-3.2, Granite-3.3), unless --template-date is given
TEMPLATE_DATE = datetime(2025, 1, 1)


class OnTheTemplateDate(datetime):
    """transformers' `strftime_now` reads `datetime.now()`: the references are rendered on
    packer's date."""

    @classmethod
    def now(cls, tz=None):
        return TEMPLATE_DATE


@dataclass(frozen=True)
class Spec:
    """What a family's template does with a chat (read from the template), and what the test
    gives it. `G`: its generation prompt (checked against the template); `system`: it takes a
    system message; `tools`: it renders tool calls and tool results; `needs_tools`: it fails
    without `tools`; `reasoning`: it may keep a reply's reasoning in the render (where it is
    found, it is a piece; where not, dropped); `first`: a chat may start with the assistant;
    `one_call`: at most one tool call per message; `cohere`: tools in Cohere's format;
    `dict_arguments`: tool-call arguments as dicts only (otherwise JSON strings too);
    `next_header`: where no control token ends a turn, the text the next message's header
    begins with (the turn ends there); `string_arguments`: tool-call arguments as JSON strings
    only; `null_content`: a reply of tool calls has a null content (the template writes its
    calls only then). Decisions on the contract: comments above each entry."""

    G: str
    system: bool = True
    tools: bool = False
    needs_tools: bool = False
    reasoning: bool = False
    first: bool = True
    one_call: bool = False
    cohere: bool = False
    dict_arguments: bool = False
    next_header: str = ""
    string_arguments: bool = False
    null_content: bool = False


LLAMA3_G = "<|start_header_id|>assistant<|end_header_id|>\n\n"
CHATML_G = "<|im_start|>assistant\n"
SPECS = {
    # tool results written through tojson; one tool call a message; content of a tool-call
    # message dropped by the template (so the generated ones have none)
    "llama-3.1": Spec(LLAMA3_G, tools=True, one_call=True),
    "llama-3.2": Spec(LLAMA3_G, tools=True, one_call=True),
    "llama-3.3": Spec(LLAMA3_G, tools=True, one_call=True),
    "qwen2.5": Spec(CHATML_G, tools=True),
    # drops the reasoning of replies before the last user turn; writes an empty think block
    # into the last reply without reasoning: text between header and first piece, trained
    "qwen3": Spec(CHATML_G, tools=True, reasoning=True),
    # raises on a chat without a user message: the one-per-sample chat of an assistant-first
    # chunk's first reply would be one, so the generated chats start with a user or system
    # message. History writes `<think>\n\n</think>\n\n` into a reply without reasoning: G's
    # last `\n` is inside the `\n\n` token there, the header ends at `<think>`
    # its template reads tool-call arguments with `|items`: dicts only
    "qwen3.5": Spec(
        CHATML_G + "<think>\n", tools=True, reasoning=True, first=False, dict_arguments=True
    ),
    # llama.cpp's copy closes the think block of G unless enable_thinking; G's `<think>\n</think>`
    # is absent from history: the header is `<|im_start|>assistant\n`; reasoning never kept
    "qwq": Spec(CHATML_G + "<think>\n</think>", tools=True, reasoning=True),
    # writes `<｜Assistant｜><｜tool▁calls▁begin｜>` before the first tool-call message of a
    # chat only: a later one has no header, its trained text starts at its first piece (the
    # function's name)
    "r1-distill-qwen": Spec("<｜Assistant｜><think>\n</think>", reasoning=True, tools=True),
    # writes a message's tool calls only where its content is null (not ""), and concatenates
    # their arguments as strings (dict arguments: the template raises); otherwise as the Qwen
    # distill: a later tool-call message has no header
    "r1-distill-llama": Spec(
        "<｜Assistant｜><think>\n",
        reasoning=True,
        tools=True,
        string_arguments=True,
        null_content=True,
    ),
    # writes `<think></think>` after every `<｜Assistant｜>` of history (thinking off): the
    # whole of G is the header
    "deepseek-v3.1": Spec("<｜Assistant｜><think></think>", reasoning=True, tools=True),
    # reasoning read from `thinking`, kept for the last reply only; earlier replies end with
    # `<|end|>`, the last with `<|return|>`; renders a message's first tool call only; tool
    # results through tojson; the system prompt holds today's date (strftime_now)
    "gpt-oss": Spec("<|start|>assistant", tools=True, reasoning=True, one_call=True),
    # refuses a system message
    "gemma-2": Spec("<start_of_turn>model\n", system=False, first=False),
    # G's thought channel is absent from history: the header is `<|turn>model\n`
    # tool calls, tool responses and the reply after them in one model turn, their markers plain
    # added tokens of this vocabulary: a tool-call message ends where `<|tool_response>` begins
    "gemma-4": Spec(
        "<|turn>model\n<|channel>thought\n<channel|>",
        reasoning=True,
        tools=True,
        next_header="<|tool_response>",
    ),
    # appends `<|endoftext|>` once after the whole chat: never trained
    "phi-3.5": Spec("<|assistant|>\n"),
    # G is empty, so is the header: a reply begins where the turn before it ends, after the
    # first control token that follows the previous message (`[/INST]`, `[/TOOL_RESULTS]`), so
    # `[TOOL_CALLS]` is trained; moves the system prompt and the tools into the last user turn
    "mistral-nemo": Spec("", first=False, tools=True),
    "mistral-small-3.2": Spec("", first=False, tools=True),
    # the next two render tool definitions but not an assistant message's tool calls
    "granite-3.3": Spec("<|start_of_role|>assistant<|end_of_role|>"),
    "smollm3": Spec(CHATML_G),
    "hermes-2-pro": Spec(CHATML_G, tools=True, needs_tools=True),
    "hermes-3": Spec(CHATML_G, tools=True, needs_tools=True),
    # tools in Cohere's format (parameter_definitions); tool calls as `Action: ```json [...]```
    # and no control token: the turn ends where the next message's header begins; arguments
    # written through tojson: dicts only
    "command-r-plus": Spec(
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        needs_tools=True,
        tools=True,
        first=False,
        cohere=True,
        dict_arguments=True,
        next_header="<|START_OF_TURN_TOKEN|>",
    ),
}

WORDS = (  # noqa: SIM905 (a word list reads better as one string)
    "the of and model train data café naïve 日本語 Ünïcödé 🙂 Ωμέγα приве́т ﬁne 42 3.14 "
    "don't well, yes: (maybe) x² ½"
).split()


class Chats:
    """Seeded chats with unique pieces: every content, reasoning, tool name and argument holds
    a marker `zq<n>` seen nowhere else, so each is found once in the render."""

    def __init__(self, spec: Spec, seed: int):
        self.spec, self.rng, self.n = spec, random.Random(seed), 0

    def text(self, low=2, high=9) -> str:
        self.n += 1
        words = self.rng.choices(WORDS, k=self.rng.randint(low, high))
        return f"{' '.join(words)} zq{self.n}"

    def tools(self) -> list[dict]:
        if self.spec.cohere:
            query = {"description": "What to look up.", "type": "str", "required": True}
            return [
                {
                    "name": "lookup",
                    "description": "Looks a query up.",
                    "parameter_definitions": {"query": query},
                }
            ]
        return [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Looks a query up.",
                    "parameters": {
                        "type": "object",
                        "properties": {"query": {"type": "string"}},
                        "required": ["query"],
                    },
                },
            }
        ]

    def reply(self, reasoning: bool) -> dict:
        message = {"role": "assistant", "content": self.text()}
        if reasoning and self.spec.reasoning and self.rng.random() < 0.6:
            message["reasoning_content"] = self.text(3, 12)
        return message

    def call_turn(self) -> list[dict]:
        """An assistant message with tool calls (no content) and the tool results."""
        calls, results = [], []
        for _ in range(1 if self.spec.one_call else self.rng.randint(1, 2)):
            self.n += 1
            call_id = f"c{self.n:08d}"  # Mistral's: 9 letters and digits
            arguments = {"query": self.text(1, 4)}
            if self.spec.string_arguments or (
                not self.spec.dict_arguments and self.rng.random() < 0.3
            ):
                # arguments as a JSON string, as OpenAI's API gives them
                arguments = json.dumps(arguments, ensure_ascii=False)
            function = {"name": "lookup", "arguments": arguments}
            calls.append({"id": call_id, "type": "function", "function": function})
            results.append(
                {"role": "tool", "tool_call_id": call_id, "name": "lookup", "content": self.text()}
            )
        content = None if self.spec.null_content else ""
        return [{"role": "assistant", "content": content, "tool_calls": calls}, *results]

    def chat(self) -> dict:
        spec, rng = self.spec, self.rng
        messages = []
        if spec.system and rng.random() < 0.4:
            messages.append({"role": "system", "content": self.text()})
        if spec.first and not messages and rng.random() < 0.15:  # a chunk of a conversation
            messages.append(self.reply(reasoning=False))
        use_tools = spec.needs_tools or (spec.tools and rng.random() < 0.4)
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": self.text()})
            if use_tools and spec.tools and rng.random() < 0.5:
                messages += self.call_turn()
            messages.append(self.reply(reasoning=True))
        row = {"messages": messages}
        if use_tools:
            row["tools"] = self.tools()
        return row


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as the test renders them: reasoning under both names templates read."""
    out = []
    for m in messages:
        m = dict(m)
        if "reasoning_content" in m:
            m["thinking"] = m["reasoning_content"]
        out.append(m)
    return out


class Family:
    """A family's tokenizer, template and the reference of the contract."""

    def __init__(self, name: str):
        self.name, self.spec = name, SPECS[name]
        self.family = rt.FAMILIES[name]
        self.dir = rt.tokenizer_dir(self.family.vocab)
        self.tokenizer = rt.load(self.family.vocab)
        self.template = self.family.template_path.read_text(encoding="utf-8")
        self.specials = sorted(rt.special_tokens(self.tokenizer), key=len, reverse=True)

    def render(self, messages, tools=None, prompt=False) -> str:
        from transformers.utils import chat_template_utils as utils

        messages = template_messages(messages)
        with mock.patch.object(utils, "datetime", OnTheTemplateDate):
            if self.spec.null_content:  # apply_chat_template would drop a null content
                variables = self.tokenizer.special_tokens_map
                texts, _ = utils.render_jinja_template(
                    [messages],
                    tools=tools,
                    chat_template=self.template,
                    add_generation_prompt=prompt,
                    **variables,
                )
                return texts[0]
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self.template,
                tokenize=False,
                add_generation_prompt=prompt,
            )

    def generation_prompt(self) -> str:
        tools = Chats(self.spec, 0).tools() if self.spec.needs_tools else None
        chat = [{"role": "user", "content": "hello zq0"}]
        bare, prompted = self.render(chat, tools), self.render(chat, tools, prompt=True)
        # what the prompt appends where the bare render ends, or where the text it appends after
        # the last turn begins (Phi-3.5's `<|endoftext|>`, at a control token)
        cuts = [len(bare)] + [at for t in self.specials if (at := bare.rfind(t)) >= 0]
        cut = max(c for c in cuts if prompted.startswith(bare[:c]))
        return prompted[cut:]

    def pieces(self, message: dict, text: str) -> list[tuple[str, int, int]]:
        """(kind, start, end) of the message's pieces that the render holds, in render order."""
        found = []
        strings = [("content", message.get("content") or "")]
        strings.append(("reasoning", message.get("reasoning_content") or ""))
        names = {}
        for call in message.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            strings.append(("call", arguments["query"]))
            names[arguments["query"]] = call["function"]["name"]
        for kind, s in strings:
            if not s:
                continue
            start = text.find(s)
            assert start >= 0 or kind == "reasoning", (self.name, kind, s)
            assert text.find(s, start + 1) < 0, (self.name, "not unique", s)
            if start < 0:
                continue
            end = start + len(s)
            if kind == "call":  # the piece starts at the function's name, which every
                # template writes before the arguments (not unique: the nearest one)
                before = max([0, *(p[2] for p in found)])
                name = text.rfind(names[s], before, start)
                start = name if name >= 0 else start
            found.append((kind, start, end))
        return sorted(found, key=lambda p: p[1])

    def spans(self, messages, text: str, trained: set[int], reasoning=True, calls=True):
        """The contract's trained character spans of the assistant messages `trained` (indexes
        into messages), in the full render `text`."""
        spec = self.spec
        G = spec.G
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        bounds = {a for a, _ in encoding["offset_mapping"]} | {len(text)}
        spans, after = [], 0
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                for s in (message.get("content") or "",):
                    if s and (at := text.find(s, after)) >= 0:
                        after = at + len(s)
                continue
            pieces = self.pieces(message, text)
            first, last = pieces[0][1], pieces[-1][2]
            if G:
                header_end = header(text, G, after, first, bounds)
            else:  # Mistral: the message begins where the previous turn's control token ends
                ends = [
                    at + len(t) for t in self.specials if 0 <= (at := text.find(t, after)) < first
                ]
                header_end = min(ends) if ends and i else first
            hits = [(text.find(t, last), t) for t in self.specials]
            # none: the turn ends at the end of the render (Gemma-4's tool calls, last)
            at, token = min([(at, t) for at, t in hits if at >= 0] or [(len(text), "")])
            eot_start, eot_end = at, at + len(token)
            if spec.next_header:
                # no control token before the next message's header: the turn ends there; where
                # the header is any message's (G's first token: Command-R+), also before the
                # text the template adds after the last turn (its instructions to the model)
                following = self.pieces(messages[i + 1], text) if i + 1 < len(messages) else []
                cut = -1
                if following:
                    cut = text.rfind(spec.next_header, last, following[0][1])
                elif G.startswith(spec.next_header):
                    cut = text.find(spec.next_header, last)
                if cut >= 0 and cut < eot_start:
                    eot_start = eot_end = cut
            after = last
            if i not in trained:
                continue
            start = header_end
            kinds = [p[0] for p in pieces]
            if not reasoning and "reasoning" in kinds:
                start = next((p[1] for p in pieces if p[0] != "reasoning"), eot_start)
            if not calls and "call" in kinds:
                before = [p[2] for p in pieces if p[0] != "call" and p[1] < first_call(pieces)]
                cut = max([start, *before]) if before else start
                if all(k == "call" for k in kinds if k != "reasoning") and not before:
                    # a message of tool calls only: its end-of-turn token is not trained either
                    spans.append((start, cut))
                    continue
                spans += [(start, cut), (eot_start, eot_end)]
                continue
            spans.append((start, eot_end))
        return [(a, b) for a, b in spans if b > a]

    def labels(self, text: str, spans) -> tuple[list[int], list[int]]:
        encoding = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, labels = encoding["input_ids"], []
        for token, (a, b) in zip(ids, encoding["offset_mapping"]):
            inside = [any(s <= c < e for s, e in spans) for c in range(a, max(b, a + 1))]
            assert all(inside) or not any(inside), (self.name, "a token straddles", text[a:b])
            labels.append(token if inside[0] else IGNORE)
        return ids, labels


def header(text: str, G: str, after: int, first: int, bounds: set[int]) -> int:
    """Where the header of a message whose first piece starts at `first` ends: the longest
    prefix of G that the render holds between `after` and `first`, ending on a token boundary
    (Qwen3.5's `<think>\n` of G meets `\n\n</think>` in history, one `\n\n` token: the
    header is `...<think>`; QwQ's `<think>` of G would otherwise match the `<` of `<tool_call>`).
    With no such prefix the trained text starts at the first piece."""
    for k in range(len(G), 0, -1):
        at = text.rfind(G[:k], after, first)
        while at >= 0:
            if at + k in bounds:
                return at + k
            at = text.rfind(G[:k], after, at + k - 1)
    return first


def first_call(pieces) -> int:
    return min(p[1] for p in pieces if p[0] == "call")


@pytest.fixture(scope="session")
def families():
    cache = {}

    def get(name):
        if name not in cache:
            if reason := rt.missing(family=rt.FAMILIES[name]):
                pytest.skip(reason)
            cache[name] = Family(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def chats(tmp_path_factory):
    """Per family: (rows, path of the JSONL file)."""
    cache = {}

    def get(name):
        if name not in cache:
            spec = SPECS[name]
            gen = Chats(spec, seed=sorted(SPECS).index(name) + 45)
            rows = [gen.chat() for _ in range(CHATS)]
            path = tmp_path_factory.mktemp("chats") / f"{name}.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            cache[name] = rows, path
        return cache[name]

    return get


def tokenize(family: Family, path: Path, out: Path, *options) -> list[tuple[list, list]]:
    args = ["tokenize", str(path), "--tokenizer", str(family.dir)]
    args += ["--chat-template", str(family.family.template_path), "-o", str(out), "--workers", "1"]
    # in this process: the vocabulary loaded once per worker (an earlier run's interrupt state
    # is never inherited: tests/test_interrupt_state.py)
    result = CliRunner().invoke(app, [*args, *options])
    assert result.exit_code == 0, (family.name, options, result.output[-2000:])
    return read_samples(out)


def read_samples(out: Path) -> list[tuple[list, list]]:
    """(input_ids, labels) of every sample of a `packer tokenize` output, in order."""
    rows = []
    for shard in sorted(out.glob("part-*.parquet")):
        table = pq.read_table(shard)
        rows += zip(table["input_ids"].to_pylist(), table["labels"].to_pylist())
    return rows


SESSION = """
import json, os, time
{prelude}
from typer.testing import CliRunner
from packer.cli import app

results = []
for args in {commands!r}:
    if args[0] == "python":  # a step of the test's own between two commands
        exec(args[1])
        continue
    started = time.perf_counter()
    result = CliRunner().invoke(app, args)
    seconds = time.perf_counter() - started
    results.append([result.exit_code, result.stderr[-3000:], result.stdout, seconds])
print("\\n" + json.dumps(results))
"""


def packer_commands(commands: list[list], prelude: str = "") -> list[tuple]:
    """(exit code, stderr, stdout, seconds) of each packer command, run one after the other; a
    step ["python", CODE] runs CODE between two commands. In this process, on one core (verify
    re-tokenizes here, not in worker processes); with a `prelude` (code that patches what the
    commands see: the clock), in a process of their own that runs it first."""
    commands = [[str(a) for a in args] for args in commands]
    if not prelude:
        results = []
        with mock.patch("packer.tokenize.run.available", return_value=1):
            for args in commands:
                if args[0] == "python":
                    exec(args[1], {"json": json, "os": os})
                    continue
                started = time.perf_counter()
                result = CliRunner().invoke(app, args)
                seconds = time.perf_counter() - started
                results.append((result.exit_code, result.stderr[-3000:], result.stdout, seconds))
        return results
    result = python_script(SESSION.format(prelude=prelude, commands=commands))
    assert result.returncode == 0, result.stderr[-3000:]
    return [tuple(r) for r in json.loads(result.stdout.strip().splitlines()[-1])]


def expected(family: Family, row: dict, mode: str, **switches):
    """(ids, labels) of each sample packer must write for this row under `mode`."""
    messages, tools = row["messages"], row.get("tools")
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if mode == "one-per-sample":
        out = []
        for i in replies:
            chat = messages[: i + 1]
            text = family.render(chat, tools)
            out.append(family.labels(text, family.spans(chat, text, {i}, **switches)))
        return out
    text = family.render(messages, tools)
    trained = set(replies[-1:]) if mode == "last" else set(replies)
    return [family.labels(text, family.spans(messages, text, trained, **switches))]


def check(family, rows, samples, mode, **switches):
    want = [s for row in rows for s in expected(family, row, mode, **switches)]
    assert len(samples) == len(want), (family.name, mode, len(samples), len(want))
    for n, ((ids, labels), (ref_ids, ref_labels)) in enumerate(zip(samples, want)):
        assert ids == ref_ids, (family.name, mode, n, "ids differ from the full render's")
        if labels != ref_labels:
            bad = [j for j, (a, b) in enumerate(zip(labels, ref_labels)) if a != b]
            shown = family.tokenizer.decode(ids[bad[0] : bad[-1] + 1])
            raise AssertionError(
                f"{family.name} {mode} sample {n}: {len(bad)} labels differ from the "
                f"contract's, tokens {bad[0]}..{bad[-1]} ({shown!r}; packer trains "
                f"{labels[bad[0]] != IGNORE} at the first)"
            )


NAMES = sorted(SPECS)


def grouped(names):
    """Each family's tests on one xdist worker (`--dist loadgroup`): a worker loads a family's
    vocabulary once (1-4 CPU seconds for the large ones), not once per worker."""
    return [pytest.param(n, marks=pytest.mark.xdist_group(f"family-{n}")) for n in names]


@pytest.mark.parametrize("name", grouped(NAMES))
def test_generation_prompt_is_the_tables(families, name):
    """The table's G is what the template appends for `add_generation_prompt`."""
    family = families(name)
    assert family.generation_prompt() == family.spec.G


@pytest.mark.parametrize("name", grouped(NAMES))
def test_train_on_last(families, chats, tmp_path, name):
    family = families(name)
    rows, path = chats(name)
    samples = tokenize(family, path, tmp_path / "out", "--train-on", "last")
    check(family, rows, samples, "last")


FLIP = """
import pyarrow as pa
from pathlib import Path
from packer.hashing import file_digest

out = Path(%r)
manifest = json.loads((out / "manifest.json").read_text())
entry = manifest["shards"][0]
path = out / entry["file"]
table = pa.ipc.open_stream(path.read_bytes()).read_all()  # not mapped: rewritten below
labels = table.column("labels").to_pylist()
trained = [j for j, label in enumerate(labels[0]) if label != -100]
labels[0][trained[len(trained) // 2]] = -100  # a trained token no longer trained
column = table.schema.get_field_index("labels")
table = table.set_column(column, table.schema.field(column), pa.array(labels, table.schema.field(column).type))
with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
    writer.write_table(table)
entry["xxh3_128"], entry["bytes"] = file_digest(path), path.stat().st_size  # past the hash check
(out / "manifest.json").write_text(json.dumps(manifest))
"""


def shards(out: Path, pattern: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob(pattern))}


@pytest.mark.parametrize("name", grouped(NAMES))
def test_assistant_two_step_cache_and_verify(families, chats, tmp_path, monkeypatch, name):
    """`--train-on assistant` (the labels checked against the contract), and the paths every
    family must work on unchanged, in one process: `packer tokenize` then `packer pack` of its
    output gives the bytes of `packer pack RAW --tokenizer`; a second such pack reuses the cache
    entry (the same bytes as the tokenize output); `verify --input RAW --tokenizer` re-renders
    the raw chats and passes, and fails on a copy with one trained label flipped."""
    family = families(name)
    rows, path = chats(name)
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    raw = ["--tokenizer", family.dir, "--chat-template", family.family.template_path]
    pack = ["--max-len", "16384", "--workers", "1"]
    check_raw = ["--input", path, *raw, "--no-attention", "--json"]
    one = tmp_path / "one"
    runs = packer_commands(
        [
            ["tokenize", path, *raw, "-o", tmp_path / "tok", "--workers", "1"],
            ["pack", tmp_path / "tok", "-o", tmp_path / "two", *pack],
            ["pack", path, *raw, "-o", one, *pack],
            ["pack", path, *raw, "-o", tmp_path / "again", *pack],
            ["verify", one, *check_raw],
            ["python", f"import shutil; shutil.copytree({str(one)!r}, {str(tmp_path / 'bad')!r})"],
            ["python", FLIP % str(tmp_path / "bad")],
            ["verify", tmp_path / "bad", *check_raw],
            ["inspect", one, "--tokenizer", family.dir, "--json"],
        ]
    )
    assert [run[0] for run in runs] == [0, 0, 0, 0, 0, 1, 0], [run[:2] for run in runs]
    samples = read_samples(tmp_path / "tok")
    check(family, rows, samples, "assistant")
    packed = shards(one, "shard-*")
    assert packed and shards(tmp_path / "two", "shard-*") == packed
    assert "tokenized output reused from the cache" in runs[3][1]
    assert shards(tmp_path / "again", "shard-*") == packed
    [entry] = (tmp_path / "cache" / "tokenized").iterdir()
    assert shards(entry, "part-*") == shards(tmp_path / "tok", "part-*")
    checked = json.loads(runs[4][2])["checks"]["input"]
    assert checked["ok"] and checked["samples"] == len(samples), checked
    failed = json.loads(runs[5][2])["checks"]["input"]
    assert failed["ran"] and not failed["ok"], failed
    check_inspect(family, rows, json.loads(runs[6][2])["row_views"][0])


def check_inspect(family: Family, rows: list[dict], view: dict) -> None:
    """What `packer inspect --tokenizer` shows of a packed row's samples (each a chat under
    --train-on assistant): the sample's tokens decoded run by run, the runs outside « » the
    contract's trained tokens. Where the decoder gives the render back (all vocabularies but
    the SentencePiece ones, which write a space after a special token: Phi-3.5, Mistral's),
    those runs are the contract's trained spans of the render, character for character."""
    decode = family.tokenizer.backend_tokenizer.decode
    shown = 0
    for segment in view["segments"]:
        if segment.get("padding"):
            continue
        row = rows[segment["sample_index"]]
        messages = row["messages"]
        text = family.render(messages, row.get("tools"))
        replies = {i for i, m in enumerate(messages) if m["role"] == "assistant"}
        spans = family.spans(messages, text, replies)
        ids, labels = family.labels(text, spans)
        bounds = [0] + [
            j for j in range(1, len(ids)) if (labels[j] == IGNORE) != (labels[j - 1] == IGNORE)
        ]
        want = [
            (labels[a] == IGNORE, decode(ids[a:b], skip_special_tokens=False))
            for a, b in zip(bounds, [*bounds[1:], len(ids)])
        ]
        runs = [(run["masked"], run["text"]) for run in segment["text"]]
        assert runs == want, (family.name, segment["sample_index"])
        if "".join(t for _, t in runs) == text:
            trained = [t for masked, t in runs if not masked]
            assert trained == [text[a:b] for a, b in merged(spans)], family.name
        shown += 1
    assert shown, view


def merged(spans) -> list[tuple[int, int]]:
    """Character spans, the ones that touch joined (a run of trained tokens has no gap)."""
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


@pytest.mark.parametrize("name", grouped(NAMES))
def test_one_per_sample(families, chats, tmp_path, name):
    family = families(name)
    rows, path = chats(name)
    samples = tokenize(family, path, tmp_path / "out", "--turns", "one-per-sample")
    check(family, rows, samples, "one-per-sample")


# the switches on the families whose full render keeps reasoning, and on one family of each
# tool-call format (each CLI run loads the vocabulary again: ~2 CPU seconds)
KEEPS_REASONING = ["gemma-4", "gpt-oss", "qwen3", "qwen3.5"]
TOOL_FORMATS = ["gpt-oss", "hermes-3", "llama-3.1", "mistral-nemo", "qwen2.5"]


@pytest.mark.parametrize("name", grouped(KEEPS_REASONING))
def test_no_train_reasoning(families, chats, tmp_path, name):
    family = families(name)
    rows, path = chats(name)
    samples = tokenize(family, path, tmp_path / "out", "--no-train-reasoning")
    check(family, rows, samples, "assistant", reasoning=False)


@pytest.mark.parametrize("name", grouped(TOOL_FORMATS))
def test_no_train_tool_calls(families, chats, tmp_path, name):
    family = families(name)
    rows, path = chats(name)
    samples = tokenize(family, path, tmp_path / "out", "--no-train-tool-calls")
    check(family, rows, samples, "assistant", calls=False)


@pytest.mark.xdist_group("family-phi-3.5")
def test_phi_endoftext_never_trained(families, chats, tmp_path):
    """Phi-3.5 appends `<|endoftext|>` once after the whole chat: the last reply's `<|end|>` is
    trained, what follows it is not."""
    family = families("phi-3.5")
    rows, path = chats("phi-3.5")
    samples = tokenize(family, path, tmp_path / "out", "--train-on", "last")
    end, eot = family.tokenizer.convert_tokens_to_ids(["<|end|>", "<|endoftext|>"])
    assert len(samples) == len(rows)
    for ids, labels in samples:
        assert ids[-1] == eot and labels[-1] == IGNORE
        last_end = len(ids) - 1 - ids[::-1].index(end)
        assert labels[last_end] == end
        assert all(label == IGNORE for label in labels[last_end + 1 :])


@pytest.mark.xdist_group("family-qwen3")
@pytest.mark.parametrize("form", ["thinking", "inline"])
def test_reasoning_input_forms(families, chats, tmp_path, form):
    """Reasoning given as `thinking` or inline `<think>…</think>` at the start of the content
    gives the samples that `reasoning_content` gives (Qwen3 keeps the last turns' reasoning)."""
    family = families("qwen3")
    rows, path = chats("qwen3")
    moved = []
    for row in rows:
        messages = []
        for m in row["messages"]:
            m = dict(m)
            if "reasoning_content" in m:
                reasoning = m.pop("reasoning_content")
                if form == "thinking":
                    m["thinking"] = reasoning
                else:
                    m["content"] = f"<think>{reasoning}</think>{m['content']}"
            messages.append(m)
        moved.append({**row, "messages": messages})
    assert moved != rows
    other = tmp_path / "moved.jsonl"
    other.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in moved))
    want = tokenize(family, path, tmp_path / "a")
    assert tokenize(family, other, tmp_path / "b") == want
    check(family, rows, want, "assistant")


# --------------------------------------------------------------------------------------------
# the date a template writes (`strftime_now`): packer's --template-date, never the clock

MOVED_CLOCK = """
import datetime
from transformers.utils import chat_template_utils

class Moved(datetime.datetime):
    year_now = 1999

    @classmethod
    def now(cls, tz=None):
        return datetime.datetime(cls.year_now, 7, 4, 13, 30)

chat_template_utils.datetime = Moved  # what transformers' strftime_now reads
"""


def files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.xdist_group("family-gpt-oss")
def test_template_date_not_the_clock(families, chats, tmp_path, monkeypatch):
    """gpt-oss writes "Current date: ..." into every render: two runs on different days give
    the same bytes (the date is --template-date's, 2025-01-01 unless given); another
    --template-date gives other ids, another cache entry, and the manifest records it. One
    process: its clock moved from 1999 to 2031 between the two runs."""
    family = families("gpt-oss")
    rows, path = chats("gpt-oss")
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    raw = ["--tokenizer", family.dir, "--chat-template", family.family.template_path]
    tokenize = ["tokenize", path, *raw, "--workers", "1", "-o"]
    pack = ["pack", path, *raw, "--max-len", "16384", "--workers", "1"]
    runs = packer_commands(
        [
            [*tokenize, tmp_path / "on-1999"],
            ["python", "Moved.year_now = 2031"],
            [*tokenize, tmp_path / "on-2031"],
            [*pack, "-o", tmp_path / "default"],
            [*pack, "--template-date", "2030-02-03", "-o", tmp_path / "dated"],
            [*pack, "--template-date", "2030-02-30", "-o", tmp_path / "bad"],
        ],
        MOVED_CLOCK,
    )
    assert [run[0] for run in runs] == [0, 0, 0, 0, 2], [run[:2] for run in runs]
    assert files(tmp_path / "on-1999") == files(tmp_path / "on-2031")
    check(family, rows, read_samples(tmp_path / "on-1999"), "assistant")  # on 2025-01-01
    assert "--template-date: '2030-02-30' is not a date" in runs[4][1]
    assert not (tmp_path / "bad").exists()
    assert len(list((tmp_path / "cache" / "tokenized").iterdir())) == 2
    for out, day in [("default", "2025-01-01"), ("dated", "2030-02-03")]:
        manifest = json.loads((tmp_path / out / "manifest.json").read_text())
        assert manifest["tokenized_from"]["encoder"]["template_date"] == day
        first = read_shards(tmp_path / out)["input_ids"][0].as_py()
        assert f"Current date: {day}" in family.tokenizer.decode(first)


@pytest.mark.xdist_group("family-r1-distill-llama")
def test_r1_distill_llama_refuses_object_arguments_saying_why(families, tmp_path):
    """R1-Distill-Llama's template joins a call's arguments as text: a chat whose arguments
    are an object is refused in one line naming FILE:LINE and what to give instead; the same
    call with JSON-string arguments is trained (the matrix's chats)."""
    family = families("r1-distill-llama")
    call = {"id": "c1", "type": "function"}
    call["function"] = {"name": "lookup", "arguments": {"query": "zq1"}}
    messages = [
        {"role": "user", "content": "look zq2 up"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "found zq3"},
        {"role": "assistant", "content": "it is zq4"},
    ]
    path = tmp_path / "object.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    args = ["tokenize", path, "--tokenizer", family.dir, "-o", tmp_path / "out"]
    args += ["--chat-template", family.family.template_path, "--workers", "1"]
    [(code, err, *_)] = packer_commands([args])
    assert code == 1
    [line] = err.strip().splitlines()
    assert f"{path}:1" in line and "give each call's `arguments` as a JSON string" in line
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------
# Ray: every family's chats tokenized as Ray tasks give the local run's bytes

RAY_CHATS = 4
# every family would take 195 s on a loaded 2-core machine (each family's vocabulary loaded by
# the driver and again by the Ray worker its batch lands on: 3-20 s each); these are the
# templates that differ most, on the vocabularies that load fastest, plus gpt-oss's:
# Mistral's (no generation prompt: a reply starts after `[/INST]`; the system prompt moved into
# the last user turn; `[TOOL_CALLS]` opens a reply; Small-3.2 writes the date), Phi-3.5's (text
# after the last turn), Granite's (a default system prompt with the date), DeepSeek-V3.1's
# (`<think></think>` in the header, DeepSeek's tool-call tokens) and gpt-oss's (reasoning read
# as `thinking` and kept for the last reply, three end-of-turn tokens, tool results through
# `tojson`, the date). Mistral-Nemo and Small-3.2 share a vocabulary: one load.
RAY_FAMILIES = [
    "mistral-nemo",
    "mistral-small-3.2",
    "phi-3.5",
    "granite-3.3",
    "deepseek-v3.1",
    "gpt-oss",
]
ON_RAY = """
import json, time
from pathlib import Path
from packer.pipelines.tokenize_engine import EngineRunner
from packer.tokenize.encode import Encoder
from packer.tokenize.run import tokenize

runner = EngineRunner("ray", {address!r}, 3)  # one driver for every family's batches
seconds = {{}}
try:
    for name, raw, tokenizer, template, out in {jobs!r}:
        started = time.perf_counter()
        encoder = Encoder(tokenizer, template)
        tokenize(raw, Path(out) / "local", encoder, workers=1)
        tokenize(raw, Path(out) / "ray", encoder, runner=runner)
        seconds[name] = round(time.perf_counter() - started, 2)
finally:
    runner.close()
print(json.dumps(seconds))
"""


@pytest.mark.ray
@pytest.mark.xdist_group("ray")  # the cluster's tests share one test process (conftest)
def test_every_family_on_ray_writes_the_local_bytes(chats, cluster, tmp_path):
    """A few chats of each of RAY_FAMILIES tokenized on the test cluster (one Ray driver, each
    family's batch a task that builds the family's encoder on a Ray worker): the files are
    the local run's, byte for byte."""
    jobs = []
    for name in RAY_FAMILIES:
        if rt.missing(family=rt.FAMILIES[name]):
            continue
        rows, _ = chats(name)
        raw = tmp_path / f"{name}.jsonl"
        raw.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[:RAY_CHATS]))
        family = rt.FAMILIES[name]
        tokenizer = rt.tokenizer_dir(family.vocab)
        jobs.append(
            [name, str(raw), str(tokenizer), str(family.template_path), str(tmp_path / name)]
        )
    if not jobs:
        pytest.skip(f"no family's template and vocabulary are in place: {rt.SETUP}")
    result = python_script(ON_RAY.format(address=cluster, jobs=jobs))
    assert result.returncode == 0, result.stderr[-3000:]
    print("seconds per family:", result.stdout.strip().splitlines()[-1])
    for name, *_, out in jobs:
        local = files(Path(out) / "local")
        assert len(local) == 2 and files(Path(out) / "ray") == local, name  # a shard, the json
