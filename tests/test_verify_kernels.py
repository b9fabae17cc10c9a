"""The numba structure kernels agree with their plain-Python references, clean and corrupted."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.contract.schema import SCHEMA
from packer.contract.shards import arrays_from_table
from packer.verify import kernels as K

MUTATIONS = (
    "none",
    "first_label",
    "shift_cu",
    "drop_cu",
    "pos_continue",
    "pos_bump",
    "loss",
    "drop_sample_index",
    "pad_label",
    "pad_token",
    "neg_label",
    "labels_short",
    "cu_start",
    "cu_end",
    "cu_repeat",
    "too_long",
    "pos_short",
    "offset_short",
    "empty",
    "pad_short",
)


def make_row(
    lengths: list[int], rng: np.random.Generator, max_len: int, pad: bool, pad_id: int
) -> dict:
    ids, labels, pos, cu = [], [], [], [0]
    for n in lengths:
        tok = rng.integers(0, 50, n).tolist()
        lab = [t if rng.random() < 0.7 else -100 for t in tok]
        lab[0] = -100
        ids += tok
        labels += lab
        pos += list(range(n))
        cu.append(cu[-1] + n)
    if pad and cu[-1] < max_len:
        n = max_len - cu[-1]
        ids += [pad_id] * n
        labels += [-100] * n
        pos += list(range(n))
        cu.append(max_len)
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": pos,
        "cu_seqlens": cu,
        "sample_index": rng.integers(0, 1000, len(lengths)).tolist(),
        "sample_offset": [0] * len(lengths),
        "num_loss_tokens": sum(1 for x in labels if x != -100),
    }


def mutate(row: dict, kind: str, rng: np.random.Generator) -> None:
    cu = row["cu_seqlens"]
    n = len(row["input_ids"])
    pick = int(rng.integers(1, len(cu) - 1)) if len(cu) > 2 else None
    if kind == "first_label" and pick:
        row["labels"][cu[pick]] = 3
    elif kind == "shift_cu" and pick and cu[pick] + 1 < cu[pick + 1]:
        cu[pick] += 1
    elif kind == "drop_cu" and pick:
        cu.pop(pick)
    elif kind == "pos_continue" and pick:
        s, e = cu[pick], cu[pick + 1]
        row["position_ids"][s:e] = [p + s for p in range(e - s)]
    elif kind == "pos_bump":
        row["position_ids"][int(rng.integers(0, n))] += 1
    elif kind == "loss":
        row["num_loss_tokens"] += 1
    elif kind == "drop_sample_index" and row["sample_index"]:
        row["sample_index"].pop()
        row["sample_offset"].pop()
    elif kind == "pad_label":
        row["labels"][-1] = 1
    elif kind == "pad_token":
        row["input_ids"][-1] = 999
    elif kind == "neg_label":
        row["labels"][-1] = -5
    elif kind == "labels_short":
        row["labels"].pop()
    elif kind == "cu_start":
        cu[0] = 1
    elif kind == "cu_end":
        cu[-1] += 2
    elif kind == "cu_repeat":
        cu.insert(1, cu[1])
    elif kind == "pos_short":
        row["position_ids"].pop()
    elif kind == "offset_short" and row["sample_offset"]:
        row["sample_offset"].pop()
    elif kind == "empty":
        for col in ("input_ids", "labels", "position_ids"):
            row[col].clear()
        cu[:] = [0]
        row["num_loss_tokens"] = 0
    elif kind == "pad_short" and cu[-1] - cu[-2] > 1:
        for col in ("input_ids", "labels", "position_ids"):
            row[col].pop()
        cu[-1] -= 1
    elif kind == "too_long":
        for col in ("input_ids", "labels"):
            row[col].append(1)
        row["position_ids"].append(row["position_ids"][-1] + 1)
        cu[-1] += 1


def run_kernel(rows: list[dict], max_len: int, pad: bool, pad_id: int):
    sh = arrays_from_table(pa.Table.from_pylist(rows, schema=SCHEMA), "t")
    code, a, b, c = (np.zeros(sh.rows, np.int64) for _ in range(4))
    seg = np.zeros(sh.sample_index.size, np.int64)
    K.check_rows(
        sh.ids_off,
        sh.ids,
        sh.lab_off,
        sh.labels,
        sh.pos_off,
        sh.pos,
        sh.cu_off,
        sh.cu,
        sh.si_off,
        sh.so_off,
        sh.num_loss,
        max_len,
        pad,
        pad_id,
        seg,
        code,
        a,
        b,
        c,
    )
    return list(zip(code.tolist(), a.tolist(), b.tolist(), c.tolist())), seg.tolist()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    pad=st.booleans(),
    kinds=st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=6),
)
def test_check_rows_matches_reference(seed, pad, kinds):
    rng = np.random.default_rng(seed)
    max_len = 40
    rows = []
    for kind in kinds:
        lengths = []
        while sum(lengths) < max_len - 12 and rng.random() < 0.8:
            lengths.append(int(rng.integers(1, 12)))
        row = make_row(lengths or [5], rng, max_len, pad, pad_id=0)
        mutate(row, kind, rng)
        rows.append(row)
    got, seg = run_kernel(rows, max_len, pad, 0)
    want, want_seg = K.check_rows_reference(rows, max_len, pad, 0)
    assert got == [tuple(w) for w in want]
    assert seg == [x for s in want_seg for x in s]
    for kind, (code, *_rest) in zip(kinds, got):
        if kind == "none":
            assert code == K.OK


def test_each_corruption_gets_its_code():
    rng = np.random.default_rng(0)
    expected = {
        "first_label": K.FIRST_LABEL,
        "drop_cu": K.POS_RESTART_INSIDE,
        "pos_continue": K.POS_NO_RESTART,
        "loss": K.LOSS_COUNT,
        "drop_sample_index": K.SEGMENT_COUNT,
        "labels_short": K.LENGTHS_DIFFER,
        "cu_start": K.CU_START,
        "cu_end": K.CU_END,
        "cu_repeat": K.CU_NOT_INCREASING,
        "neg_label": K.BAD_LABEL,
    }
    for kind, code in expected.items():
        row = make_row([6, 7, 8], rng, 64, False, 0)
        mutate(row, kind, rng)
        (got, *_), _ = run_kernel([row], 64, False, 0)
        assert got[0] == code, kind
    row = make_row([6, 7], rng, 20, True, 0)
    mutate(row, "pad_token", rng)
    assert run_kernel([row], 20, True, 0)[0][0][0] == K.PAD_TOKEN
    row = make_row([6, 7], rng, 13, False, 0)
    mutate(row, "too_long", rng)
    assert run_kernel([row], 13, False, 0)[0][0][0] == K.OVER_MAX_LEN


def test_shape_codes_locate_the_problem():
    """The codes that stop a row before its segments, with the numbers messages quote."""
    rng = np.random.default_rng(1)
    cases = {
        ("pos_short", False): (K.LENGTHS_DIFFER, 2, 21, 20),
        ("offset_short", False): (K.LENGTHS_DIFFER, 3, 3, 2),
        ("labels_short", False): (K.LENGTHS_DIFFER, 1, 21, 20),
        ("empty", False): (K.EMPTY_ROW, 0, 0, 0),
        ("pad_short", True): (K.PAD_LENGTH, 39, 0, 0),
        ("cu_start", False): (K.CU_START, 1, 4, 0),
    }
    for (kind, pad), want in cases.items():
        row = make_row([6, 7, 8], rng, 40, pad, 0)
        mutate(row, kind, rng)
        got, _ = run_kernel([row], 40, pad, 0)
        reference, _ = K.check_rows_reference([row], 40, pad, 0)
        assert got == [want] and [tuple(r) for r in reference] == [want], kind


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.integers(-1, 12), st.integers(0, 3), st.integers(-1, 3)), max_size=30
    )
)
def test_check_coverage_matches_reference(entries):
    entries = sorted(entries, key=lambda e: (e[0], e[1] * 2))
    index = np.array([e[0] for e in entries], np.int64)
    offset = np.array([e[1] * 2 for e in entries], np.int64)
    length = np.array([e[2] if e[2] < 0 else 2 * e[2] for e in entries], np.int64)
    code = np.zeros(index.size, np.int64)
    K.check_coverage(index, offset, length, 10, code)
    assert code.tolist() == K.check_coverage_reference(
        index.tolist(), offset.tolist(), length.tolist(), 10
    )


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    corrupt=st.sampled_from(["none", "token", "label", "index", "offset", "first_label_only"]),
)
def test_compare_source_matches_reference(seed, corrupt):
    rng = np.random.default_rng(seed)
    src = []
    for _ in range(8):
        n = int(rng.integers(1, 15))
        tok = rng.integers(0, 50, n).tolist()
        src.append((tok, [t if rng.random() < 0.6 else -100 for t in tok]))
    rows = []
    for r in range(3):
        picks = rng.choice(8, size=int(rng.integers(1, 4)), replace=False).tolist()
        row = {
            "input_ids": [],
            "labels": [],
            "position_ids": [],
            "cu_seqlens": [0],
            "sample_index": [],
            "sample_offset": [],
            "num_loss_tokens": 0,
        }
        for idx in picks:
            tok, lab = src[idx]
            off = int(rng.integers(0, len(tok)))
            row["input_ids"] += tok[off:]
            row["labels"] += [-100] + lab[off + 1 :]
            row["position_ids"] += list(range(len(tok) - off))
            row["cu_seqlens"].append(row["cu_seqlens"][-1] + len(tok) - off)
            row["sample_index"].append(idx)
            row["sample_offset"].append(off)
        if r == 1 and corrupt != "none":
            t = int(rng.integers(0, len(row["input_ids"])))
            if corrupt == "token":
                row["input_ids"][t] += 1
            elif corrupt == "label":
                row["labels"][t] = 77
            elif corrupt == "index":
                row["sample_index"][0] = 99
            elif corrupt == "offset":
                row["sample_offset"][0] += 20
            else:
                row["labels"][0] = 5  # the first label is not compared with the source
        rows.append(row)
    sh = arrays_from_table(pa.Table.from_pylist(rows, schema=SCHEMA), "t")
    src_tok = np.array([t for tok, _ in src for t in tok], np.int32)
    src_lab = np.array([x for _, lab in src for x in lab], np.int32)
    offsets = np.cumsum([0] + [len(t) for t, _ in src]).astype(np.int64)
    code, a, b, c = (np.zeros(sh.rows, np.int64) for _ in range(4))
    K.compare_source(
        sh.ids_off,
        sh.ids,
        sh.lab_off,
        sh.labels,
        sh.cu_off,
        sh.cu,
        sh.si_off,
        sh.sample_index,
        sh.so_off,
        sh.sample_offset,
        np.zeros(sh.rows, bool),
        src_tok,
        src_lab,
        offsets,
        code,
        a,
        b,
        c,
    )
    got = list(zip(code.tolist(), a.tolist(), b.tolist(), c.tolist()))
    assert got == K.compare_source_reference(rows, src)
    if corrupt in ("none", "first_label_only"):
        assert all(g[0] == K.OK for g in got)
    elif corrupt in ("index", "offset"):
        assert got[1][0] in (K.SRC_INDEX, K.SRC_RANGE)
