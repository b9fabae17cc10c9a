"""The probe set on which a tokenizer engine must give the reference's ids, built from the
tokenizer itself: the texts where encoders part ways.

- every added token (special or not): alone, against text and whitespace on either side (where
  lstrip/rstrip/single_word act), twice in a row, next to the following added token, cut short
  by a character, and all of them in one string;
- an even sample of the vocabulary, decoded: each token alone, then runs of them glued
  together (the merges between neighbours);
- unicode the normalizer or the byte fallback handles: combining marks, NFKC-sensitive
  ligatures, full-width and circled forms, emoji ZWJ sequences, flags, skin tones, CJK, RTL
  with its marks, lone control and format characters, private use, the last code point;
- whitespace runs (spaces, tabs, newlines, CRLF, mixed) of length 1..WHITESPACE_RUNS, alone and
  between words, and digit runs of length 1..DIGIT_RUNS (`\\p{N}{1,3}` splits them);
- contractions and case (`(?i:'s|'t|...)`), code and punctuation.

`PROBES_VERSION` is part of the proof's cache key: change it whenever the set changes.
"""

from __future__ import annotations

PROBES_VERSION = 1
WHITESPACE_RUNS = 17
DIGIT_RUNS = 24
VOCABULARY_SAMPLE = 4096  # tokens of the vocabulary decoded into probes (evenly spaced ids)
GLUED = 16  # decoded tokens per glued probe

UNICODE = [
    "e\u0301",
    "cafe\u0301 cafe\u0301s",
    "a\u0308\u0301\u0323",
    "\u0301leading mark",
    "ﬁnance ﬂow ﬀ ﬃ",
    "ＡＢＣ ａｂｃ １２３ ！？",
    "① ② ⑳ ㊿",
    "x² H₂O ½ ¼ ⅞",
    "Ⅻ ⅻ ㍱ ㎏ ℃ ™ №",
    "ｶﾀｶﾅ ﾊﾟ",
    "µ Å Ω K",
    "👨\u200d👩\u200d👧\u200d👦 family",
    "🏳\ufe0f\u200d🌈 🏴\u200d☠\ufe0f",
    "👍🏽 👋🏿",
    "🇫🇷🇯🇵 🇺🇸",
    "🙂🙂🙂",
    "日本語の文章です。",
    "中文测试，标点！",
    "한국어 문장",
    "שלום עולם",
    "مرحبا بالعالم",
    "abc \u200fשלום\u200e def",
    "\u202eevil\u202c",
    "ไทย ภาษา",
    "हिन्दी देवनागरी",
    "Ελληνικά ΣΑΣ ς",
    "Кириллица ЁЖ",
    "İstanbul ıi",
    "straße STRASSE ẞ",
    "𠀀𠀁 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙",
    "\ue000\uf8ff private",
    "\U0010ffff\U000e0001 end",
    "\ufffd replacement",
    "\u00a0nbsp\u00a0\u00a0",
    "\u2028line\u2029para\u0085next",
    "zero\u200bwidth\u200cnon\u200djoiner\u2060word\ufeffbom\u00adsoft",
    "tab\u000bvt\u000cff",
]
CONTROL = [chr(c) for c in [*range(0x20), 0x7F, 0x80, 0x85, 0x9F]]
TEXT = [
    "don't DON'T it's IT'S I'm we'll they'd you've she's 's 't 're 've 'm 'll 'd",
    "Hello World HELLO world hElLo",
    "def f(x):\n    return x ** 2\n\n\nclass A:\n\tpass\n",
    '{"a": [1, 2.5, -3e10], "b": null}',
    "<html><body>&amp; &lt;</body></html>",
    "... !!! ??? --- *** ### ~~~ ``` ''' \"\"\"",
    "— – « » „ “ ” ‘ ’ • … ‰ € £ ¥ $ % ^ & * @ # \\ | /",
    "http://example.com/a?b=c&d=e#f user@example.com",
    "3.14159 1,234,567 1.000,50 0x1F 1e-9 -42 +7",
    "１２３ ١٢٣ ۱۲۳ ¹²³ ½ 〇",
    "a\u3000b",
]
WHITESPACE = [" ", "\t", "\n", "\r\n", "\r", " \n", "\n ", " \t", "\t\n", "\n\n "]


def added_token_probes(tokens: list[str]) -> list[str]:
    probes = []
    for i, token in enumerate(tokens):
        after = tokens[(i + 1) % len(tokens)]
        probes += [
            token,
            "a" + token,
            token + "a",
            " " + token,
            token + " ",
            " " + token + " ",
            "\n" + token + "\n",
            "  " + token + "  x",
            "x " + token + " y",
            "hello" + token + "world",
            token + token,
            token + after,
            token + " " + after,
            token[:-1],
            token[1:] + " " + token[:-1],
        ]
    if tokens:
        probes += ["".join(tokens), " ".join(tokens), "\n".join(tokens) + "\n"]
    return probes


def vocabulary_probes(backend, sample: int = VOCABULARY_SAMPLE) -> list[str]:
    """Decoded tokens of the model's vocabulary, evenly spaced ids: alone, then glued."""
    size = backend.get_vocab_size(with_added_tokens=False)
    step = max(1, size // max(1, sample))
    ids = list(range(0, size, step))[:sample]
    pieces = backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
    glued = ["".join(pieces[i : i + GLUED]) for i in range(0, len(pieces), GLUED)]
    spaced = [" ".join(pieces[i : i + GLUED]) for i in range(0, len(pieces), GLUED)]
    return [p for p in pieces if p] + glued + spaced


def whitespace_probes(runs: int = WHITESPACE_RUNS) -> list[str]:
    probes = []
    for unit in WHITESPACE:
        for n in range(1, runs + 1):
            ws = unit * n
            probes += [ws, "a" + ws + "b", ws + "a", "a" + ws, "a." + ws + "B"]
    return probes


def digit_probes(runs: int = DIGIT_RUNS) -> list[str]:
    probes = []
    for n in range(1, runs + 1):
        digits = "".join(str((i * 7 + 3) % 10) for i in range(n))
        probes += [digits, "a" + digits + "b", " " + digits, digits + " 1"]
    return probes


def probe_texts(backend, sample: int = VOCABULARY_SAMPLE) -> list[str]:
    """The probes for `backend` (a `tokenizers.Tokenizer`), each once."""
    added = backend.get_added_tokens_decoder()
    tokens = [added[i].content for i in sorted(added)]
    probes = [
        *added_token_probes(tokens),
        *vocabulary_probes(backend, sample),
        *UNICODE,
        *(" " + u + " x" for u in UNICODE),
        *CONTROL,
        *("a" + c + "b" for c in CONTROL),
        "".join(CONTROL),
        *TEXT,
        *whitespace_probes(),
        *digit_probes(),
    ]
    return list(dict.fromkeys(p for p in probes if p))
