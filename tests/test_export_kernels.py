"""The MDS encoder's kernels against plain Python references, and its samples against the
layout streaming's `MDSWriter.encode_sample` writes (one shape byte, the length in the smallest
unsigned width, the values)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.export.kernels import put_bytes, put_shapes
from packer.export.mds import COLUMNS, encode_samples
from packer.export.rows import RowBatch


def shape_prefix(n: int) -> bytes:
    for code, dtype in enumerate((np.uint8, np.uint16, np.uint32, np.uint64)):
        if n < (1 << (8 << code)):
            return bytes([(1 << 2) | code]) + np.array([n], dtype).tobytes()
    raise ValueError(n)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=12), st.integers(0, 5))
def test_put_bytes_matches_python(rows, gap):
    src = np.frombuffer(b"".join(rows), dtype=np.uint8)
    src_off = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    dst = np.array([i * gap + int(src_off[i]) for i in range(len(rows))], dtype=np.int64)
    out = np.zeros(int(src_off[-1]) + gap * len(rows), dtype=np.uint8)
    put_bytes(src, src_off, out, dst)
    expected = bytearray(out.size)
    for r, row in enumerate(rows):
        expected[int(dst[r]) : int(dst[r]) + len(row)] = row
    assert out.tobytes() == bytes(expected)


@pytest.mark.parametrize(
    "counts", [[0, 1, 255], [256, 65535], [65536, 70000, (1 << 32) - 1], [1 << 32, 5]]
)
def test_put_shapes_matches_python(counts):
    counts = np.array(counts, dtype=np.int64)
    dst = np.arange(counts.size, dtype=np.int64) * 9
    out = np.zeros(9 * counts.size, dtype=np.uint8)
    put_shapes(counts, out, dst)
    for r, n in enumerate(counts):
        prefix = shape_prefix(int(n))
        assert out[dst[r] : dst[r] + len(prefix)].tobytes() == prefix


def _batch(samples_per_row: list[list[int]], seed: int) -> RowBatch:
    rng = np.random.default_rng(seed)
    lens = np.array([n for row in samples_per_row for n in row], dtype=np.int64)
    seq_off = np.concatenate([[0], np.cumsum([len(r) for r in samples_per_row])]).astype(np.int64)
    row_lens = [sum(r) for r in samples_per_row]
    off = np.concatenate([[0], np.cumsum(row_lens)]).astype(np.int64)
    ids = rng.integers(0, 2**31 - 1, int(off[-1])).astype(np.int32)
    labels = np.where(rng.random(ids.size) < 0.3, -100, ids).astype(np.int32)
    return RowBatch(
        shard="s",
        first_row=0,
        rows=len(samples_per_row),
        off=off,
        ids=ids,
        labels=labels,
        seq_off=seq_off,
        seq_lens=lens,
        sample_index=rng.integers(0, 2**40, lens.size),
        sample_offset=rng.integers(0, 1000, lens.size).astype(np.int32),
    )


def _python_samples(batch: RowBatch) -> list[bytes]:
    """Row by row, as the MDS writer's per-sample encoding does it."""
    out = []
    for r in range(batch.rows):
        t = slice(int(batch.off[r]), int(batch.off[r + 1]))
        s = slice(int(batch.seq_off[r]), int(batch.seq_off[r + 1]))
        lens = batch.seq_lens[s]
        cu = np.concatenate([[0], np.cumsum(lens)])
        values = {
            "cu_seqlens": cu,
            "input_ids": batch.ids[t],
            "labels": batch.labels[t],
            "position_ids": np.concatenate([np.arange(n) for n in lens]) if lens.size else [],
            "sample_index": batch.sample_index[s],
            "sample_offset": batch.sample_offset[s],
        }
        parts = []
        for name in sorted(COLUMNS):
            array = np.asarray(values[name]).astype(COLUMNS[name][1])
            parts.append(shape_prefix(array.size) + array.tobytes())
        out.append(np.array([len(p) for p in parts], np.uint32).tobytes() + b"".join(parts))
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=6), min_size=1, max_size=8),
    st.integers(0, 2**16),
)
def test_encode_samples_matches_per_row_encoding(rows, seed):
    batch = _batch(rows, seed)
    data, sizes = encode_samples(batch)
    expected = _python_samples(batch)
    assert sizes.tolist() == [len(e) for e in expected]
    assert data.tobytes() == b"".join(expected)


