"""The gather kernel against a plain Python reference, on random segments and plans."""

from __future__ import annotations

import numpy as np
import pytest

from packer.contract.names import IGNORE_INDEX
from packer.read.samples import as_chunks
from packer.write.gather import Buffers, gather_rows


def reference(chunks, label_chunks, segs, order, row_starts, r0, r1, max_len, pad, pad_id):
    """The packed columns of rows r0..r1, one list per column, written the obvious way."""
    out = {k: [] for k in ("ids", "labels", "pos", "cu", "sample", "sample_offset", "loss")}
    out.update(row_offsets=[0], cu_offsets=[0], sample_row_offsets=[0])
    for r in range(r0, r1):
        ids, labels, pos, cu = [], [], [], [0]
        for k in range(row_starts[r], row_starts[r + 1]):
            chunk, start, length, sample, offset = segs[order[k]]
            tokens = chunks[chunk][start : start + length].tolist()
            source = label_chunks if label_chunks is not None else chunks
            targets = source[chunk][start : start + length].tolist()
            targets[0] = IGNORE_INDEX  # never the target of the previous sample's last token
            ids += tokens
            labels += targets
            pos += list(range(length))
            cu.append(len(ids))
            out["sample"].append(sample)
            out["sample_offset"].append(offset)
        if pad and len(ids) < max_len:
            n = max_len - len(ids)
            ids += [pad_id] * n
            labels += [IGNORE_INDEX] * n
            pos += list(range(n))
            cu.append(max_len)
        out["ids"] += ids
        out["labels"] += labels
        out["pos"] += pos
        out["cu"] += cu
        out["loss"].append(sum(x != IGNORE_INDEX for x in labels))
        out["row_offsets"].append(len(out["ids"]))
        out["cu_offsets"].append(len(out["cu"]))
        out["sample_row_offsets"].append(len(out["sample"]))
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("labelled", [True, False])
@pytest.mark.parametrize("pad", [False, True])
def test_kernel_matches_the_reference(seed, labelled, pad):
    rng = np.random.default_rng(seed)
    max_len = int(rng.integers(8, 200))
    chunks = [rng.integers(0, 50_000, int(rng.integers(max_len, 5000)), dtype=np.int32)]
    chunks += [rng.integers(0, 50_000, int(rng.integers(max_len, 3000)), dtype=np.int32)]
    label_chunks = None
    if labelled:  # prompt tokens masked, and masks at sample starts too
        label_chunks = [np.where(rng.random(c.size) < 0.3, IGNORE_INDEX, c) for c in chunks]
        label_chunks = [c.astype(np.int32) for c in label_chunks]
    segs = []
    for _ in range(int(rng.integers(1, 120))):
        chunk = int(rng.integers(0, 2))
        length = int(rng.integers(1, max_len + 1))
        start = int(rng.integers(0, chunks[chunk].size - length + 1))
        segs.append((chunk, start, length, int(rng.integers(0, 10**9)), int(rng.integers(0, 99))))
    # a plan: segments in a random order, cut into rows of at most max_len tokens
    order = rng.permutation(len(segs))
    row_starts, used = [0], 0
    for k, seg in enumerate(order):
        if used + segs[seg][2] > max_len:
            row_starts.append(k)
            used = 0
        used += segs[seg][2]
    row_starts.append(len(segs))
    rows = len(row_starts) - 1
    r0 = int(rng.integers(0, rows))
    r1 = int(rng.integers(r0 + 1, rows + 1))
    pad_id = int(rng.integers(0, 7))

    want = reference(chunks, label_chunks, segs, order, row_starts, r0, r1, max_len, pad, pad_id)
    tokens = as_chunks(chunks)
    labels = as_chunks(label_chunks) if labelled else tokens
    columns = np.array(segs, np.int64).T
    buf = Buffers.allocate(max_len * (r1 - r0), r1 - r0, len(segs) + (r1 - r0))  # + pads
    t, c = gather_rows(
        tokens.addresses,
        labels.addresses,
        labelled,
        columns[0].copy(),
        columns[1].copy(),
        order.astype(np.int64),
        np.array(row_starts, np.int64),
        columns[3].copy(),
        columns[2].astype(np.int32),
        columns[4].astype(np.int32),
        r0,
        r1,
        max_len,
        pad,
        pad_id,
        buf.ids,
        buf.labels,
        buf.pos,
        buf.row_offsets,
        buf.cu,
        buf.cu_offsets,
        buf.sample,
        buf.sample_offset,
        buf.sample_row_offsets,
        buf.loss,
    )
    n, s = r1 - r0, len(want["sample"])
    assert (t, c) == (len(want["ids"]), len(want["cu"]))
    got = {
        "ids": buf.ids[:t],
        "labels": buf.labels[:t],
        "pos": buf.pos[:t],
        "cu": buf.cu[:c],
        "sample": buf.sample[:s],
        "sample_offset": buf.sample_offset[:s],
        "loss": buf.loss[:n],
        "row_offsets": buf.row_offsets[: n + 1],
        "cu_offsets": buf.cu_offsets[: n + 1],
        "sample_row_offsets": buf.sample_row_offsets[: n + 1],
    }
    for name, values in got.items():
        assert values.tolist() == want[name], name
