"""Tokenizers for the engine tests: the tiny trained ones of `tokenizers_util`, the anthropic
0.38.0 wheel's 65,000-token BPE as shipped (its NFKC normalizer is one fastokens lacks) and the
same vocabulary without its normalizer (which fastokens loads), and generated texts that hit
what encoders get wrong: special tokens against text, whitespace runs, digits, unicode."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

import pytest
from tokenizers_util import SPECIALS, WORDS, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
ANTHROPIC = ROOT / ".whl" / "anthropic-0.38.0-py3-none-any.whl"
ANTHROPIC_SPECIALS = ["<EOT>", "<META>", "<META_START>", "<META_END>", "<SOS>"]
PIECES = [
    *WORDS,
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    " \n ",
    "   ",
    "0",
    "12",
    "3456789",
    "ﬁ",
    "Ａ",
    "e\u0301",
    "👨\u200d👩\u200d👧",
    "日本",
    "שלום",
    "\x00",
    "\u200b",
    "'s",
    "DON'T",
]


def tiny_backend(path: Path, vocab_size: int = 600):
    """A trained byte-level BPE (ChatML specials), as `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    build_tokenizer(path, None, vocab_size=vocab_size)
    return Tokenizer.from_file(str(path / "tokenizer.json"))


def anthropic_json() -> dict:
    if not ANTHROPIC.is_file():
        pytest.skip(f"{ANTHROPIC.name} not downloaded (make setup downloads it)")
    with zipfile.ZipFile(ANTHROPIC) as wheel:
        return json.loads(wheel.read("anthropic/tokenizer.json"))


def backend_from(data: dict):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json.dumps(data))


def anthropic_backend(normalizer: bool = True):
    data = anthropic_json()
    if not normalizer:
        data["normalizer"] = None
    return backend_from(data)


def generated_texts(n: int, seed: int, specials=SPECIALS) -> list[str]:
    """Texts glued from PIECES and special tokens, some shaped like chat renders."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        if rng.random() < 0.5:
            parts = []
            for _ in range(rng.randint(1, 4)):
                role = rng.choice(["user", "assistant", "system"])
                body = "".join(rng.choice(PIECES) + rng.choice(["", " "]) for _ in range(12))
                parts.append(f"{specials[1 % len(specials)]}{role}\n{body}{specials[-1]}\n")
            texts.append("".join(parts))
        else:
            pool = [*PIECES, *specials]
            texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 30))))
    return texts