@pytest.mark.parametrize("length", [255, 256, 65535, 65536, 70000])
def test_encode_samples_shape_widths(length):
    batch = _batch([[length], [3, length - 3]], 7)
    data, _ = encode_samples(batch)
    assert data.tobytes() == b"".join(_python_samples(batch))


def _split(batch: RowBatch, cut: int) -> list[RowBatch]:
    """The batch as two batches, rows [0, cut) and [cut, rows)."""
    parts = []
    for lo, hi in ((0, cut), (cut, batch.rows)):
        t0, t1 = int(batch.off[lo]), int(batch.off[hi])
        s0, s1 = int(batch.seq_off[lo]), int(batch.seq_off[hi])
        parts.append(
            RowBatch(
                shard="s",
                first_row=lo,
                rows=hi - lo,
                off=batch.off[lo : hi + 1] - t0,
                ids=batch.ids[t0:t1],
                labels=batch.labels[t0:t1],
                seq_off=batch.seq_off[lo : hi + 1] - s0,
                seq_lens=batch.seq_lens[s0:s1],
                sample_index=batch.sample_index[s0:s1],
                sample_offset=batch.sample_offset[s0:s1],
            )
        )
    return parts


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 60), min_size=1, max_size=5), min_size=2, max_size=12),
    st.integers(0, 2**16),
    st.integers(200, 3000),
    st.data(),
)
def test_shards_are_cut_as_the_per_sample_rule_cuts_them(tmp_path_factory, rows, seed, limit, data):
    """A shard closes before the sample that would take it past the limit (one sample larger
    than the limit gets a shard of its own), wherever the batches happen to end."""
    from packer.export.mds import MdsWriter

    batch = _batch(rows, seed)
    samples = _python_samples(batch)
    writer = MdsWriter(tmp_path_factory.mktemp("mds"), limit)
    shards, current, size = [], [], writer._empty
    for sample in samples:  # the per-sample rule
        if current and limit < size + len(sample) + 4:
            shards.append(current)
            current, size = [], writer._empty
        current.append(sample)
        size += len(sample) + 4
    shards.append(current)
    for part in _split(batch, data.draw(st.integers(1, batch.rows - 1))):
        writer.write(part)
    writer.finish()
    assert [s["samples"] for s in writer.shards] == [len(s) for s in shards]
    for number, expected in enumerate(shards):
        raw = (writer.tmp / f"shard.{number:05d}.mds").read_bytes()
        n = int(np.frombuffer(raw[:4], np.uint32)[0])
        offsets = np.frombuffer(raw[4 : 4 + 4 * (n + 1)], np.uint32)
        got = [raw[offsets[i] : offsets[i + 1]] for i in range(n)]
        assert got == expected


@pytest.mark.parametrize("fit", [1, 2, 3])
def test_a_shard_filled_exactly_to_the_limit_stays_open(tmp_path, fit):
    from packer.export.mds import MdsWriter

    batch = _batch([[5, 7]] * 7, 3)  # samples of one size
    size = len(_python_samples(batch)[0]) + 4
    writer = MdsWriter(tmp_path, 1)
    writer.size_limit = writer._empty + fit * size  # exactly `fit` samples per shard
    for part in _split(batch, 4):
        writer.write(part)
    writer.finish()
    assert [s["samples"] for s in writer.shards] == [fit] * (7 // fit) + [7 % fit] * (7 % fit > 0)
