"""Numba kernels of the structure checks, each with a plain-Python reference it is tested against.

Every kernel walks flat Arrow buffers (offsets + values) and writes one error code per row (or
per provenance entry) plus up to three integers that locate the problem; code 0 means fine.
The Python side turns the codes into messages (see `structure.py`), so the kernels stay small.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from packer.interrupts import preparing

IGNORE = -100

# Row codes (check_rows); a, b, c as noted
OK = 0
LENGTHS_DIFFER = 1  # a: 1 labels / 2 position_ids / 3 sample_offset, b: expected, c: found
EMPTY_ROW = 2
OVER_MAX_LEN = 3  # a: row length
PAD_LENGTH = 4  # a: row length (a padded output must hold rows of exactly max_len)
CU_START = 5  # a: cu_seqlens[0], b: number of entries
CU_NOT_INCREASING = 6  # a: entry j, b: cu[j-1], c: cu[j]
CU_END = 7  # a: last entry, b: row length
SEGMENT_COUNT = 8  # a: cu segments, b: sample_index entries
POS_NO_RESTART = 9  # a: token, b: segment, c: position found
POS_RESTART_INSIDE = 10  # a: token, b: segment
POS_WRONG = 11  # a: token, b: segment, c: position found
FIRST_LABEL = 12  # a: token, b: segment, c: label found
PAD_LABEL = 13  # a: token, b: segment, c: label found
PAD_TOKEN = 14  # a: token, b: segment, c: token found
LOSS_COUNT = 15  # a: stored num_loss_tokens, b: counted
BAD_LABEL = 16  # a: token, b: segment, c: label found
BAD_TOKEN = 17  # a: token, b: segment, c: token found

CU_CODES = (LENGTHS_DIFFER, EMPTY_ROW, CU_START, CU_NOT_INCREASING, CU_END)

# Provenance codes (check_coverage), per entry of the sorted (sample, offset) list
INDEX_RANGE = 30
DUPLICATE = 31
FIRST_PIECE = 32  # the first piece of a sample does not start at offset 0
PIECE_GAP = 33  # a piece does not start where the previous one ended

# Source comparison codes (compare_source); a: segment, b: position in the piece, c: found
SRC_INDEX = 40  # b: sample index
SRC_RANGE = 41  # b: piece end, c: source sample length
SRC_TOKEN = 42
SRC_LABEL = 43


@njit(cache=True)
def check_rows(
    ids_off,
    ids,
    lab_off,
    labels,
    pos_off,
    pos,
    cu_off,
    cu,
    si_off,
    so_off,
    num_loss,
    max_len,
    pad,
    pad_id,
    seg_len,
    code,
    a,
    b,
    c,
):  # pragma: no cover
    """Check every row's shape, cu_seqlens, positions, labels and loss count.

    Fills `seg_len[k]` with the length of sample entry k (or -1 when cu_seqlens is unusable).
    """
    for r in range(ids_off.size - 1):
        code[r] = 0
        a[r] = 0
        b[r] = 0
        c[r] = 0
        t0 = ids_off[r]
        n = ids_off[r + 1] - t0
        s0 = si_off[r]
        ns = si_off[r + 1] - s0
        for k in range(ns):
            seg_len[s0 + k] = -1
        if lab_off[r + 1] - lab_off[r] != n:
            code[r], a[r], b[r], c[r] = LENGTHS_DIFFER, 1, n, lab_off[r + 1] - lab_off[r]
            continue
        if pos_off[r + 1] - pos_off[r] != n:
            code[r], a[r], b[r], c[r] = LENGTHS_DIFFER, 2, n, pos_off[r + 1] - pos_off[r]
            continue
        if so_off[r + 1] - so_off[r] != ns:
            code[r], a[r], b[r], c[r] = LENGTHS_DIFFER, 3, ns, so_off[r + 1] - so_off[r]
            continue
        if n == 0:
            code[r] = EMPTY_ROW
            continue
        c0 = cu_off[r]
        nc = cu_off[r + 1] - c0
        if nc < 2 or cu[c0] != 0:
            code[r], a[r], b[r] = CU_START, cu[c0] if nc > 0 else 0, nc
            continue
        bad = False
        for j in range(1, nc):
            if cu[c0 + j] <= cu[c0 + j - 1]:
                code[r], a[r], b[r], c[r] = CU_NOT_INCREASING, j, cu[c0 + j - 1], cu[c0 + j]
                bad = True
                break
        if bad:
            continue
        if cu[c0 + nc - 1] != n:
            code[r], a[r], b[r] = CU_END, cu[c0 + nc - 1], n
            continue
        nseg = nc - 1
        for k in range(min(ns, nseg)):
            seg_len[s0 + k] = cu[c0 + k + 1] - cu[c0 + k]
        if n > max_len:
            code[r], a[r] = OVER_MAX_LEN, n
            continue
        if pad and n != max_len:
            code[r], a[r] = PAD_LENGTH, n
            continue
        pad_seg = pad and nseg == ns + 1
        l0 = lab_off[r]
        p0 = pos_off[r]
        loss = 0
        for k in range(nseg):
            s = cu[c0 + k]
            e = cu[c0 + k + 1]
            for t in range(s, e):
                p = pos[p0 + t]
                if p != t - s:
                    if t == s:
                        code[r], a[r], b[r], c[r] = POS_NO_RESTART, t, k, p
                    elif p == 0:
                        code[r], a[r], b[r] = POS_RESTART_INSIDE, t, k
                    else:
                        code[r], a[r], b[r], c[r] = POS_WRONG, t, k, p
                    bad = True
                    break
            if bad:
                break
            if labels[l0 + s] != IGNORE:
                code[r], a[r], b[r], c[r] = FIRST_LABEL, s, k, labels[l0 + s]
                bad = True
                break
            is_pad = pad_seg and k == nseg - 1
            for t in range(s, e):
                lab = labels[l0 + t]
                tok = ids[t0 + t]
                if is_pad and lab != IGNORE:
                    code[r], a[r], b[r], c[r] = PAD_LABEL, t, k, lab
                    bad = True
                    break
                if is_pad and tok != pad_id:
                    code[r], a[r], b[r], c[r] = PAD_TOKEN, t, k, tok
                    bad = True
                    break
                if lab != IGNORE:
                    if lab < 0:
                        code[r], a[r], b[r], c[r] = BAD_LABEL, t, k, lab
                        bad = True
                        break
                    loss += 1
                if tok < 0:
                    code[r], a[r], b[r], c[r] = BAD_TOKEN, t, k, tok
                    bad = True
                    break
            if bad:
                break
        if bad:
            continue
        if nseg != ns and not pad_seg:
            code[r], a[r], b[r] = SEGMENT_COUNT, nseg, ns
            continue
        if loss != num_loss[r]:
            code[r], a[r], b[r] = LOSS_COUNT, num_loss[r], loss


def check_rows_reference(rows: list[dict], max_len: int, pad: bool, pad_id: int):
    """Plain-Python twin of `check_rows` over rows given as dicts of lists.

    Returns ([(code, a, b, c)] per row, [segment lengths] per row).
    """
    results, lengths = [], []
    for row in rows:
        ids, labels, pos = row["input_ids"], row["labels"], row["position_ids"]
        cu, ns = row["cu_seqlens"], len(row["sample_index"])
        n = len(ids)
        seg = [-1] * ns
        lengths.append(seg)
        if len(labels) != n:
            results.append((LENGTHS_DIFFER, 1, n, len(labels)))
            continue
        if len(pos) != n:
            results.append((LENGTHS_DIFFER, 2, n, len(pos)))
            continue
        if len(row["sample_offset"]) != ns:
            results.append((LENGTHS_DIFFER, 3, ns, len(row["sample_offset"])))
            continue
        if n == 0:
            results.append((EMPTY_ROW, 0, 0, 0))
            continue
        if len(cu) < 2 or cu[0] != 0:
            results.append((CU_START, cu[0] if cu else 0, len(cu), 0))
            continue
        j = next((j for j in range(1, len(cu)) if cu[j] <= cu[j - 1]), None)
        if j is not None:
            results.append((CU_NOT_INCREASING, j, cu[j - 1], cu[j]))
            continue
        if cu[-1] != n:
            results.append((CU_END, cu[-1], n, 0))
            continue
        segments = list(zip(cu[:-1], cu[1:]))
        for k in range(min(ns, len(segments))):
            seg[k] = segments[k][1] - segments[k][0]
        if n > max_len:
            results.append((OVER_MAX_LEN, n, 0, 0))
            continue
        if pad and n != max_len:
            results.append((PAD_LENGTH, n, 0, 0))
            continue
        pad_seg = pad and len(segments) == ns + 1
        found = _reference_segments(ids, labels, pos, segments, pad_seg, pad_id)
        if isinstance(found, tuple):
            results.append(found)
        elif len(segments) != ns and not pad_seg:
            results.append((SEGMENT_COUNT, len(segments), ns, 0))
        elif found != row["num_loss_tokens"]:
            results.append((LOSS_COUNT, row["num_loss_tokens"], found, 0))
        else:
            results.append((OK, 0, 0, 0))
    return results, lengths


def _reference_segments(ids, labels, pos, segments, pad_seg, pad_id):
    """The first problem inside the segments as a code tuple, else the loss-token count."""
    loss = 0
    for k, (s, e) in enumerate(segments):
        for t in range(s, e):
            if pos[t] != t - s:
                if t == s:
                    return (POS_NO_RESTART, t, k, pos[t])
                return (POS_RESTART_INSIDE, t, k, 0) if pos[t] == 0 else (POS_WRONG, t, k, pos[t])
        if labels[s] != IGNORE:
            return (FIRST_LABEL, s, k, labels[s])
        is_pad = pad_seg and k == len(segments) - 1
        for t in range(s, e):
            if is_pad and labels[t] != IGNORE:
                return (PAD_LABEL, t, k, labels[t])
            if is_pad and ids[t] != pad_id:
                return (PAD_TOKEN, t, k, ids[t])
            if labels[t] != IGNORE:
                if labels[t] < 0:
                    return (BAD_LABEL, t, k, labels[t])
                loss += 1
            if ids[t] < 0:
                return (BAD_TOKEN, t, k, ids[t])
    return loss


@njit(cache=True)
def check_coverage(index, offset, length, num_samples, code):  # pragma: no cover
    """Over (sample, offset) entries sorted by sample then offset, flag each that is out of range,
    a duplicate, a first piece not at offset 0, or a piece not starting where the last ended.

    `length` is -1 where unknown; no gap is reported after an unknown length.
    """
    for i in range(index.size):
        code[i] = 0
        if index[i] < 0 or index[i] >= num_samples:
            code[i] = INDEX_RANGE
        elif i == 0 or index[i] != index[i - 1]:
            if offset[i] != 0:
                code[i] = FIRST_PIECE
        elif offset[i] == offset[i - 1]:
            code[i] = DUPLICATE
        elif length[i - 1] >= 0 and offset[i] != offset[i - 1] + length[i - 1]:
            code[i] = PIECE_GAP


def check_coverage_reference(index, offset, length, num_samples) -> list[int]:
    out = []
    for i in range(len(index)):
        if not 0 <= index[i] < num_samples:
            out.append(INDEX_RANGE)
        elif i == 0 or index[i] != index[i - 1]:
            out.append(FIRST_PIECE if offset[i] != 0 else OK)
        elif offset[i] == offset[i - 1]:
            out.append(DUPLICATE)
        elif length[i - 1] >= 0 and offset[i] != offset[i - 1] + length[i - 1]:
            out.append(PIECE_GAP)
        else:
            out.append(OK)
    return out


@njit(cache=True)
def compare_source(
    ids_off,
    ids,
    lab_off,
    labels,
    cu_off,
    cu,
    si_off,
    sample_index,
    so_off,
    sample_offset,
    skip,
    src_tokens,
    src_labels,
    src_offsets,
    code,
    a,
    b,
    c,
):  # pragma: no cover
    """Compare every sample piece of every row with the source sample it claims to come from.

    Labels must equal the source's except the piece's first, which must be -100 (checked by
    `check_rows`). Rows with `skip[r]` (unusable cu_seqlens) are left alone.
    """
    num_src = src_offsets.size - 1
    for r in range(ids_off.size - 1):
        code[r] = 0
        a[r] = 0
        b[r] = 0
        c[r] = 0
        if skip[r]:
            continue
        t0 = ids_off[r]
        l0 = lab_off[r]
        c0 = cu_off[r]
        nseg = cu_off[r + 1] - c0 - 1
        ns = si_off[r + 1] - si_off[r]
        for k in range(min(ns, nseg)):
            s = cu[c0 + k]
            e = cu[c0 + k + 1]
            idx = sample_index[si_off[r] + k]
            if idx < 0 or idx >= num_src:
                code[r], a[r], b[r] = SRC_INDEX, k, idx
                break
            o = sample_offset[so_off[r] + k]
            src_len = src_offsets[idx + 1] - src_offsets[idx]
            if o < 0 or o + (e - s) > src_len:
                code[r], a[r], b[r], c[r] = SRC_RANGE, k, o + (e - s), src_len
                break
            base = src_offsets[idx] + o
            for j in range(e - s):
                if ids[t0 + s + j] != src_tokens[base + j]:
                    code[r], a[r], b[r], c[r] = SRC_TOKEN, k, j, ids[t0 + s + j]
                    break
                if j > 0 and labels[l0 + s + j] != src_labels[base + j]:
                    code[r], a[r], b[r], c[r] = SRC_LABEL, k, j, labels[l0 + s + j]
                    break
            if code[r] != 0:
                break


def compare_source_reference(rows: list[dict], src: list[tuple[list[int], list[int]]]):
    """Plain-Python twin of `compare_source`: rows as dicts of lists, src as (tokens, labels)."""
    out = []
    for row in rows:
        cu = row["cu_seqlens"]
        found = (OK, 0, 0, 0)
        for k, (idx, o) in enumerate(zip(row["sample_index"], row["sample_offset"])):
            if k + 1 >= len(cu):
                break
            s, e = cu[k], cu[k + 1]
            if not 0 <= idx < len(src):
                found = (SRC_INDEX, k, idx, 0)
                break
            tokens, labels = src[idx]
            if o < 0 or o + (e - s) > len(tokens):
                found = (SRC_RANGE, k, o + (e - s), len(tokens))
                break
            for j in range(e - s):
                if row["input_ids"][s + j] != tokens[o + j]:
                    found = (SRC_TOKEN, k, j, row["input_ids"][s + j])
                    break
                if j > 0 and row["labels"][s + j] != labels[o + j]:
                    found = (SRC_LABEL, k, j, row["labels"][s + j])
                    break
            if found[0]:
                break
        out.append(found)
    return out


def as_int64(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.int64)


def frozen(x: np.ndarray) -> np.ndarray:
    """A read-only view of an array a kernel only reads. Numba compiles (and loads) one version
    of a kernel per writability of each argument: a mapped shard's columns are read-only, an
    empty batch's or a parsed source's are not; as views of one kind they take the version
    `load` loaded."""
    view = x.view()
    view.flags.writeable = False
    return view


@functools.cache  # once per process
def load() -> None:
    """Load every kernel here (from numba's cache, or compile it) with the argument types verify
    passes (what they read `frozen`, what they write writable). verify does it before its checks
    start, where a signal cannot land inside numba's loading: see `packer.interrupts.preparing`.
    Each call here touches no element out of its arrays. Done once per process: the library's
    `verify` calls it again, outside the command's own `preparing` (and its --json)."""
    with preparing():
        i32, i64 = frozen(np.zeros(2, np.int32)), frozen(np.zeros(2, np.int64))
        out = [np.zeros(1, np.int64) for _ in range(5)]  # code, a, b, c; seg_len
        check_rows(*[i32] * 11, 1, False, 0, out[4], *out[:4])  # one empty row
        check_coverage(*[frozen(np.zeros(0, np.int64))] * 3, 0, np.zeros(0, np.int64))
        skip = np.ones(1, bool)  # the row is skipped: nothing is compared
        row = (i32, i32, i32, i32, i32, i32, i32, i64, i32, i32)
        compare_source(*row, skip, i32, i32, i64, *out[:4])
