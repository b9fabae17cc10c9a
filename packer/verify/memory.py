"""What verify's attention work holds in memory, and how it stays within `--memory-budget`.

Dense attention over a row of n tokens holds heads x n x n scores: 16 GiB in fp32 at 4 heads and
32k tokens, before softmax copies them. The CPU attention therefore runs in query blocks whose
scores fit a share of the budget (`block_queries`); a row that fits runs in one call, as before.
What blocks cannot cut (the row's q/k/v and outputs with one smallest block, the tiny model's
T x T mask for `--model-check`, FlexAttention's dense scores on the CPU) is estimated before
any work (`verify_needs`), and a budget below it is refused in one line. Pure functions of
sizes: no torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from packer.errors import UsageError, option

ATTENTION_HEADS = 4  # the attention checks' q/k/v heads (`attention.HEADS`)

# Per (head, query, key) of one fp32 SDPA call on the CPU: the scores, their softmax and the
# mask's share, measured as peak RSS over torch's base at 8k tokens (about 2.4 x 4 bytes).
SCORE_BYTES = 12
# Per token of a row under the attention check: q, k, v and their gather from the table
# (6 x 1 KiB at 4 heads x 64 dims in fp32), the packed and plain causal outputs and their fp32
# copies (4 KiB), the row's columns and the cp_attention ring's copies of q/k/v (about 6 KiB).
TOKEN_BYTES = 16 << 10
MIN_QUERIES = 16  # the smallest block: fewer queries per call only cost time
BLOCK_SHARE = 4  # one block takes at most this fraction of the budget...
MAX_BLOCK_BYTES = 512 << 20  # ...and at most this: larger blocks run no faster
# --model-check: per token pair, the tiny model's mask (one bool T x T mask at a time, and the
# float copy SDPA makes of it); its SDPA runs torch's fused kernel, which holds no scores.
MASK_BYTES = 8
# Its logits are taken a block of tokens at a time: per token of a block, the fp32 logits of the
# packed, alone and plain causal runs and their differences and log-softmax (6 x vocab x 4).
LOGIT_BYTES = 24


def block_queries(queries: int, keys_before: int, heads: int, budget: int) -> int:
    """How many of `queries` consecutive queries one SDPA call takes when the first may see
    `keys_before` earlier keys (and each query the keys up to itself): the most whose scores,
    heads x block x (keys_before + block) x SCORE_BYTES, fit the block's share of `budget`;
    at least MIN_QUERIES, at most `queries`."""
    room = min(budget // BLOCK_SHARE, MAX_BLOCK_BYTES) // (heads * SCORE_BYTES)
    # block x (keys_before + block) <= room
    block = int((math.sqrt(keys_before * keys_before + 4 * room) - keys_before) // 2)
    return max(1, min(queries, max(MIN_QUERIES, block)))


def block_scores(heads: int, budget: int) -> int:
    """The most scores per head one block may hold: its share of `budget` (the CP ring's
    partial attentions, which cut their queries by this count)."""
    return max(1, min(budget // BLOCK_SHARE, MAX_BLOCK_BYTES) // (heads * SCORE_BYTES))


def dense_bytes(tokens: int, heads: int) -> int:
    """The scores of one dense SDPA call over `tokens` tokens (what a call in one block holds)."""
    return heads * tokens * tokens * SCORE_BYTES


def model_check_bytes(tokens: int) -> int:
    """The tiny model's forward over a row (`--model-check`): its T x T mask, what blocks of
    logits cannot cut."""
    return tokens * tokens * MASK_BYTES


def logit_block(vocab: int, budget: int) -> int:
    """Tokens whose logits the model check holds at once: the block's share of `budget`."""
    room = min(budget // BLOCK_SHARE, MAX_BLOCK_BYTES)
    return max(MIN_QUERIES, room // (vocab * LOGIT_BYTES))


@dataclass(frozen=True)
class Need:
    """What the longest row needs, and which part of it (for the refusal's words)."""

    bytes: int
    what: str  # "the attention check", "--model-check", "--backend flex on the CPU"


def verify_needs(
    tokens: int, heads: int, *, dense: bool = False, model_check: bool = False
) -> Need:
    """The least memory verify needs for rows of `tokens` tokens: the row's tensors and one
    smallest block; every score at once when the backend cannot run in blocks (`dense`);
    the tiny model's mask with `model_check` (its logits go in blocks of the budget's share)."""
    base = tokens * TOKEN_BYTES
    if dense:
        need = Need(base + dense_bytes(tokens, heads), "--backend flex on the CPU")
    else:
        need = Need(base + heads * MIN_QUERIES * tokens * SCORE_BYTES, "the attention check")
    if model_check:
        model = Need(base + model_check_bytes(tokens), "--model-check")
        need = max(need, model, key=lambda n: n.bytes)
    return need


def check_budget(tokens: int, backend, model_check: bool, budget: int) -> None:
    """Refuse, before any work, a `budget` below what rows of `tokens` tokens need at least
    (`verify_needs`), in one line that names what needs it and the option that lowers it."""
    dense = backend.name == "flex" and backend.device == "cpu"
    need = verify_needs(tokens, ATTENTION_HEADS, dense=dense, model_check=model_check)
    if need.bytes > budget:
        refuse(need, tokens, budget)


def refuse(need: Need, tokens: int, budget: int) -> None:
    flag = option("memory_budget", "--memory-budget")
    lower = {
        "--model-check": f"leave out {option('model_check', '--model-check')}",
        "--backend flex on the CPU": f"pass {option('backend')} cpu (it runs in blocks)",
    }.get(need.what, f"pass {option('attention=False', '--no-attention')}")
    raise UsageError(
        f"{need.what} needs about {gib(need.bytes)} for rows of {tokens:,} tokens, more than "
        f"{flag} {gib(budget)}: raise {flag}, or {lower}"
    )


def budget_bytes(memory_budget: int | str | None) -> int:
    """`--memory-budget` in bytes; by default pack's: min(8 GiB, half of available memory)."""
    from packer import arguments as A

    if memory_budget is None:
        from packer.read.cache import default_budget

        return default_budget()
    return A.parse_size(memory_budget)


# glibc's mallopt parameter, and the size from which it serves allocations from their own
# mappings: fixed, so that every freed block of scores goes back to the system
M_MMAP_THRESHOLD, MMAP_THRESHOLD = -3, 1 << 20
_returning = False


def return_freed_blocks() -> None:
    """Have glibc's malloc give freed blocks of MMAP_THRESHOLD bytes or more back to the system.

    By default glibc raises its mmap threshold to the size of each large block freed (up to
    32 MiB), after which blocks of scores come from the heap, which keeps and fragments what
    they free: verify's peak then grew with how many differently sized samples a row held, past
    what the blocks' budget allows (0.96-1.12 GB instead of 0.66 GB, see docs/verify.md). Fixing
    the threshold once per process is glibc's own remedy; elsewhere this does nothing."""
    global _returning
    if _returning:
        return
    _returning = True
    import ctypes
    import platform
    import sys

    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def gib(size: int) -> str:
    """A size for a message: '1.5 GiB', or MiB below 1 GiB."""
    if size >= 1 << 30:
        return f"{size / (1 << 30):.1f} GiB"
    return f"{-(-size // (1 << 20))} MiB"
