"""What each assistant turn of a chat trains, found in the chat's full render and checked.

The contract (docs/tokenize.md says the same to users), the same for every template:

- A chat is rendered ONCE, WHOLE, by its template: that text is what the model sees, and its
  tokenization is the sample's ids.
- A message's *pieces* are its content (each text part), its reasoning (`reasoning_content`,
  where the template keeps it) and its tool calls (each call's name, its arguments' string
  values, or its arguments when they are a JSON string). They are found by rendering the chat a
  second time with a sentinel around each piece: a nonce of ASCII letters and digits that occurs
  nowhere in the render (so `tojson` and the like write it as it is) and a number. The sentinel
  render with the sentinels removed must be the true render character for character; a piece is
  located when both its sentinels occur once, in order. Content cannot fool it: a reply that
  quotes another message, or the template's own text, is still found where the template put it.
  Whitespace around a piece stays outside its sentinels (templates strip it).
- The *generation prompt* G is what `add_generation_prompt=True` appends to a chat ending with a
  user message. An assistant message's *header* is the longest prefix of G (at least G's first
  special token) that the render holds between the previous message's last piece and this
  message's first piece: where G's tail is absent from history (QwQ's and the R1 distills'
  `<think>\\n`), the header is the part the render holds. Where no prefix is held (Mistral's
  empty G, R1's reply after a tool result), the header ends with the last special token before
  the first piece (the previous turn's `[/INST]`) that is not one a tool-call reply opens with
  (Mistral's `[TOOL_CALLS]`, found by probing), or, with none, at the first piece.
- The *end-of-turn token* is the first special token at or after the end of the message's last
  piece. Where none comes before the next message, the turn ends where the next assistant
  message's header begins, where the token that G opens with begins (any message's header:
  Command-R+'s `<|START_OF_TURN_TOKEN|>`, an added token after its tool calls), at the end of
  the render, or (before a message of another role,
  whose header is plain text) after the added token that closes a tool call (Gemma-4's
  `<tool_call|>`, not a control token in its vocabulary; found by probing), or else with its
  last piece.
- Trained, per trained assistant message: every character from the end of its header through
  the end of its end-of-turn token, template text between its pieces included (Qwen3's empty
  think block, gpt-oss's channel markers). Never trained: headers, other roles' messages,
  separators after the end-of-turn token, and what the template adds after the last turn.
  `train_reasoning=False` starts a turn whose reasoning the render holds at its first other
  piece; `train_tool_calls=False` ends a turn with tool calls at its last piece before them
  (a turn of tool calls only trains nothing).
- Generation tags (`{% generation %}`), where a template has them, mark the trained text
  themselves (`tagged_turns`); a block that holds the role header is refused.

Where a template transforms a piece so that it cannot be located, a `SpanError` names the
message; the encoder adds the chat's FILE:LINE.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NONCE = "Qz"  # + letters: the sentinel nonce; another one is taken for a chat that holds it
DIGITS = 5  # a sentinel is NONCE + a number of DIGITS digits: piece k opens 2k, closes 2k+1


class SpanError(Exception):
    """A chat whose pieces cannot be found in its render; `message`: the message's index."""

    def __init__(self, text: str, message: int | None = None):
        super().__init__(text)
        self.message = message


