"""Tiny tokenizers for the tests, built in the test and saved with `save_pretrained`: no hub.

`build_tokenizer(path, template)` trains a byte-level BPE on a few hundred generated words (so
that words become multi-byte tokens and merges happen), wraps it in `PreTrainedTokenizerFast`
with ChatML's special tokens (`<|endoftext|>` is EOS, `<|im_end|>` ends a turn) and saves it.
The templates are ChatML variants:

- `TAGGED`: assistant replies (and their `<|im_end|>`) inside `{% generation %}` tags;
- `PLAIN`: the same chats, no tags (masks come from prefix rendering);
- `REASONING`: like Qwen3's, it renders an assistant's `reasoning_content` only for the turns
  after the last user message, so adding turns changes how earlier turns render;
- `TOOLS`: `PLAIN` plus tool calls, tool results and multi-part (list) content.
"""

from __future__ import annotations

import random
from pathlib import Path

EOS = "<|endoftext|>"
# Llama 3's pre-tokenizer regex (tokenizer.json of Llama-3.1): newlines stay together
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOT = "<|im_end|>"
SPECIALS = [EOS, "<|im_start|>", EOT]

_HEADER = "{{- '<|im_start|>' + message['role'] + '\\n' }}"
_PROMPT = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"

TAGGED = (
    "{%- for message in messages %}" + _HEADER + "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- else %}{{- message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}" + _PROMPT
)
PLAIN = (
    "{%- for message in messages %}"
    + _HEADER
    + "{{- message['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    + _PROMPT
)
REASONING = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    + _HEADER
    + "{%- if message['role'] == 'assistant' and message.get('reasoning_content') "
    "and loop.index0 > ns.last_user %}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}{%- endfor %}" + _PROMPT
)
TOOLS = (
    "{%- for message in messages %}"
    + _HEADER
    + "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- elif message['content'] %}{%- for part in message['content'] %}"
    "{{- part['text'] }}{%- endfor %}{%- endif %}"
    "{%- if message.get('tool_calls') %}{%- for call in message['tool_calls'] %}"
    "{{- '<tool_call>' + call['function']['name'] + ' ' "
    "+ (call['function']['arguments'] | tojson) + '</tool_call>' }}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}" + _PROMPT
)
TEMPLATES = {"tagged": TAGGED, "plain": PLAIN, "reasoning": REASONING, "tools": TOOLS}

WORDS = (  # noqa: SIM905 (a word list reads better as one string)
    "the of and to in is you that it he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which "
    "she do how their if will up other about out many then them these so some her would make "
    "like him into time has look two more write go see number no way could people my than "
    "first water been call who oil its now find long down day did get come made may part "
    "café naïve résumé ☕ 🙂 2 + 2 = 4 : ; , . ? ! ( ) { } \" ' tool call weather paris"
).split()


def sentence(rng: random.Random, low: int = 1, high: int = 12) -> str:
    """A few words from WORDS, joined with spaces, sometimes a newline."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    text = " ".join(words)
    if rng.random() < 0.2:
        text += "\n" + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))
    return text


def generated_chat(rng: random.Random, turns: int | None = None) -> list[dict]:
    """A chat with an optional system prompt and 1-4 user/assistant turns."""
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": sentence(rng)})
    for _ in range(turns or rng.randint(1, 4)):
        messages.append({"role": "user", "content": sentence(rng)})
        messages.append({"role": "assistant", "content": sentence(rng)})
    return messages


def build_tokenizer(
    path: Path,
    template: str | None,
    *,
    vocab_size: int = 600,
    specials: list[str] | None = None,
    eos: str = EOS,
    bos: str | None = None,
    split: str | None = None,
) -> Path:
    """Train a byte-level BPE on generated text and save it with `template` to `path`;
    `specials` (ChatML's by default) are its special tokens, `eos` and `bos` among them;
    `split`: a pre-tokenizer regex in place of GPT-2's (Llama 3's keeps "\\n\\n" whole)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split is not None:
        from tokenizers import Regex

        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials or SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rng = random.Random(0)
    corpus = [sentence(rng, 5, 30) for _ in range(400)]
    corpus += [sentence(rng) + "\n\n " + sentence(rng) for _ in range(200)]  # "\n\n": a token
    tok.train_from_iterator(corpus, trainer)
    extra = {"bos_token": bos} if bos else {}
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, pad_token=eos, chat_template=template, **extra
    ).save_pretrained(path)
    return Path(path)
