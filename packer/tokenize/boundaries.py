"""Character boundaries of a text → token boundaries of its ids, without offsets.

No engine but `hf` gives offsets or `char_to_token`, so a boundary is found by the prefix
property instead: the text up to character `b`, tokenized alone, must give the first ids of
the whole text; then `b` falls between token k-1 and token k, k being that prefix's length.
Where it does not (a token straddles `b`, or the text before `b` tokenizes otherwise alone
than inside the whole: tokens merge across it), the boundary is None. This is stricter than
"no token's offsets cross `b`" in one way only, and on purpose: it is the condition packer puts
on a prompt (the model is trained on a prompt it sees at inference).

Tokenizing every prefix whole would cost a chat's length once per boundary. Added tokens split
a text before anything else sees it, so the text before a special token tokenizes alone as it
does in the whole, and a prefix that holds a special token is that token's index in the ids
plus the ids of the text from the token on (`text[c:b]`: a role header, a reply), tokenized
alone. The special tokens' indexes are read off the ids, and proven there: the ids must hold
the special tokens' ids in the order the text holds their texts, no more, no fewer (where they
do not, say a single-word added token that does not match inside a word, every prefix is
tokenized whole). The short pieces that repeat (headers, end-of-turn tokens) are tokenized once
per `memo`.
"""

from __future__ import annotations

import re
from bisect import bisect_left

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
    tokens; memo: a dict kept between calls. At most two `encode_batch` calls for the batch."""
    memo = {} if memo is None else memo
    pattern = special_pattern(specials)
    encode(engine, [s for s in specials if s], memo)
    token = {s: lookup(memo, s)[0] for s in specials if s and len(lookup(memo, s)) == 1}
    anchors = [special_anchors(t, i, pattern, token) for t, i in zip(texts, ids)]
    for text, wanted in zip(texts, chars):
        for b in wanted:
            if not 0 <= b <= len(text):
                raise ValueError(f"character boundary {b} is outside the text (0..{len(text)})")
    tails = [
        text[cuts[bisect_left(cuts, b) - 1] : b]
        for text, (cuts, _), wanted in zip(texts, anchors, chars)
        for b in wanted
        if b
    ]
    encode(engine, tails, memo)
    out = []
    for text, text_ids, (cuts, at), wanted in zip(texts, ids, anchors, chars):
        found = []
        for b in wanted:
            if not b:
                found.append(0)
                continue
            n = bisect_left(cuts, b) - 1  # the last anchor before b
            tail, start = lookup(memo, text[cuts[n] : b]), at[n]
            found.append(start + len(tail) if text_ids[start : start + len(tail)] == tail else None)
        out.append(found)
    trim(memo)
    return out


def token_crosses(backend, ids: list[int], text: str, char: int) -> bool:
    """Whether a token of `ids` (the whole `text`'s) crosses character `char`: no run of its
    first tokens decodes to exactly `text[:char]` (`backend`: a `tokenizers.Tokenizer`). Says
    why a boundary is None, on a refused chat only: decoding is no engine's work."""
    wanted, low, high = text[:char], 0, len(ids)
    while low < high:  # the first k whose decoded prefix reaches `char` characters
        mid = (low + high) // 2
        if len(backend.decode(ids[:mid], skip_special_tokens=False)) < len(wanted):
            low = mid + 1
        else:
            high = mid
    return backend.decode(ids[:low], skip_special_tokens=False) != wanted


def special_pattern(specials):
    """Leftmost-longest matches of the special tokens (a pattern matching nothing if none)."""
    tokens = sorted({s for s in specials if s}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens)) if tokens else "(?!)")


def special_anchors(text: str, text_ids: list[int], pattern, token: dict):
    """(characters, token indexes): 0 and every special token's start, where the ids hold the
    special tokens' ids in the text's order; else 0 alone (every prefix tokenized whole)."""
    matches = [(m.start(), m.group()) for m in pattern.finditer(text)]
    if not matches or any(s not in token for _, s in matches):
        return [0], [0]
    # as many special ids as the text has special tokens, and the text's in order among them:
    # then they are the text's (counted and found by C loops: a chat's ids are hundreds)
    if sum(map(set(token.values()).__contains__, text_ids)) != len(matches):
        return [0], [0]
    at, i = [], -1
    try:
        for _, s in matches:
            i = text_ids.index(token[s], i + 1)
            at.append(i)
    except ValueError:
        return [0], [0]
    if matches[0][0] == 0:
        return [m for m, _ in matches], at
    return [0, *(m for m, _ in matches)], [0, *at]


def encode(engine, texts: list[str], memo: dict) -> None:
    """Tokenize the texts the memo lacks, in one call; a long one is kept under ("", text)
    only until `trim`, so the memo stays small."""
    new = list(dict.fromkeys(t for t in texts if t not in memo and ("", t) not in memo))
    if not new:
        return
    for text, text_ids in zip(new, engine.encode_batch(new, add_special_tokens=False)):
        memo[text if len(text) <= MEMO_CHARS else ("", text)] = text_ids


def lookup(memo: dict, text: str) -> list[int]:
    return memo[text] if text in memo else memo[("", text)]


def trim(memo: dict) -> None:
    for key in [k for k in memo if isinstance(k, tuple)]:
        del memo[key]
    if len(memo) > MEMO_ENTRIES:
        memo.clear()