@dataclass(frozen=True)
class Turn:
    """An assistant message's place in the render: `start` (the end of its header) to `end`
    (the end of its end-of-turn token; `closed`: a special token must end it, and is checked
    to), and where
    its optional parts lie: `body`, the start of its first piece that is not reasoning (None if
    its only pieces are reasoning) when the render keeps its reasoning (else None);
    `tools`: where the text before its first tool call ends (the end of its last piece before
    them, or `start`), None without tool calls."""

    message: int
    start: int
    end: int
    closed: bool
    reasoning: bool = False
    body: int | None = None
    tools: int | None = None
    first: int = -1  # where its first piece starts, its last piece ends
    last: int = -1
    shorter: tuple[int, ...] = ()  # where shorter held prefixes of G end (see `spans`)
    eot: int | None = None  # where its end-of-turn token starts (when `closed`)
    text_calls: bool = False  # a piece other than reasoning precedes its tool calls

    def spans(self, reasoning: bool = True, tool_calls: bool = True) -> list[tuple]:
        """(start, end, closed, shorter) of each run of characters to train under the options
        (none, one, or under `tool_calls=False` the text before the calls and the end-of-turn
        token). `shorter`: the starts to try, in order, where a token of the render crosses
        `start` (Qwen3.5's G ends `<think>\\n`, and its render's `<think>\\n\\n` ends in one
        `\\n\\n` token: the header is then the longest prefix of G held that ends where a token
        does, `...<think>`)."""
        start, end, closed, shorter = self.start, self.end, self.closed, self.shorter
        eot = self.eot if self.eot is not None else end
        if not reasoning and self.reasoning:
            start, shorter = (eot if self.body is None else self.body), ()
        if not tool_calls and self.tools is not None:
            cut = max(start, self.tools)
            runs = [(start, cut, False, shorter)]
            if self.text_calls or cut > start:
                runs.append((eot, end, closed, ()))
            return [r for r in runs if r[1] > r[0]]
        return [(start, end, closed, shorter)] if end > start else []


@dataclass
class Piece:
    message: int
    kind: str  # "content" | "reasoning" | "tool"
    start: int = -1
    end: int = -1
    exact: bool = True  # its end is the end of what the template writes for it


class Marker:
    """Builds the sentinel chat: every piece of the chosen messages wrapped in sentinels."""

    def __init__(self, nonce: str):
        self.nonce = nonce
        self.pieces: list[Piece] = []

    def wrap(self, text: str, message: int, kind: str, exact: bool = True) -> str:
        k = 2 * len(self.pieces)
        nonce = self.nonce
        if text[:1].isspace() or text[-1:].isspace():
            core = text.strip()
            if not core:
                return text
            self.pieces.append(Piece(message, kind, exact=exact))
            lead = text[: len(text) - len(text.lstrip())]
            trail = text[len(text.rstrip()) :]
            return f"{lead}{nonce}{k:05d}{core}{nonce}{k + 1:05d}{trail}"
        if not text:
            return text
        self.pieces.append(Piece(message, kind, exact=exact))
        return f"{nonce}{k:05d}{text}{nonce}{k + 1:05d}"

    def message(self, i: int, message: dict) -> dict:
        out = dict(message)
        content = message.get("content")
        if isinstance(content, str):
            out["content"] = self.wrap(content, i, "content")
        elif isinstance(content, list):
            out["content"] = [
                dict(p, text=self.wrap(p["text"], i, "content")) if "text" in p else p
                for p in content
            ]
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str):
            wrapped = self.wrap(reasoning, i, "reasoning")
            for key in ("reasoning_content", "thinking"):
                if key in out:
                    out[key] = wrapped
        if message.get("tool_calls"):
            out["tool_calls"] = [self.call(i, c) for c in message["tool_calls"]]
        return out

    def call(self, i: int, call: dict) -> dict:
        function = call.get("function")
        inner = function if isinstance(function, dict) else call
        inner = dict(inner)
        if isinstance(inner.get("name"), str):
            inner["name"] = self.wrap(inner["name"], i, "tool")
        arguments = inner.get("arguments")
        if isinstance(arguments, str):
            inner["arguments"] = self.wrap(arguments, i, "tool")
        elif isinstance(arguments, dict):
            inner["arguments"] = self.leaves(arguments, i)
        return dict(call, function=inner) if isinstance(function, dict) else inner

    def leaves(self, value, i: int):
        """A tool call's arguments with each string value wrapped (keys left alone: a
        template may sort them). A call whose last value is not a string ends inexactly."""
        if isinstance(value, dict):
            items = list(value.items())
            out = {k: self.leaves(v, i) for k, v in items}
        elif isinstance(value, list):
            out = [self.leaves(v, i) for v in value]
        elif isinstance(value, str) and value.strip():
            return self.wrap(value, i, "tool")
        else:
            return value
        last = self.pieces[-1] if self.pieces else None
        if last is not None and last.message == i and last.kind == "tool":
            last.exact = last.exact and last_leaf_is_string(value)
        return out


