"""A chat template: render a chat, and what its probe chats show about it.

A `ChatTemplate` renders (through transformers' own renderer, or the same compiled template
called directly) and, once, renders probe chats to learn what the span finder needs: its
generation prompt (`add_generation_prompt`'s text), the special tokens it writes after a reply
(the end-of-turn token), whether it renders list content as text, and whether it has
`{% generation %}` tags. A template that needs `tools` (Hermes, Command-R+ tool use) is probed
with a probe tool. Where each message lands in a render is `spans.py`'s job.
"""

from __future__ import annotations

import json
import re
from contextlib import nullcontext

from packer.errors import EXIT_FAILURE, EXIT_USAGE, PackerError, option
from packer.tokenize.clock import fixed_clock, reads_clock, strftime_now, template_date

TAGS = re.compile(r"\{%-?\s*generation\s*-?%\}")
PROBE = "packer-probe-reply"
PROBE_USER = "packer-probe-question"
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "a probe",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string", "description": "a probe"}},
            "required": ["q"],
        },
    },
}
PROBE_CALL = {
    "id": "call00000",  # 9 letters and digits, as Mistral-Nemo requires
    "type": "function",
    "function": {"name": "probe_tool", "arguments": {"q": PROBE}},
}


class TemplateError(PackerError):
    """A chat template that cannot be used. At construction (a missing file, a syntax error,
    no end-of-turn token) the option is wrong: exit 2. While encoding (a chat whose pieces
    cannot be located), exit 1 and `index` names the chat in its batch (`where`: its
    FILE:LINE)."""

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        usage: bool = False,
        where: str | None = None,
    ):
        super().__init__(message, where=where)
        self.index = index
        self.exit_code = EXIT_USAGE if usage else EXIT_FAILURE


def render_function():
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError as e:  # transformers missing or too old
        raise TemplateError(
            f"chat templates need transformers>=4.51 (pip install 'transformers>=4.51'): {e}",
            usage=True,
        ) from None
    return render_jinja_template


