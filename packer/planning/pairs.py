"""Preference pairs longer than a row: drop them or truncate them, never split them.

A pair (prompt P, chosen C, rejected R) is packed as two segments, P + C and P + R, in one row,
so it needs `2P + C + R` tokens of a row of `max_len` L. `truncate` follows TRL's preference
truncation where it can. A prompt of more than L / 4 tokens keeps its end (TRL 0.x's
`keep_end` with `max_prompt_length` half of each side's share of the row): as much of it as
the whole completions leave room for, and at least L / 4 tokens. Then the completions keep
their start (TRL's `keep_start`): the longer one is cut first, then both to one length (as
TRL's `max_completion_length` caps both sides alike), so each side keeps at least L / 4 - 1
tokens of completion wherever it had them. A shorter prompt is never cut. `drop` leaves the
pair out. Every affected pair is counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from packer.errors import InputError, UsageError, option


@dataclass
class PairLengths:
    """The kept pairs and how much of each part they keep.

    `prompt_cut` tokens are removed from the start of a kept pair's prompt; its completions
    keep their first `chosen` and `rejected` tokens.
    """

    kept: np.ndarray  # int64: positions (into the pairs read) of the pairs packed
    prompt: np.ndarray  # int64 per kept pair: prompt tokens kept
    prompt_cut: np.ndarray  # int64 per kept pair: tokens cut from the prompt's start
    chosen: np.ndarray  # int64 per kept pair
    rejected: np.ndarray  # int64 per kept pair
    dropped: int
    truncated: int
    tokens_removed: int  # of both segments: the prompt counts twice

    @property
    def item_lengths(self) -> np.ndarray:
        """What the planner packs: each pair as one item of both its segments' tokens."""
        return 2 * self.prompt + self.chosen + self.rejected

    @property
    def num_pairs(self) -> int:
        return int(self.kept.size)


def completion_cap(shorter: np.ndarray, longer: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """The largest m with min(shorter, m) + min(longer, m) <= budget (budget >= 2): the longer
    completion is cut first, then both to one length."""
    return np.where(2 * shorter <= budget, budget - shorter, budget // 2)


def resolve_pairs(
    prompt: np.ndarray,
    chosen: np.ndarray,
    rejected: np.ndarray,
    max_len: int,
    policy: str,
    locate: Callable[[int], str] | None = None,
) -> PairLengths:
    """What of each pair is packed in rows of `max_len` tokens under `policy` (error, drop or
    truncate); `locate(i)` names pair i in the error of `policy="error"`."""
    if policy not in ("error", "drop", "truncate"):
        raise UsageError(
            f"{option('overlength')} {policy!r} cannot be used with pairs: a pair is never "
            "split (choose error, drop or truncate)"
        )
    if max_len < 2:
        raise UsageError(f"{option('max_len')} must be at least 2 for pairs, got {max_len}")
    prompt, chosen, rejected = (np.asarray(a, np.int64) for a in (prompt, chosen, rejected))
    total = 2 * prompt + chosen + rejected
    over = total > max_len
    n_over = int(over.sum())
    index = np.arange(prompt.size, dtype=np.int64)
    zero = np.zeros(prompt.size, np.int64)
    if n_over == 0 or policy == "drop":
        keep = ~over
        return PairLengths(
            index[keep],
            prompt[keep],
            zero[keep],
            chosen[keep],
            rejected[keep],
            dropped=n_over,
            truncated=0,
            tokens_removed=int(total[over].sum()),
        )
    if policy == "error":
        first = int(np.flatnonzero(over)[0])
        where = locate or (lambda i: f"pair {i}")
        raise InputError(
            f"{n_over} pair(s) need more than {option('max_len')} {max_len} tokens for both "
            f"segments (2 x prompt + chosen + rejected; longest {int(total.max())}, first at "
            f"{where(first)}); choose what to do with them with {option('overlength')} "
            "drop|truncate (a pair is never split)"
        )
    # truncate: a prompt over a quarter of the row keeps its end, as much of it as the whole
    # completions leave room for, and at least a quarter of the row
    quarter = max_len // 4
    cut_to = np.maximum(quarter, (max_len - chosen - rejected) // 2)
    kept_prompt = np.where(over & (prompt > quarter), np.minimum(prompt, cut_to), prompt)
    budget = max_len - 2 * kept_prompt
    shorter, longer = np.minimum(chosen, rejected), np.maximum(chosen, rejected)
    cap = np.where(over, completion_cap(shorter, longer, budget), longer)
    new_chosen, new_rejected = np.minimum(chosen, cap), np.minimum(rejected, cap)
    new_total = 2 * kept_prompt + new_chosen + new_rejected
    return PairLengths(
        index,
        kept_prompt,
        prompt - kept_prompt,
        new_chosen,
        new_rejected,
        dropped=0,
        truncated=n_over,
        tokens_removed=int((total - new_total).sum()),
    )
