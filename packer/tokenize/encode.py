"""Records → (input_ids, labels), with the assistant masks checked on every sample.

Labels are aligned with `input_ids`, unshifted (the model shifts them; `packer pack` masks the
first label of every sample), -100 where nothing is trained:

- text: the tokens (with the tokenizer's special tokens) and EOS, all trained;
- completion: the prompt masked; the completion and EOS trained. The prompt's tokens must be a
  prefix of the pair's tokens: otherwise the model would be trained on a tokenization of the
  prompt it never sees at inference;
- chat: the whole render tokenized once; each assistant turn (`train_on="assistant"`), the last
  one (`"last"`) or every token (`"all"`) trained, each turn's characters as `spans.py` finds
  them in the full render (its docstring is the contract). `turns="one-per-sample"`: one sample
  per trained assistant turn, the chat up to it rendered whole, only that turn trained.
  `train_reasoning`, `train_tool_calls`: whether a turn's reasoning and tool calls are trained.

Checks on every chat, never warnings (each a `RawRecordError` with the record's `index`): every
message's pieces are located in the render (`spans.py`); no token crosses the start or end of a
trained span, and the chat before each trained reply tokenizes alone to the ids before it (the
ids are the whole render's, and the prompt is the one the model sees at inference); every
trained turn that ends at a special token ends with it; no sample has an empty mask unless
`allow_empty_mask`. A string holding a special token's text (`<|im_end|>`) is refused: it would
be read as a control token.

`encode_batch` renders every record, then tokenizes the batch in one call of the fast tokenizer;
one `Encoder` per worker process (`Encoder.from_spec`), since one tokenizer shared by threads
stops scaling.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left
from pathlib import Path

import numpy as np

from packer.arguments import boolean, choice
from packer.errors import UsageError, option
from packer.tokenize.chat import ChatMasks
from packer.tokenize.checks import check_control, check_weights, control_pattern, special_tokens
from packer.tokenize.loading import (
    TokenizerError,
    chat_backend,
    load_tokenizer,
    read_template,
    text_digest,
    tokenizer_digest,
    tokenizer_template,
)
from packer.tokenize.records import RawRecordError, Record
from packer.tokenize.template import ChatTemplate, TemplateError

IGNORE = -100
TRAIN_ON = ("assistant", "last", "all")
TURNS = ("all", "one-per-sample")
TAIL_MEMO, TAIL_CHARS = 4096, 256  # prompt tails (at most so long) an encoder keeps the ids of
ENCODING_VERSION = 3  # bump when the same inputs and options would give other ids or labels


class Encoder:
    """Turns `Record`s into ids and labels with one tokenizer and one chat template."""

    def __init__(
        self,
        tokenizer,
        chat_template=None,
        train_on: str = "assistant",
        allow_empty_mask: bool = False,
        *,
        template_text: str | None = None,
        train_reasoning: bool = True,
        train_tool_calls: bool = True,
        turns: str = "all",
        template_date: str | None = None,
    ):
        self.train_on = choice(train_on, "train_on", TRAIN_ON)
        self.allow_empty_mask = boolean(allow_empty_mask, "allow_empty_mask")
        self.train_reasoning = boolean(train_reasoning, "train_reasoning")
        self.train_tool_calls = boolean(train_tool_calls, "train_tool_calls")
        self.turns = choice(turns, "turns", TURNS)
        if self.turns != "all" and self.train_on == "all":
            raise UsageError(
                f"{option('turns')} one-per-sample trains assistant turns: it needs "
                f"{option('train_on')} assistant or last"
            )
        self.source = str(tokenizer)
        self.tokenizer = load_tokenizer(self.source)
        self.tokenizer_sha256 = tokenizer_digest(self.source, self.tokenizer)
        self.chat_template = None if chat_template is None else str(chat_template)
        if template_text is None and chat_template is not None:
            template_text = read_template(chat_template)
        self.template_text = template_text or tokenizer_template(self.tokenizer)
        self.template = None
        if self.template_text is not None:
            where = self.chat_template or f"the chat template of {self.source}"
            self.template = ChatTemplate(
                self.template_text,
                dict(self.tokenizer.special_tokens_map),
                special_tokens(self.tokenizer),
                where,
                template_date,
            )
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.eot_id = None if self.template is None else self.token_id(self.template.eot)
        # a turn may end with another special token than the probe's (gpt-oss ends the last
        # reply with <|return|>, earlier ones with <|end|>): any special token ends a turn
        self.specials = special_tokens(self.tokenizer)
        self.masks = None
        if self.template is not None:
            added = [t.content for t in self.tokenizer.added_tokens_decoder.values()]
            self.masks = ChatMasks(
                self.template, self.specials, self.train_on, self.mask_options, added
            )
        self.special_ids = frozenset(self.tokenizer.convert_tokens_to_ids(self.specials))
        self.control = control_pattern(self.tokenizer)
        self.chat_backend = chat_backend(self.tokenizer)  # without the post-processor
        self.tails: dict[str, list[int]] = {}  # prompt tail -> its ids (`tail_ids`)
        self.fingerprint = self.compute_fingerprint()

    # ------------------------------------------------------------------ identity

    def token_id(self, text: str) -> int:
        ids = self.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            raise TokenizerError(f"{option('tokenizer')}: {text!r} is not one token")
        return ids[0]

    @property
    def spec(self) -> dict:
        """What `from_spec` needs to rebuild this encoder in another process (plain values);
        the template travels as text, so a worker need not see the file."""
        local = Path(self.source).expanduser()
        return {
            "tokenizer": str(local.resolve()) if local.is_dir() else self.source,  # any cwd
            "chat_template": self.chat_template,
            "template_text": self.template_text if self.chat_template else None,
            "train_on": self.train_on,
            "allow_empty_mask": self.allow_empty_mask,
            **self.mask_options,
            "fingerprint": self.fingerprint,
        }

    @property
    def mask_options(self) -> dict:
        """The chat options beside `train_on` (part of the fingerprint and the cache key)."""
        return {
            "train_reasoning": self.train_reasoning,
            "train_tool_calls": self.train_tool_calls,
            "turns": self.turns,
            # where the template writes the date (`clock.py`): what it is answered from
            **(
                {"template_date": self.template.date}
                if self.template and self.template.date
                else {}
            ),
        }

    @classmethod
    def from_spec(cls, spec: dict) -> Encoder:
        encoder = cls(
            spec["tokenizer"],
            spec["chat_template"],
            spec["train_on"],
            spec["allow_empty_mask"],
            template_text=spec["template_text"],
            train_reasoning=spec.get("train_reasoning", True),
            train_tool_calls=spec.get("train_tool_calls", True),
            turns=spec.get("turns", "all"),
            template_date=spec.get("template_date"),
        )
        if encoder.fingerprint != spec["fingerprint"]:
            raise TokenizerError(
                f"{option('tokenizer')}: {spec['tokenizer']} changed since the run started "
                "(its files or the installed tokenizers/transformers differ)"
            )
        return encoder

    def compute_fingerprint(self) -> str:
        import tokenizers
        import transformers

        parts = {
            "encoding": ENCODING_VERSION,
            "tokenizer_sha256": self.tokenizer_sha256,
            "template_sha256": text_digest(self.template_text),
            "train_on": self.train_on,
            "allow_empty_mask": self.allow_empty_mask,
            **self.mask_options,
            "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def describe(self) -> dict:
        """What the manifest records about the tokenization."""
        return {
            "tokenizer": self.source,
            "tokenizer_sha256": self.tokenizer_sha256,
            "chat_template": self.chat_template,
            "chat_template_sha256": text_digest(self.template_text),
            "mask_method": None if self.template is None else self.template.method,
            "end_of_turn": None if self.template is None else self.template.eot,
            "train_on": self.train_on,
            "allow_empty_mask": self.allow_empty_mask,
            **self.mask_options,
            "fingerprint": self.fingerprint,
        }

    # ------------------------------------------------------------------ encoding

    def encode_batch(
        self, records: list[Record], *, skip_errors: bool = False
    ) -> list[tuple[np.ndarray, np.ndarray] | list | RawRecordError]:
        """(input_ids, labels) per record, both int32 (for a chat under
        `turns="one-per-sample"`, a list of them: one per trained turn). A bad record raises
        RawRecordError(index=i); with `skip_errors`, its entry is that error instead and the
        others are encoded, in the same one pass (`--on-error skip`). A refused template always
        raises."""
        out: list = [None] * len(records)
        texts, plain, chats, prompts = [], [], [], []  # plain: tokenized with special tokens
        many = {}  # record -> its number of samples, under one-per-sample
        for i, record in enumerate(records):
            try:
                if record.kind not in ("text", "completion", "chat"):
                    raise RawRecordError(f"unknown record kind {record.kind!r}", index=i)
                check_control(self.control, record, i)
                check_weights(self.train_on, record, i)
                if record.kind == "chat":
                    samples = self.chat_samples(record, i)  # (render, trained spans) each
            except RawRecordError as e:
                if not skip_errors:
                    raise
                out[i] = e
                continue
            if record.kind == "text":
                plain.append(record.text)
            elif record.kind == "completion":
                plain += [record.prompt, record.prompt + record.completion]
            else:
                if self.turns != "all":
                    many[i] = len(samples)
                for text, trained in samples:
                    texts.append(text)
                    turns = [(n, span, self.prompt_tail(text, span[0])) for n, span in trained]
                    chats.append(turns)
                    prompts += [text[tail : span[0]] for _, span, tail in turns]
        plain_ids = iter(self.tokenizer.backend_tokenizer.encode_batch(plain))
        chat_encodings = iter(self.chat_backend.encode_batch(texts, add_special_tokens=False))
        prompt_ids = iter(self.tail_ids(prompts))
        chat_spans, chat_texts = iter(chats), iter(texts)
        for i, record in enumerate(records):
            if out[i] is not None:
                continue
            try:
                if record.kind == "text":
                    out[i] = self.text_sample(next(plain_ids).ids)
                elif record.kind == "completion":
                    prompt, whole = next(plain_ids).ids, next(plain_ids).ids
                    out[i] = self.completion_sample(prompt, whole, i)
                else:
                    samples = []
                    for _ in range(many.get(i, 1)):  # consumed whatever fails
                        turns, encoding = next(chat_spans), next(chat_encodings)
                        alone = [next(prompt_ids) for _ in turns]
                        samples.append((turns, encoding, alone, next(chat_texts)))
                    made = [self.chat_sample(e, t, a, i, x) for t, e, a, x in samples]
                    out[i] = made if i in many else made[0]
            except RawRecordError as e:
                if not skip_errors:
                    raise
                out[i] = e
        return out

    def tail_ids(self, tails: list[str]) -> list[list[int]]:
        """Each prompt tail tokenized alone. A template writes the same few tails over and over
        (ChatML: `<|im_start|>assistant\\n`), so each distinct short one is tokenized once per
        encoder; the check still compares every turn's ids with them."""
        known = self.tails
        if len(known) > TAIL_MEMO:
            known.clear()
        new = list(dict.fromkeys(t for t in tails if t not in known))
        encoded = self.chat_backend.encode_batch(new, add_special_tokens=False)
        ids = {tail: encoding.ids for tail, encoding in zip(new, encoded)}
        # a tail that holds chat text (a template without special tokens between turns) is
        # long and seldom repeats: not kept, so the memo stays small
        known.update((tail, i) for tail, i in ids.items() if len(tail) <= TAIL_CHARS)
        return [known[t] if t in known else ids[t] for t in tails]

    def with_eos(self, ids: list[int]) -> np.ndarray:
        array = np.asarray(ids, dtype=np.int32)
        if array.size and array[-1] == self.eos_id:
            return array
        return np.append(array, np.int32(self.eos_id))

    def text_sample(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        ids = self.with_eos(ids)
        return ids, ids.copy()

    def completion_sample(self, prompt, whole, index: int) -> tuple[np.ndarray, np.ndarray]:
        if prompt and prompt[-1] == self.eos_id:  # a post-processor that appends EOS
            prompt = prompt[:-1]
        if whole[: len(prompt)] != prompt:
            raise RawRecordError(
                "the prompt's tokens are not a prefix of the prompt+completion tokens (a token "
                "crosses from the prompt into the completion: move the space or newline between "
                "them to the start of the completion)",
                index=index,
            )
        ids = self.with_eos(whole)
        labels = ids.copy()
        labels[: len(prompt)] = IGNORE
        if self.train_on != "all" and not (labels != IGNORE).any():
            self.empty_mask(index)
        if self.train_on == "all":
            labels = ids.copy()
        return ids, labels

    def chat_samples(self, record: Record, index: int) -> list[tuple[str, list]]:
        if self.masks is None:
            raise TemplateError(
                f"{self.source} has no chat template: pass one ({option('chat_template')})",
                index=index,
                usage=True,
            )
        return self.masks.samples(record, index)

    def prompt_tail(self, text: str, start: int) -> int:
        """Where the last special token before `start` begins (0 if none). Text between special
        tokens is tokenized piece by piece, so the chat before a reply tokenizes alone as the
        whole chat does exactly when its tail from there does: the check tokenizes the tail."""
        return max([0, *(text.rfind(t, 0, start) for t in self.specials)])

    def chat_sample(self, encoding, turns, alone, index: int, text: str = ""):
        """(ids, labels) for the turns' spans; `alone`: each turn's prompt tail (`prompt_tail`)
        tokenized by itself, which must be the ids before the reply. The checks read the ids as
        the Python list the encoding gives (a slice of it compares without a numpy round trip)."""
        listed = encoding.ids
        ids = np.array(listed, dtype=np.int32)
        if self.train_on == "all":
            return ids, ids.copy()
        labels = np.full(ids.shape, IGNORE, dtype=np.int32)
        for (turn, (start, end, closed, shorter), tail), prompt in zip(turns, alone):
            first, header = self.first_token(encoding, start, shorter, index, turn)
            stop = token_at(encoding, end, index, turn, "end")
            if header is not None:  # a shorter header: its prompt tail tokenized here
                prompt = self.chat_backend.encode(text[tail:header], add_special_tokens=False).ids
            tail = token_at(encoding, tail, index, turn, "prompt")  # a special token starts there
            if listed[tail:first] != prompt:
                raise RawRecordError(
                    f"the chat before assistant turn {turn} tokenizes differently alone than in "
                    "the whole chat (tokens merge across the turn boundary), so the model would "
                    "be trained on a prompt it never sees at inference",
                    index=index,
                )
            if stop <= first:
                raise RawRecordError(f"assistant turn {turn} renders no token", index=index)
            if closed and listed[stop - 1] not in self.special_ids:
                raise RawRecordError(
                    f"assistant turn {turn}'s trained tokens do not end with an end-of-turn "
                    f"token such as {self.template.eot!r} (a template whose generation block "
                    "leaves it out teaches the model never to stop)",
                    index=index,
                )
            labels[first:stop] = ids[first:stop]
        if not turns:  # every turn above trained at least one token
            self.empty_mask(index)
        return ids, labels

    def first_token(self, encoding, start: int, shorter, index: int, turn: int):
        """(the first trained token, None) at `start`, or where a token crosses `start`, at the
        first of the `shorter` header ends that no token crosses: (its token, that end)."""
        try:
            return token_at(encoding, start, index, turn, "start"), None
        except RawRecordError:
            for other in shorter:
                try:
                    first = token_at(encoding, other, index, turn, "start")
                except RawRecordError:
                    continue
                return first, other
            raise

    def empty_mask(self, index: int) -> None:
        if not self.allow_empty_mask:
            raise RawRecordError(
                f"no token is trained ({option('allow_empty_mask')} allows such samples)",
                index=index,
            )


def token_at(encoding, char: int, index: int, turn: int, side: str) -> int:
    """The first token that starts at or after `char`; RawRecordError if a token crosses it.
    Asks the encoding for the token at `char` rather than reading every token's offsets: a
    chat's offsets as Python tuples cost a third of what tokenizing it does."""
    at = encoding.char_to_token(char)
    if at is None:  # no token holds the character: the text's end, or one the normalizer drops
        return bisect_left([start for start, _ in encoding.offsets], char)
    if encoding.token_to_chars(at)[0] < char:
        raise RawRecordError(
            f"a token crosses the {side} of assistant turn {turn} (tokenizing the whole chat "
            "merges the reply with the text around it: strip the spaces or newlines at the "
            f"reply's {side})",
            index=index,
        )
    return at
