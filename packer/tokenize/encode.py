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

`encode_batch` renders every record, then tokenizes the batch in one call of the tokenizer
engine (`engines.py`: `hf`, the reference, or `fastokens` where it is proven to give the same
ids), resolved at the first batch, whose renders are part of the proof; the turns' character
spans become token indexes by the prefix property (`boundaries.py`), the same code for both
engines, which give ids only. The engine never changes the ids or the labels, so it is not
part of the fingerprint. The tokenizer's own padding and truncation are off: a sample holds
every token of its text. One `Encoder` per worker process (`Encoder.from_spec`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from packer.arguments import boolean, choice
from packer.errors import UsageError, option
from packer.tokenize.boundaries import token_boundaries_batch, token_crosses
from packer.tokenize.chat import ChatMasks
from packer.tokenize.checks import check_control, check_weights, control_pattern, special_tokens
from packer.tokenize.engines import ENGINES, HFEngine, Resolved, fallback_line, not_proven
from packer.tokenize.engines import resolve_engine as resolve
from packer.tokenize.loading import (
    TokenizerError,
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
PROOF_TEXTS = 256  # renders and plain texts of a first batch compared (in each worker)
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
        tokenizer_engine: str = "auto",
        template_date: str | None = None,
    ):
        self.tokenizer_engine = choice(tokenizer_engine, "tokenizer_engine", ENGINES)
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
        # the reference, padding and truncation off: special tokens' ids, and the proof's
        self.reference = HFEngine(self.tokenizer.backend_tokenizer)
        self.resolved: Resolved | None = None  # the engine, at the first batch
        self.proven_on_texts = False  # whether a batch's own texts were compared yet
        self.note: str | None = None  # `auto`'s fallback line, until `take_note`
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
        self.memo: dict = {}  # short pieces' ids, kept by `token_boundaries_batch`
        self.fingerprint = self.compute_fingerprint()

    # ------------------------------------------------------------------ identity

    def token_id(self, text: str) -> int:
        (ids,) = self.reference.encode_batch([text], add_special_tokens=False)
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
            "tokenizer_engine": self.worker_engine,
            "fingerprint": self.fingerprint,
        }

    @property
    def engine_name(self) -> str:
        """The engine this encoder tokenizes with (what was asked, until it is resolved)."""
        return self.tokenizer_engine if self.resolved is None else self.resolved.name

    @property
    def worker_engine(self) -> str:
        """What a worker process built from the spec asks for: the driver's resolved engine,
        except that `auto` resolved to fastokens stays `auto`, so that a worker whose first
        batch shows a difference falls back to `hf` as the driver would."""
        if self.resolved is not None and self.resolved.name == "hf":
            return "hf"
        return self.tokenizer_engine

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
            tokenizer_engine=spec.get("tokenizer_engine", "auto"),
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

    # ------------------------------------------------------------------ engine

    def resolve_engine(
        self, texts: list[str] = (), input_bytes: int | None = None, *, plain: list[str] = ()
    ) -> Resolved:
        """The engine, resolved once (`engines.resolve_engine`); a batch's chat renders
        (`texts`) and plain texts are compared between the engines the first time any are
        given, also after the driver resolved it without them: then each as it is tokenized
        (special tokens added to plain texts only). A difference falls back to `hf` under
        `auto` (`note` says so), fails under `fastokens`. input_bytes: `worth_building`'s."""
        texts, plain = list(texts)[:PROOF_TEXTS], list(plain)[:PROOF_TEXTS]
        if self.resolved is None:
            backend, digest = self.tokenizer.backend_tokenizer, self.tokenizer_sha256
            self.resolved = resolve(
                self.tokenizer_engine, backend, tokenizer_sha256=digest,
                extra_texts=texts + plain, input_bytes=input_bytes,
            )  # fmt: skip
            self.proven_on_texts = bool(texts or plain)
            self.note = fallback_line(self.resolved)
        elif (texts or plain) and not self.proven_on_texts:
            self.proven_on_texts = True
            if self.resolved.name != "hf":
                from packer.tokenize.proof import first_difference

                ref, engine = self.reference, self.resolved.engine
                difference = first_difference(ref, engine, texts, "text", specials=(False,))
                difference = difference or first_difference(ref, engine, plain, "text", (True,))
                if difference is not None:
                    if self.tokenizer_engine == "fastokens":
                        raise not_proven(difference)
                    self.resolved = Resolved(self.reference, self.tokenizer_engine, difference)
                    self.note = fallback_line(self.resolved)
        return self.resolved

    def take_note(self) -> str | None:
        """`auto`'s fallback line, once: the driver prints it (not each worker)."""
        note, self.note = self.note, None
        return note

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
        texts, plain, chats = [], [], []  # plain: tokenized with special tokens
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
                    chats.append(trained)
        if self.resolved is None or not self.proven_on_texts:
            self.resolve_engine(texts, plain=plain)
        engine = self.resolved.engine
        plain_ids = iter(engine.encode_batch(plain, add_special_tokens=True) if plain else [])
        chat_ids = engine.encode_batch(texts, add_special_tokens=False) if texts else []
        bounds = iter(self.turn_boundaries(engine, texts, chat_ids, chats))
        chat_samples = iter(zip(chats, chat_ids, texts))
        for i, record in enumerate(records):
            if out[i] is not None:
                continue
            try:
                if record.kind == "text":
                    out[i] = self.text_sample(next(plain_ids))
                elif record.kind == "completion":
                    prompt, whole = next(plain_ids), next(plain_ids)
                    out[i] = self.completion_sample(prompt, whole, i)
                else:
                    samples = [
                        (*next(chat_samples), next(bounds)) for _ in range(many.get(i, 1))
                    ]  # consumed whatever fails
                    made = [self.chat_sample(ids, t, b, i, x) for t, ids, x, b in samples]
                    out[i] = made if i in many else made[0]
            except RawRecordError as e:
                if not skip_errors:
                    raise
                out[i] = e
        return out

    def turn_boundaries(self, engine, texts, chat_ids, chats) -> list[list]:
        """For each render, the token index of each trained turn's start, shorter header ends
        and end, in that order (None where the prefix property fails: `boundaries.py`)."""
        if self.train_on == "all" or not texts:
            return [[] for _ in texts]
        wanted = [
            [c for _, (start, end, _, shorter) in trained for c in (start, *shorter, end)]
            for trained in chats
        ]
        return token_boundaries_batch(engine, texts, chat_ids, wanted, self.specials, self.memo)

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

    def chat_sample(self, listed: list[int], turns, bounds, index: int, text: str = ""):
        """(ids, labels) for the turns' spans. `bounds`: `turn_boundaries` of this render, the
        token index of each turn's start, shorter header ends and end, None where the render up
        to there does not tokenize alone to the ids before it (a token crosses it, or tokens
        merge across it: the model would be trained on a prompt it never sees at inference)."""
        ids = np.array(listed, dtype=np.int32)
        if self.train_on == "all":
            return ids, ids.copy()
        labels = np.full(ids.shape, IGNORE, dtype=np.int32)
        at = 0
        for turn, (start, end, closed, shorter) in turns:
            found = bounds[at : at + len(shorter) + 2]
            at += len(shorter) + 2
            first = found[0]
            if first is None and token_crosses(self.reference.backend, listed, text, start):
                # a token crosses the header's end: the first of the shorter header ends
                # that the render tokenizes at (`spans.Turn.spans`)
                first = next((b for b in found[1:-1] if b is not None), None)
            if first is None:
                raise RawRecordError(
                    self.no_boundary(listed, text, start, turn, "start"), index=index
                )
            stop = found[-1]
            if stop is None:
                raise RawRecordError(self.no_boundary(listed, text, end, turn, "end"), index=index)
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

    def no_boundary(self, listed: list[int], text: str, char: int, turn: int, side: str) -> str:
        """Why the render does not tokenize at `char` as its prefix: a token of the whole render
        crosses it, or (no token does, the ids decoded show) the text before it tokenizes
        otherwise alone. Only on a refused chat: decoding is no engine's work."""
        if token_crosses(self.reference.backend, listed, text, char):
            return (
                f"a token crosses the {side} of assistant turn {turn} (tokenizing the whole chat "
                "merges the reply with the text around it: strip the spaces or newlines at the "
                f"reply's {side})"
            )
        what = "before" if side == "start" else "up to the end of"
        return (
            f"the chat {what} assistant turn {turn} tokenizes differently alone than in "
            "the whole chat (tokens merge across the turn boundary), so the model would "
            "be trained on a prompt it never sees at inference"
        )

    def empty_mask(self, index: int) -> None:
        if not self.allow_empty_mask:
            raise RawRecordError(
                f"no token is trained ({option('allow_empty_mask')} allows such samples)",
                index=index,
            )