def last_leaf_is_string(value) -> bool:
    while isinstance(value, (dict, list)) and value:
        value = list(value.values())[-1] if isinstance(value, dict) else value[-1]
    return isinstance(value, str) and bool(value.strip())


class SpanFinder:
    """The turns of a chat in its render, for one template: `render(messages, tools)` gives the
    text; `prompt` is the template's generation prompt G; `specials` the vocabulary's special
    tokens; `ends` the special tokens the template writes after a reply (for a tool call whose
    arguments' end cannot be marked)."""

    def __init__(self, render, prompt: str, specials, ends=(), openers=(), added=(), closers=()):
        self.render = render
        self.closers = (
            re.compile("|".join(map(re.escape, sorted(closers, key=len, reverse=True))))
            if closers
            else None
        )
        self.prompt = prompt
        tokens = sorted((t for t in specials if t), key=len, reverse=True)
        self.special = re.compile("|".join(map(re.escape, tokens))) if tokens else None
        self.ends = frozenset(ends)
        self.openers = frozenset(openers)
        self.patterns: dict = {}
        self.longest = max(map(len, tokens), default=0)
        first = self.special.search(prompt) if self.special and prompt else None
        # a held prefix of G must hold G's first special token (a lone "<" is no header), and
        # end where G's tokens end: after a special token or a newline (QwQ's
        # `<|im_start|>assistant\n` of `<|im_start|>assistant\n<think>\n`, not the `\n<` that
        # `\n<tool_call>` also holds)
        least = first.end() if first else len(prompt)
        # the special or added token a header opens with (Command-R+'s
        # `<|START_OF_TURN_TOKEN|>`): met after a reply's last piece, the next message begins
        opening = [t for t in {*specials, *added} if t and prompt.startswith(t)]
        self.opener = max(opening, key=len) if opening else None
        ends = {m.end() for m in self.special.finditer(prompt)} if self.special else set()
        ends |= {i + 1 for i, c in enumerate(prompt) if c == "\n"}
        ends |= {prompt.find(t) + len(t) for t in added if t and t in prompt}  # `<think>`
        self.cuts = sorted((k for k in ends | {len(prompt)} if k >= max(least, 1)), reverse=True)
        # where a token crosses the header's end, it may end earlier, but past the role's line
        self.line = prompt.find("\n") + 1 if "\n" in prompt else len(prompt) + 1

    # ------------------------------------------------------------------ locating

    def nonce(self, text: str) -> str:
        nonce, n = NONCE, 0
        while nonce in text:
            n += 1
            nonce = NONCE + "".join(chr(ord("a") + int(d)) for d in str(n)) + "x"
        return nonce

    def pattern(self, nonce: str):
        if nonce not in self.patterns:
            self.patterns[nonce] = re.compile(re.escape(nonce) + rf"(\d{{{DIGITS}}})")
        return self.patterns[nonce]

    def locate(self, messages, tools, text: str, only=None) -> list[Piece] | None:
        """The pieces of `messages` (of those in `only`) in `text`, or None where the sentinel
        render, its sentinels removed, is not `text`."""
        marker = Marker(self.nonce(text))
        chat = [
            marker.message(i, m) if only is None or i in only else m for i, m in enumerate(messages)
        ]
        if not marker.pieces:
            return []
        marked = self.render(chat, tools)
        parts = self.pattern(marker.nonce).split(marked)  # text, number, text, number, ...
        if "".join(parts[::2]) != text:
            return None
        seen: dict[int, list[int]] = {}
        at = 0
        for j in range(1, len(parts), 2):
            at += len(parts[j - 1])
            seen.setdefault(int(parts[j]), []).append(at)
        for k, piece in enumerate(marker.pieces):
            opened, closed = seen.get(2 * k, []), seen.get(2 * k + 1, [])
            if not opened and not closed:
                continue  # not rendered: dropped by the template
            pairs = len(opened) == len(closed) and all(a <= b for a, b in zip(opened, closed))
            # a tool's name may be written again (gpt-oss names the tool of a result after it)
            again = piece.kind == "tool" and pairs
            if not (again or (len(opened) == 1 and pairs)):
                raise SpanError(
                    f"the chat template transforms messages[{piece.message}]'s {piece.kind} "
                    "(it writes it other than whole and once), so it cannot be located in the "
                    "render",
                    piece.message,
                )
            piece.start, piece.end = opened[0], closed[0]
        return marker.pieces

    def pieces(self, messages, tools, text: str) -> tuple[list[Piece], bool]:
        """The located pieces, and whether every message was marked (else only the assistant
        messages: a template that tests the other messages' text, as Qwen3 tests a user
        message for `<tool_response>`, renders them only unmarked)."""
        found = self.locate(messages, tools, text)
        if found is not None:
            return found, True
        replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        found = self.locate(messages, tools, text, set(replies))
        if found is not None:
            return found, False
        for i in replies:
            if self.locate(messages, tools, text, {i}) is None:
                raise SpanError(
                    f"the chat template renders messages[{i}] differently once its text is "
                    "marked (it tests or rewrites the text itself), so its pieces cannot be "
                    "located in the render",
                    i,
                )
        raise SpanError(
            "the chat template renders the assistant messages differently once their text is "
            "marked, so their pieces cannot be located in the render",
            replies[0] if replies else None,
        )

    # ------------------------------------------------------------------ turns

    def turns(self, messages, tools, text: str) -> list[Turn]:
        """One `Turn` per assistant message, in order."""
        pieces, whole = self.pieces(messages, tools, text)
        placed = sorted((p for p in pieces if p.start >= 0), key=lambda p: p.start)
        if whole:
            check_dropped(messages, pieces)
        by_message: dict[int, list[Piece]] = {}
        for piece in placed:
            by_message.setdefault(piece.message, []).append(piece)
        replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        heads = {}
        for i in replies:
            own = by_message.get(i)
            calls = messages[i].get("tool_calls")
            if calls and not any(p.kind == "tool" for p in own or ()):
                raise SpanError(f"the chat template does not render messages[{i}]'s tool calls", i)
            if not own:
                raise SpanError(f"the chat template does not render messages[{i}]", i)
            heads[i] = self.header(text, placed, own)
        turns = []
        for i in replies:
            own = by_message[i]
            at, start, shorter = heads[i]
            end, closed, eot = self.end_of_turn(text, placed, own, heads, i)
            for other in placed:
                if other.message != i and start <= other.start < end:
                    raise SpanError(
                        f"the chat template writes messages[{other.message}] inside "
                        f"messages[{i}]'s reply, so the reply cannot be trained alone",
                        i,
                    )
            turns.append(self.turn(i, own, start, (end, closed, eot), messages[i], shorter))
        return turns

    def turn(self, i: int, own: list[Piece], start, ends, message, shorter) -> Turn:
        end, closed, eot = ends
        kinds = [p.kind for p in own]
        reasoning = "reasoning" in kinds
        body = next((p.start for p in own if p.kind != "reasoning"), None) if reasoning else None
        tools, text_calls = None, False
        if "tool" in kinds:
            first = kinds.index("tool")
            tools = max(own[first - 1].end if first else start, start)
            text_calls = any(k not in ("tool", "reasoning") for k in kinds[:first])
        first, last = own[0].start, max(p.end for p in own)
        return Turn(
            i, start, end, closed, reasoning, body, tools, first, last, shorter, eot, text_calls
        )

    def header(self, text: str, placed: list[Piece], own: list[Piece]) -> tuple:
        """(where the header begins, where it ends, where shorter held prefixes of G end) for
        the message whose pieces are `own`."""
        first = own[0].start
        i = own[0].message
        low = max((p.end for p in placed if p.message != i and p.end <= first), default=0)
        prompt = self.prompt
        for k in self.cuts:
            at = text.rfind(prompt[:k], low, first)
            if at >= 0 and not self.inside_special(text, at + k):
                shorter = tuple(at + c for c in self.cuts if self.line <= c < k)
                return at, at + k, shorter
        if self.special is not None:
            held = [m for m in self.special.finditer(text, low, first)]
            while held and held[-1].group() in self.openers:
                held.pop()  # written by the model: Mistral's [TOOL_CALLS]
            if held:
                return held[-1].start(), held[-1].end(), ()
        return first, first, ()

    def inside_special(self, text: str, at: int) -> bool:
        """Whether `at` falls inside a special token of the render (G's `<｜Assistant｜><`
        held by `<｜Assistant｜><｜tool▁calls▁begin｜>` is not a header)."""
        if self.special is None:
            return False
        for found in self.special.finditer(text, max(0, at - self.longest), at + self.longest):
            if found.start() < at < found.end():
                return True
        return False

    def end_of_turn(self, text, placed, own, heads: dict, i: int) -> tuple:
        """(where the turn ends, whether a special token ends it, where that token starts)."""
        last = max(own, key=lambda p: p.end)
        after = last.end
        later = [p.start for p in placed if p.message != i and p.start >= after]
        headers = [at for m, (at, *_) in heads.items() if m != i and at >= after]
        limit = min([*later, *headers, len(text)])
        opening = text.find(self.opener, after, limit) if self.opener else -1
        if opening >= 0:
            limit = opening  # the next message's header begins there
        if self.special is not None:
            found = None
            for found in self.special.finditer(text, after, limit):
                if last.exact or not self.ends or found.group() in self.ends:
                    return found.end(), True, found.start()
            if found is not None:  # an inexact end and none of the usual end tokens
                first = self.special.search(text, after, limit)
                return first.end(), True, first.start()
        if opening >= 0 or limit == len(text) or limit in headers:
            return limit, False, None
        closer = self.closers.search(text, after, limit) if self.closers else None
        if closer is not None:  # a tool call closed by a token that is not a control token
            return closer.end(), False, None
        return after, False, None


