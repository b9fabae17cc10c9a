"""The CP row checks (`pack --cp-size N`, or `verify --cp-size N` on any output).

A CP shard's rows hold every segment padded at its end to a multiple of 2N: `cu_seqlens_padded`
gives the boundaries in the row (the row kernel checks positions, labels and loss against them)
and `cu_seqlens` the cumulative real lengths. Here: both arrays agree (same entries, real within
padded, less than 2N of padding per sample, the row's own padding segment real-empty), every
padded length and the row a multiple of 2N, and the padding `pad_id` with label -100 and
positions continuing the segment's count. `real_lengths` gives the real length of every sample
entry, what provenance and `--input` compare, and `unpadded` the shard without its CP padding.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from packer.contract.names import IGNORE_INDEX
from packer.contract.shards import ShardArrays
from packer.verify.result import CheckResult, Failure
from packer.verify.row_messages import describe_sample


def _fail(result: CheckResult, shard: ShardArrays, r: int, text: str, k: int | None = None):
    row = shard.row(r)
    seg = ""
    if k is not None and k < len(row["sample_index"]):
        seg = f", {describe_sample(row, k)} (segment {k})"
    elif k is not None:
        seg = f", the row's padding segment {k}"
    result.fail(
        Failure(
            f"{shard.name} row {shard.shard_row(r)}{seg}: {text}",
            shard=shard.name,
            row=shard.shard_row(r),
            segment=k,
        )
    )


def _row_problem(
    shard: ShardArrays, r: int, mult: int, pad_id: int, what: str | None = None
) -> tuple[int | None, str] | None:
    """The first CP problem of row r as (segment or None, text), or None. `what` names the
    multiple (packer.planning.multiple.multiple_text)."""
    what = what or f"2 x cp_size = {mult}"
    row = shard.row(r)
    cup = np.asarray(row["cu_seqlens"], np.int64)
    cur = shard.cu_real[int(shard.cu_real_off[r]) : int(shard.cu_real_off[r + 1])].astype(np.int64)
    n = len(row["sample_index"])
    length = len(row["input_ids"])
    if length % mult:
        return None, f"the row holds {length} tokens, not a multiple of {what}"
    if cur.size != cup.size or cur.size < 2 or cur[0] != 0:
        return None, (
            f"cu_seqlens has {cur.size} entries starting at {cur[0] if cur.size else '-'} but "
            f"cu_seqlens_padded has {cup.size}: they must list the same segments from 0"
        )
    real, padded = np.diff(cur), np.diff(cup)
    for k in range(padded.size):
        p, q = int(padded[k]), int(real[k])
        if p % mult:
            return k, f"padded length {p} is not a multiple of {what}"
        if not 0 <= q <= p:
            return k, f"real length {q} (cu_seqlens) does not fit its padded length {p}"
        if k < n and p - q >= mult:
            return k, (
                f"{p - q} padding tokens after {q} real ones: at least a whole multiple of {what}"
            )
        if k >= n and q:
            return k, f"the row's padding segment has {q} real tokens in cu_seqlens (expected 0)"
        a, b = int(cup[k]) + q, int(cup[k + 1])
        if b > a:
            if (row["input_ids"][a:b] != pad_id).any():
                return k, f"a padding token (row token {a}..{b - 1}) is not pad_id {pad_id}"
            if (row["labels"][a:b] != IGNORE_INDEX).any():
                return k, f"a padding token (row token {a}..{b - 1}) has a label other than -100"
            if (row["position_ids"][a:b] != np.arange(q, p)).any():
                return k, (
                    f"the padding's position_ids (row token {a}..{b - 1}) do not continue the "
                    f"segment's count {q}..{p - 1}"
                )
    return None


def check_cp_rows(
    shard: ShardArrays,
    multiple: int,
    pad_id: int,
    usable: np.ndarray,
    result: CheckResult,
    what: str | None = None,
) -> np.ndarray:
    """Fail each row of a CP shard that breaks the layout, segments padded to `multiple` (2 x
    cp_size, or more under sequence parallelism; `what` names it). Rows not `usable` by the row
    kernel are left to its messages. Return which rows are CP-sound."""
    ok = np.zeros(shard.rows, bool)
    for r in np.flatnonzero(usable):
        r = int(r)
        problem = _row_problem(shard, r, multiple, pad_id, what)
        if problem is None:
            ok[r] = True
        else:
            _fail(result, shard, r, problem[1], problem[0])
    return ok


def real_lengths(shard: ShardArrays, seg_len: np.ndarray, sound: np.ndarray) -> np.ndarray:
    """`seg_len` (the padded length of every sample entry) with the real length in the rows
    that are CP-sound."""
    out = seg_len.copy()
    for r in np.flatnonzero(sound):
        s0, s1 = int(shard.si_off[r]), int(shard.si_off[r + 1])
        c0 = int(shard.cu_real_off[r])
        out[s0:s1] = np.diff(shard.cu_real[c0 : c0 + s1 - s0 + 1])
    return out


def unpadded(shard: ShardArrays) -> ShardArrays:
    """The shard with every CP padding token removed (`cu` the real boundaries), for the
    checks that compare samples with their source. Only for CP-sound shards."""
    keep = np.zeros(shard.ids.size, bool)
    rows_len = np.zeros(shard.rows, np.int64)
    for r in range(shard.rows):
        base = int(shard.ids_off[r])
        c0, c1 = int(shard.cu_off[r]), int(shard.cu_off[r + 1])
        cup = shard.cu[c0:c1].astype(np.int64)
        cur = shard.cu_real[int(shard.cu_real_off[r]) : int(shard.cu_real_off[r + 1])]
        for k in range(cup.size - 1):
            q = int(cur[k + 1] - cur[k])
            keep[base + cup[k] : base + cup[k] + q] = True
        rows_len[r] = int(cur[-1])
    off = np.concatenate([[0], np.cumsum(rows_len)]).astype(shard.ids_off.dtype)
    start = int(shard.ids_off[0])
    sel = keep[start : int(shard.ids_off[-1])] if shard.rows else keep[:0]
    return replace(
        shard,
        ids_off=off,
        ids=shard.ids[start:][: sel.size][sel],
        lab_off=off,
        labels=shard.labels[start:][: sel.size][sel],
        pos_off=off,
        pos=shard.pos[start:][: sel.size][sel],
        cu_off=shard.cu_real_off,
        cu=shard.cu_real,
        cu_real_off=None,
        cu_real=None,
    )


def splittable(shard: ShardArrays, cp_size: int, usable: np.ndarray, result: CheckResult) -> None:
    """`verify --cp-size N` on an output packed without it: can each row be split for CP? Every
    segment's length (and the row's) must be a multiple of 2N; the first that is not, per row,
    is named."""
    mult = 2 * cp_size
    for r in np.flatnonzero(usable):
        r = int(r)
        cu = shard.cu[int(shard.cu_off[r]) : int(shard.cu_off[r + 1])].astype(np.int64)
        bad = np.flatnonzero(np.diff(cu) % mult)
        if bad.size:
            k = int(bad[0])
            _fail(
                result,
                shard,
                r,
                f"length {int(cu[k + 1] - cu[k])} is not a multiple of 2 x cp_size = {mult} "
                f"({bad.size} such segment(s) in the row): pack with --cp-size {cp_size}",
                k,
            )
