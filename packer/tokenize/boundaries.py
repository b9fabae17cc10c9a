"""Character boundaries of a text → token boundaries of its ids, without offsets.

No engine but `hf` gives offsets or `char_to_token`, so a boundary is found by the prefix
property instead: the text up to character `b`, tokenized alone, must give the first ids of
the whole text; then `b` falls between token k-1 and token k, k being that prefix's length.
Where it does not (a token straddles `b`, or the text before `b` tokenizes otherwise alone
than inside the whole: tokens merge across it), the boundary is None. This is stricter than
"no token's offsets cross `b`" in one way only, and on purpose: it is the condition packer puts
on a prompt (the model is trained on a prompt it sees at inference).

Tokenizing every prefix whole would cost a chat's length once per boundary. Added tokens split
a text before anything else sees it, so the start of a special token is a cut: the text before
it tokenizes alone as it does in the whole. The cuts are proven, not assumed: the pieces
between them, tokenized alone, must add up to the whole text's ids (where they do not, say an
added token that strips the whitespace before it, every prefix is tokenized from the text's
start). A boundary then costs the text from the last cut before it: a role header, a reply.
Pieces that repeat (headers, a system prompt) are tokenized once per `memo`.
"""

from __future__ import annotations

import re
from bisect import bisect_right

MEMO_ENTRIES, MEMO_CHARS = 4096, 256  # pieces (at most so long) a memo keeps the ids of


def token_boundaries(engine, text: str, ids: list[int], chars, specials=()) -> list[int | None]:
    """`token_boundaries_batch` for one text."""
    return token_boundaries_batch(engine, [text], [ids], [chars], specials)[0]


def token_boundaries_batch(
    engine, texts: list[str], ids: list[list[int]], chars: list, specials=(), memo=None
) -> list[list[int | None]]:
    """For each text, the token index of each character boundary in `chars[i]` (None where
    the prefix property fails, see the module). `ids[i]`: the whole text's ids from `engine`
    without special tokens added (a chat render's); `specials`: the texts of the special
    tokens (where the cuts are); memo: a dict kept between calls. Two `encode_batch` calls for
    the whole batch."""
    memo = {} if memo is None else memo
    pattern = cut_pattern(specials)
    cuts = [[0, *(m.start() for m in pattern.finditer(t) if m.start())] for t in texts]
    pieces = [[t[a:b] for a, b in zip(c, [*c[1:], len(t)])] for t, c in zip(texts, cuts)]
    encode(engine, [p for ps in pieces for p in ps], memo)
    anchors = []  # per text: (cut chars, their token indexes), proven
    for text_ids, c, ps in zip(ids, cuts, pieces):
        at, joined = [], []
        for piece in ps:
            at.append(len(joined))
            joined += lookup(memo, piece)
        anchors.append((c, at) if joined == text_ids else ([0], [0]))
    tails = []
    for text, (c, _), wanted in zip(texts, anchors, chars):
        tails += [text[c[bisect_right(c, b) - 1] : b] for b in wanted]
    encode(engine, tails, memo)
    out = []
    for text, text_ids, (c, at), wanted in zip(texts, ids, anchors, chars):
        found = []
        for b in wanted:
            if not 0 <= b <= len(text):
                raise ValueError(f"character boundary {b} is outside the text (0..{len(text)})")
            n = bisect_right(c, b) - 1
            tail = lookup(memo, text[c[n] : b])
            start = at[n]
            found.append(start + len(tail) if text_ids[start : start + len(tail)] == tail else None)
        out.append(found)
    trim(memo)
    return out


def cut_pattern(specials):
    """Leftmost-longest matches of the special tokens (a pattern matching nothing if none)."""
    tokens = sorted({s for s in specials if s}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens)) if tokens else "(?!)")


def encode(engine, texts: list[str], memo: dict) -> None:
    """Tokenize the texts the memo lacks, in one call; a long one is kept under ("", text)
    only until `trim`, so the memo stays small."""
    new = list(dict.fromkeys(t for t in texts if t not in memo and ("", t) not in memo))
    for text, text_ids in zip(new, engine.encode_batch(new, add_special_tokens=False)):
        memo[text if len(text) <= MEMO_CHARS else ("", text)] = text_ids


def lookup(memo: dict, text: str) -> list[int]:
    return memo[text] if text in memo else memo[("", text)]


def trim(memo: dict) -> None:
    for key in [k for k in memo if isinstance(k, tuple)]:
        del memo[key]
    if len(memo) > MEMO_ENTRIES:
        memo.clear()