def check_dropped(messages, pieces: list[Piece]) -> None:
    """Every message's content is in the render, but a system prompt's: a template that drops
    a user, tool or assistant message would train on a chat the data does not hold; the
    templates that drop a system prompt do so on purpose (Mistral-Nemo writes it only before
    a chat's last user message, so never in a chat that ends with a reply)."""
    located = {(p.message, p.kind) for p in pieces if p.start >= 0}
    for p in pieces:
        role = messages[p.message]["role"]
        if p.kind == "content" and role != "system" and (p.message, "content") not in located:
            raise SpanError(
                f"the chat template does not render messages[{p.message}]'s content", p.message
            )


def tagged_turns(text: str, spans, replies: list[int]) -> list[Turn]:
    """The turns that a template's `{% generation %}` blocks mark."""
    if len(spans) != len(replies):
        raise SpanError(
            f"the chat template's {{% generation %}} blocks mark {len(spans)} spans in a chat "
            f"with {len(replies)} assistant turns"
        )
    return [Turn(i, int(s), int(e), True) for i, (s, e) in zip(replies, spans)]


def check_inside(tagged: list[Turn], found: list[Turn]) -> None:
    """Each `{% generation %}` block holds its reply: from the end of the reply's header
    through its last piece (a block around the wrong text is caught on the chat)."""
    for tag, turn in zip(tagged, found):
        if tag.start > turn.first or tag.end < turn.last:
            raise SpanError(
                f"the chat template's {{% generation %}} block for messages[{tag.message}] "
                "does not hold its reply",
                tag.message,
            )