class ChatTemplate:
    """A template's text and what its probes found: `tagged` (has generation tags), `eot`
    (the end-of-turn token's text), `ends` (every special token it writes after a reply or a
    tool call), `prompt` (its generation prompt), `parts` (renders list content as text),
    `needs_tools` (fails on a chat without tools), `date` (what `strftime_now` answers from,
    where the template calls it: `clock.py`)."""

    def __init__(
        self, text: str, variables: dict, special_tokens: list[str], source: str, date=None
    ):
        self.text = text
        day = template_date(date)  # a bad date is refused whatever the template
        self.date = day if reads_clock(text) else None
        self.variables = variables  # bos_token, eos_token, ...: as apply_chat_template passes them
        self.source = source  # for messages: "the tokenizer's chat template" or the file
        self.specials = [t for t in special_tokens if t]
        self.tagged = bool(TAGS.search(text))
        self.method = "generation-tags" if self.tagged else "full-render"
        self._render = render_function()
        self.needs_tools = False
        self.null_content = False  # until `calls_need_null_content` is probed
        self.eot = self.end_of_turn()
        self.tool_calls = "tool_calls" in text
        self.null_content = self.calls_need_null_content()
        self.ends = self.end_tokens()
        self.prompt = self.generation_prompt()
        self.openers = self.call_openers()
        self.parts = self.renders_parts()
        self.compiled = direct_template(text, self.render, self.variables, self.tagged, self.date)

    def render(self, messages, tools=None, prompt: bool = False) -> tuple[str, list]:
        """The chat's text, and the generation spans (character offsets) when tagged."""
        with self.clock():
            rendered, spans = self._render(
                [list(messages)],
                tools=list(tools) if tools else None,
                chat_template=self.text,
                return_assistant_tokens_mask=self.tagged,
                add_generation_prompt=prompt,
                **self.variables,
            )
        return rendered[0], spans[0] if spans else []

    def clock(self):
        """transformers' renderer with `strftime_now` answered from `date`."""
        if self.date is None:
            return nullcontext()
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return fixed_clock(_compile_jinja_template(self.text).environment, self.date)

    def render_direct(self, messages, tools=None, prompt: bool = False) -> tuple[str, list]:
        """`render` by the compiled template called directly, on messages that `plain_chat`
        prepared once (a chat is rendered twice: whole, and with sentinels)."""
        if self.compiled is None:
            return self.render(messages, tools, prompt)
        return self.compiled(messages, tools, prompt, self.variables, self.tagged)

    def render_text(self, messages, tools=None) -> str:
        """The chat's text alone (the sentinel render of the span finder)."""
        if self.compiled is None:
            return self.render(messages, tools)[0]
        return self.compiled(messages, tools, False, self.variables, False)[0]

    def probe(self, chat, prompt: bool = False) -> str:
        """A probe chat's render, with the probe tool where the template needs tools."""
        chat = self.nulled(chat)
        return self.render(chat, [PROBE_TOOL] if self.needs_tools else None, prompt)[0]

    def calls_need_null_content(self) -> bool:
        """Whether the template writes a reply's tool calls only where its content is null
        (R1-Distill-Llama's tests `content is none`): such replies are handed to it so."""
        if not self.tool_calls:
            return False
        user = {"role": "user", "content": PROBE_USER}
        for arguments in (PROBE_CALL["function"]["arguments"], json.dumps({"q": PROBE})):
            call = dict(PROBE_CALL, function={"name": "probe_tool", "arguments": arguments})
            renders = []
            try:
                for content in ("", None):
                    reply = {"role": "assistant", "content": content, "tool_calls": [call]}
                    text = self.probe(plain_chat([user, reply]))
                    renders.append(text[text.find(PROBE_USER) :])
            except Exception:  # dict arguments that it concatenates as strings
                continue
            return "probe_tool" not in renders[0] and "probe_tool" in renders[1]
        return False

    def nulled(self, messages) -> list[dict]:
        """A reply of tool calls only with a null content, where the template needs it."""
        if not self.null_content:
            return messages
        return [
            dict(m, content=None)
            if m.get("role") == "assistant" and m.get("tool_calls") and m.get("content") == ""
            else m
            for m in messages
        ]

    def end_of_turn(self) -> str:
        """The first special token the template writes after an assistant reply."""
        name = option("chat_template")
        chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}]
        try:
            text = self.probe(chat)
        except Exception as first:  # the template's own error: raise_exception, a jinja error
            self.needs_tools = True
            try:
                text = self.probe(chat)
            except Exception:
                self.needs_tools = False
                raise TemplateError(
                    f"{name}: {self.source} fails on a two-turn chat (the template raises): "
                    f"{one_line(first)}",
                    usage=True,
                ) from None
        after = text.find(PROBE)
        if after < 0:
            raise TemplateError(
                f"{name}: {self.source} does not render the assistant's content", usage=True
            )
        found = self.first_special(text, after + len(PROBE))
        if found is None:
            raise TemplateError(
                f"{name}: {self.source} writes no special token after an assistant reply, so "
                "no end-of-turn token can be trained (a model trained on it would not stop)",
                usage=True,
            )
        return found

    def first_special(self, text: str, after: int) -> str | None:
        hits = [(text.find(t, after), -len(t), t) for t in self.specials if t in text[after:]]
        return min(hits)[2] if hits else None

    def end_tokens(self) -> tuple[str, ...]:
        """The special tokens that end a reply, a tool call, or a last reply (gpt-oss: `<|end|>`,
        `<|call|>`, `<|return|>`)."""
        ends = {self.eot}
        chats = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}]]
        if self.tool_calls:
            call = {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]}
            chats.append([{"role": "user", "content": "hi"}, call])
        for chat in chats:
            for tail in ([], [{"role": "user", "content": "ok"}]):
                try:
                    text = self.probe(plain_chat(chat + tail))
                except Exception:
                    continue
                at = text.rfind(PROBE)
                found = self.first_special(text, at + len(PROBE)) if at >= 0 else None
                if found is not None:
                    ends.add(found)
        return tuple(sorted(ends))

    def call_openers(self) -> tuple[str, ...]:
        """The special tokens a reply of tool calls opens with that a reply of text does not
        (Mistral's `[TOOL_CALLS]`): the model writes them, so they belong to the reply even
        where no header is found before it."""
        if not self.tool_calls:
            return ()
        user = {"role": "user", "content": PROBE_USER}
        reply = {"role": "assistant", "content": PROBE}
        calls = {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]}
        try:
            text = self.probe(plain_chat([user, reply]))
            called = self.probe(plain_chat([user, calls]))
        except Exception:
            return ()
        at, called_at = text.find(PROBE_USER), called.find(PROBE_USER)
        name = called.find("probe_tool", called_at)
        if at < 0 or name < 0:
            return ()
        before = text[at + len(PROBE_USER) : text.find(PROBE, at)]
        opening = called[called_at + len(PROBE_USER) : name]
        return tuple(sorted(t for t in self.specials if t in opening and t not in before))

    def generation_prompt(self) -> str:
        """What `add_generation_prompt=True` appends to a chat that ends with a user message
        (where the template ends a chat without it otherwise, Phi-3.5's `<|endoftext|>`, what
        follows the text both renders share)."""
        chat = [{"role": "user", "content": "hi"}]
        try:
            with_prompt, without = self.probe(chat, prompt=True), self.probe(chat)
        except Exception:
            return ""
        n = 0
        for a, b in zip(with_prompt, without):
            if a != b:
                break
            n += 1
        for token in self.specials:  # not from inside a special token (`<|` of two tokens)
            at = with_prompt.rfind(token, 0, n + len(token) - 1)
            if at >= 0 and at < n < at + len(token):
                n = at
        return with_prompt[n:]

    def renders_parts(self) -> bool:
        """Whether list content (`[{"type": "text", "text": ...}]`) renders as its text; if not,
        the parts are joined into one string before rendering."""
        chat = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": PROBE}]},
        ]
        try:
            text = self.probe(chat)
        except Exception:
            return False
        return PROBE in text and "'type'" not in text and '"type"' not in text

    def prepare(self, messages) -> list[dict]:
        """The messages as the template is handed them (`plain_chat`), list content joined
        where the template renders strings only."""
        if not self.parts:
            messages = [
                dict(m, content="".join(p["text"] for p in m["content"]))
                if isinstance(m["content"], list)
                else m
                for m in messages
            ]
        return self.nulled(plain_chat(messages))


REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def plain_chat(messages) -> list[dict]:
    """The messages as transformers hands them to a template: plain JSON values (a fresh copy),
    reasoning under each of its names. A reply of tool calls without text has `content` "" (as
    most templates expect; None where the template writes tool calls only then, `nulled`)."""
    chat = []
    for message in messages:
        message = plain(message)
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


def plain(value):
    if type(value) is str:  # most values: no copy to make
        return value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class DirectRender:
    """A compiled template called without jinja's per-call set-up: `Template.render` merges the
    environment's globals (a ChainMap) into a new dict on every call, which cost as much as the
    rendering itself (a chat is rendered once per prefix). The globals are flattened once; the
    context, the rendering and the error handling are jinja's own."""

    def __init__(self, compiled, date: str | None = None):
        self.compiled = compiled
        self.environment = compiled.environment
        self.globals = dict(compiled.globals)
        if date is not None:
            self.globals["strftime_now"] = strftime_now(date)

    def __call__(self, messages, tools, prompt: bool, variables: dict, tagged: bool):
        """(text, generation spans), as `render_jinja_template` renders and tracks them."""
        template, environment = self.compiled, self.environment
        values = dict(self.globals)
        values |= {"messages": messages, "tools": list(tools) if tools else None}
        values |= {"documents": None, "add_generation_prompt": prompt, **variables}
        context = environment.context_class(
            environment, values, template.name, template.blocks, globals=self.globals
        )
        try:
            if not tagged:
                return environment.concat(template.root_render_func(context)), []
            blocks, spans = [], []
            with environment.activate_tracker(blocks, spans):
                for block in template.root_render_func(context):
                    blocks.append(block)
            return "".join(blocks), spans
        except Exception:
            environment.handle_exception()  # jinja's: raises the error, with template lines


def direct_template(text: str, render, variables: dict, tagged: bool, date: str | None = None):
    """transformers' compiled template (its sandboxed environment, filters and generation
    tracker), to call without the per-call copying of `render_jinja_template`; None, and the
    slow path, where this transformers does not offer it or a probe chat renders otherwise."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        compiled = DirectRender(_compile_jinja_template(text), date)
        chat = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a", "reasoning_content": "r"},
            {"role": "user", "content": "v"},
            {"role": "assistant", "content": "b"},
        ]
        for prompt in (False, True):
            direct = compiled(plain_chat(chat), None, prompt, variables, tagged)
            slow = render(chat, None, prompt)
            if direct[0] != slow[0] or list(map(tuple, direct[1])) != list(map(tuple, slow[1])):
                return None
        return compiled
    except Exception:  # an older transformers, or a template that fails on the probe
        return None


def one_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
