"""A chat record → its render(s) and the character spans to train, under the mask options.

`ChatMasks` joins the template (rendering, `template.py`) and the span finder (`spans.py`, whose
docstring is the contract) with what the options ask: `train_on` (every assistant turn, or the
last), `train_reasoning`, `train_tool_calls`, and `turns` (one sample per chat, or one per
trained assistant turn with the chat up to it rendered whole). It says why a chat is refused:
a piece that cannot be located, something the record lacks, or the template's own exception.
"""

from __future__ import annotations

from packer.tokenize.records import RawRecordError, Record
from packer.tokenize.spans import (
    SpanError,
    SpanFinder,
    Turn,
    check_inside,
    tagged_turns,
)
from packer.tokenize.template import TemplateError, one_line


class ChatMasks:
    """What one template trains of a chat, under `train_on` and the `options`
    (`train_reasoning`, `train_tool_calls`, `turns`)."""

    def __init__(self, template, specials, train_on: str, options: dict, added=()):
        self.template = template
        self.train_on = train_on
        self.train_reasoning = options["train_reasoning"]
        self.train_tool_calls = options["train_tool_calls"]
        self.turns = options["turns"]
        t = template
        closers = call_closers(t, specials, added)
        self.finder = SpanFinder(
            t.render_text, t.prompt, specials, t.ends, t.openers, added, closers
        )
        if t.tagged:
            check_tags(t, self.finder)

    def samples(self, record: Record, index: int) -> list[tuple[str, list]]:
        """(render, trained turns) of each sample the chat gives: one, or under
        `turns="one-per-sample"` one per trained assistant turn (the chat up to it).
        A trained turn: (its number among the chat's assistant turns, (start, end, closed))."""
        messages = self.template.prepare(record.messages)
        if self.turns == "all":
            text, turns = self.chat_turns(messages, record.tools, index)
            return [(text, self.trained_turns(record, turns))]
        replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        wanted = [i for i in replies if i >= record.train_from]
        if self.train_on == "last":
            wanted = wanted[-1:]
        wanted = [i for i in wanted if i not in record.untrained]  # weight 0: never trained
        samples = []
        for i in wanted:
            text, turns = self.chat_turns(messages[: i + 1], record.tools, index)
            n = replies.index(i) + 1
            spans = turns[-1].spans(self.train_reasoning, self.train_tool_calls)
            samples.append((text, [(n, span) for span in spans]))
        return samples

    def chat_turns(self, messages, tools, index: int) -> tuple[str, list[Turn]]:
        """The chat's render and its assistant turns, found in it (`spans.py`)."""
        template = self.template
        try:
            text, tags = template.render_direct(messages, tools)
            if template.tagged:
                replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
                turns = tagged_turns(text, tags, replies)
                check_inside(turns, self.finder.turns(messages, tools, text))
            else:
                turns = self.finder.turns(messages, tools, text)
        except SpanError as e:
            raise RawRecordError(
                f'{e} ({template.source}; what to do: docs/tokenize.md, "When a chat is refused")',
                index=index,
            ) from None
        except (TemplateError, RawRecordError):
            raise
        except Exception as e:  # the template's raise_exception, a jinja error on this chat
            raise RawRecordError(self.render_failure(e, tools), index=index) from None
        return text, turns

    def render_failure(self, error: Exception, tools) -> str:
        """Why the template fails on a chat, in words: what the record lacks, or what the
        template refuses."""
        import jinja2

        reason = one_line(error)
        if self.template.needs_tools and not tools:
            return (
                f"the chat template needs the chat's tools and the record has none ({reason}): "
                "add a `tools` column with the tool definitions"
            )
        if isinstance(error, TypeError) and 'concatenate str (not "dict")' in reason:
            return (  # R1-Distill-Llama's: `... + tool['function']['arguments'] + ...`
                f"the chat template writes tool-call arguments as text and this chat's are an "
                f"object ({reason}): give each call's `arguments` as a JSON string"
            )
        lacks = isinstance(error, (jinja2.UndefinedError, TypeError, KeyError, AttributeError))
        if lacks:
            return (
                f"the chat template's render needs something this chat lacks ({reason}): give "
                "the messages the fields the template reads (docs/tokenize.md)"
            )
        return f"the chat template raises on this chat: {reason}"

    def trained_turns(self, record: Record, turns: list[Turn]) -> list[tuple[int, tuple]]:
        """(turn number, (start, end, closed)) of the assistant turns that `train_on` trains;
        a conversational prompt's turns (before `record.train_from`) are context, never
        trained, nor is a turn of weight 0 (`record.untrained`, left out after `last` picks
        the last turn) or one the options leave nothing of."""
        if self.train_on == "all":
            return []
        numbered = [
            (n, turn) for n, turn in enumerate(turns, 1) if turn.message >= record.train_from
        ]
        if self.train_on == "last":
            numbered = numbered[-1:]
        numbered = [(n, turn) for n, turn in numbered if turn.message not in record.untrained]
        out = []
        for n, turn in numbered:
            out += [(n, span) for span in turn.spans(self.train_reasoning, self.train_tool_calls)]
        return out


def call_closers(template, specials, added) -> tuple[str, ...]:
    """The added tokens that are not control tokens and close a tool call (Gemma-4's
    `<tool_call|>`): where no special token ends a reply of tool calls before the tool's result,
    the reply ends after its closer, which the model writes. Found on a probe chat: the added
    tokens the template writes after the call's arguments but not before them (`<|"|>` quotes
    both sides)."""
    from packer.tokenize.template import PROBE, PROBE_CALL, PROBE_USER, plain_chat

    plain = [t for t in added if t and t not in set(specials)]
    if not template.tool_calls or not plain:
        return ()
    user = {"role": "user", "content": PROBE_USER}
    calls = {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]}
    try:
        text = template.probe(plain_chat([user, calls]))
    except Exception:
        return ()
    name, at = text.find("probe_tool", text.find(PROBE_USER)), text.rfind(PROBE)
    if name < 0 or at < name:
        return ()
    before, after = text[name:at], text[at + len(PROBE) :]
    stop = min((after.find(t) for t in specials if t and t in after), default=len(after))
    return tuple(sorted(t for t in plain if t in after[:stop] and t not in before))


def check_tags(template, finder: SpanFinder) -> None:
    """A template whose `{% generation %}` block holds the role header would train it: refused
    once, on a probe chat."""
    from packer.errors import option
    from packer.tokenize.template import PROBE, PROBE_TOOL

    chat = template.prepare(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}]
    )
    tools = [PROBE_TOOL] if template.needs_tools else None
    text, spans = template.render(chat, tools)
    if not spans:
        return
    start = int(spans[-1][0])
    turn = finder.turns(chat, tools, text)[-1]
    if start < turn.start:
        header = text[start : turn.start]
        raise TemplateError(
            f"{option('chat_template')}: {template.source}'s {{% generation %}} block holds "
            f"the assistant's role header ({header!r}), which would be trained: move "
            "{% generation %} after the header",
            usage=True,
        )
