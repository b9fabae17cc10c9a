"""Row failures in words: a kernel's row code, and the place it names, as one line.

The numba kernels write a code and three integers per row, so they stay small; this module says
what they mean, naming the shard, the row, the sample and what differs. `where` and `sample_of`
place the failures of the provenance and source checks the same way.
"""

from __future__ import annotations

import numpy as np

from packer.verify import kernels as K
from packer.verify.result import Failure


def sample_of(row: dict, k: int) -> tuple[int | None, int | None]:
    """(sample_index, sample_offset) of segment k of the row; (None, None) past the samples."""
    if 0 <= k < len(row["sample_index"]):
        off = int(row["sample_offset"][k]) if k < len(row["sample_offset"]) else None
        return int(row["sample_index"][k]), off
    return None, None


def describe_sample(row: dict, k: int) -> str:
    """'sample 17' / 'sample 17 (piece at token 4096)' / 'the padding segment'."""
    idx, off = sample_of(row, k)
    if idx is None:
        return "the padding segment" if k == len(row["cu_seqlens"]) - 2 else f"segment {k}"
    return f"sample {idx}" + (f" (piece at token {off})" if off else "")


def where(shard: str, r: int, row: dict | None = None, k: int | None = None) -> str:
    text = f"{shard} row {r}"
    if row is not None and k is not None:
        cu = row["cu_seqlens"]
        span = f", tokens {int(cu[k])}..{int(cu[k + 1]) - 1}" if k + 1 < len(cu) else ""
        text += f", {describe_sample(row, k)} (segment {k}{span})"
    return text


def _boundary_message(row: dict, code: int, t: int, k: int, p: int) -> str:
    """Explain a position error by comparing cu_seqlens boundaries with position restarts."""
    cu = [int(x) for x in row["cu_seqlens"]]
    pos = row["position_ids"]
    cu_inner = set(cu[1:-1])
    restarts = {int(x) for x in np.flatnonzero(pos == 0)} - {0}
    missing = sorted(cu_inner - restarts)  # cu boundaries where positions go on
    extra = sorted(restarts - cu_inner)  # restarts with no cu boundary
    s, e = cu[k], cu[k + 1]
    if code == K.POS_RESTART_INSIDE:
        near = [u for u in missing if u in (s, e)]
        if near:
            u = near[0]
            return (
                f"cu_seqlens[{cu.index(u)}] = {u} but position_ids restart at token {t}: the "
                f"boundary is shifted by {u - t:+d}, so tokens of two samples attend to each "
                "other"
            )
        nxt = sample_of(row, k + 1)[0]
        pair = f" (samples {sample_of(row, k)[0]} and {nxt})" if nxt is not None else ""
        return (
            f"position_ids restart at token {t} inside cu_seqlens segment {s}..{e - 1} but "
            f"cu_seqlens has no boundary there: two samples{pair} are merged into one "
            "attention segment"
        )
    if code == K.POS_NO_RESTART:
        near = [x for x in extra if s < x < e]
        if near:
            return (
                f"cu_seqlens[{k}] = {t} but position_ids restart at token {near[0]}: the "
                f"boundary is shifted by {t - near[0]:+d}, so tokens of two samples attend "
                "to each other"
            )
        return (
            f"position_ids do not restart at the start of {describe_sample(row, k)}: token "
            f"{t} has position {p}, expected 0"
        )
    return f"position_ids[{t}] = {p}, expected {t - s} (position {t - s} of its sample)"


def row_message(
    shard: str, r: int, row: dict, code: int, a: int, b: int, c: int, max_len: int, pad_id: int
) -> Failure:
    """The `Failure` for one kernel row code."""
    seg = None
    if code == K.LENGTHS_DIFFER:
        col = {1: "labels", 2: "position_ids", 3: "sample_offset"}[a]
        ref = "sample_index" if a == 3 else "input_ids"
        text = f"{col} has {c} entries but {ref} has {b}"
    elif code == K.EMPTY_ROW:
        text = "the row is empty"
    elif code == K.OVER_MAX_LEN:
        text = f"the row holds {a} tokens, more than max_len {max_len}"
    elif code == K.PAD_LENGTH:
        text = f"the output is padded but the row holds {a} tokens, not max_len {max_len}"
    elif code == K.CU_START:
        text = f"cu_seqlens must start at 0 and have at least 2 entries, got first entry {a} of {b}"
    elif code == K.CU_NOT_INCREASING:
        text = (
            f"cu_seqlens is not strictly increasing: entry {a} is {c} after {b} "
            "(an empty or backwards segment)"
        )
    elif code == K.CU_END:
        text = f"cu_seqlens ends at {a} but the row holds {b} tokens"
    elif code == K.SEGMENT_COUNT:
        text = (
            f"cu_seqlens has {a} segments but sample_index lists {b} samples "
            "(padding, when stored, is one extra final segment)"
        )
    elif code in (K.POS_NO_RESTART, K.POS_RESTART_INSIDE, K.POS_WRONG):
        seg = b
        text = _boundary_message(row, code, a, b, c)
    elif code == K.FIRST_LABEL:
        seg = b
        prev = f"the last token of {describe_sample(row, b - 1)}" if b > 0 else "nothing"
        text = (
            f"the first label is {c}, expected -100: after the model's shift {prev} would be "
            f"trained to predict token {a} of another sample"
            if b > 0
            else f"the first label is {c}, expected -100 (the first token of a sample is never "
            "a target)"
        )
    elif code == K.PAD_LABEL:
        seg = b
        text = f"padding token {a} has label {c}, expected -100"
    elif code == K.PAD_TOKEN:
        seg = b
        text = f"padding token {a} is {c}, expected the pad id {pad_id}"
    elif code == K.LOSS_COUNT:
        text = f"num_loss_tokens is {a} but {b} labels are not -100"
    elif code == K.BAD_LABEL:
        seg = b
        text = f"label at token {a} is {c}: negative and not -100"
    elif code == K.BAD_TOKEN:
        seg = b
        text = f"token {a} has the negative id {c}"
    else:  # pragma: no cover - every kernel code is handled above
        text = f"structure check code {code} ({a}, {b}, {c})"
    idx, off = sample_of(row, seg) if seg is not None else (None, None)
    return Failure(
        f"{where(shard, r, row, seg)}: {text}",
        shard=shard,
        row=r,
        sample=idx,
        sample_offset=off,
        segment=seg,
    )
