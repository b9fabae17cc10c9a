"""The record batch of a CP shard (`pack --cp-size N`, or `--sequence-parallel`): the gathered
rows with every segment padded at its end to the run's multiple (2N for CP alone, see
packer.planning.cp), and `cu_seqlens_padded` added.

The gather kernel fills the buffers as for any shard, without row padding; this spreads the
segments apart with numpy (pad tokens `pad_id`, labels -100) and pads each row to L when asked.
A padding token's position continues its segment's count (n, n + 1, ...), the position ids
that `cu_seqlens_padded` implies, so rank-local positions are plain slices of the row's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from packer.contract.names import IGNORE_INDEX
from packer.contract.schema import CP_SCHEMA
from packer.planning.cp import pad_to_multiple
from packer.write.gather import Buffers
from packer.write.shard_file import arrow_array


def _list(offsets: np.ndarray, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(arrow_array(offsets), arrow_array(values))


def cp_rows(
    buf: Buffers,
    rows: int,
    tokens: int,
    cu_entries: int,
    multiple: int,
    max_len: int,
    pad: bool,
    pad_id: int,
) -> dict[str, np.ndarray]:
    """The padded columns of `rows` gathered rows (without row padding) as flat arrays and
    offsets: ids, labels, pos, row_offsets, cu, cu_padded, cu_offsets."""
    cu_off = buf.cu_offsets[: rows + 1].astype(np.int64)
    cu = buf.cu[:cu_entries].astype(np.int64)
    nseg = np.diff(cu_off) - 1
    first = np.ones(cu_entries, bool)
    first[cu_off[:-1]] = False  # entry 0 of each row starts nothing
    n = np.diff(cu)[first[1:]]  # segment lengths, in row order
    p = pad_to_multiple(n, multiple)
    seg_row = np.repeat(np.arange(rows), nseg)
    row_padded = np.bincount(seg_row, weights=p, minlength=rows).astype(np.int64)
    tail = (max_len - row_padded) if pad else np.zeros(rows, np.int64)
    has_tail = (tail > 0).astype(np.int64)
    count = nseg + has_tail  # pieces per row: segments, then the row's padding
    piece_first = np.cumsum(count) - count
    seg_piece = np.arange(n.size) + np.repeat(np.cumsum(has_tail) - has_tail, nseg)
    piece_p = np.zeros(int(count.sum()), np.int64)
    piece_n = np.zeros_like(piece_p)
    piece_p[seg_piece], piece_n[seg_piece] = p, n
    tails = np.flatnonzero(has_tail)
    piece_p[piece_first[tails] + count[tails] - 1] = tail[tails]
    piece_row = np.repeat(np.arange(rows), count)
    total = int(piece_p.sum())
    piece_start = np.cumsum(piece_p) - piece_p  # in the batch
    # real tokens lie end to end in the buffers: token j of segment k moves by its shift
    src_start = np.cumsum(n) - n
    dest = np.arange(tokens, dtype=np.int64) + np.repeat(piece_start[seg_piece] - src_start, n)
    ids = np.full(total, pad_id, np.int32)
    labels = np.full(total, IGNORE_INDEX, np.int32)
    ids[dest], labels[dest] = buf.ids[:tokens], buf.labels[:tokens]
    pos = (np.arange(total, dtype=np.int64) - np.repeat(piece_start, piece_p)).astype(np.int32)
    row_len = np.bincount(piece_row, weights=piece_p, minlength=rows).astype(np.int64)
    row_offsets = np.concatenate([[0], np.cumsum(row_len)]).astype(np.int32)
    row_base = row_offsets[:-1].astype(np.int64)[piece_row]
    out_cu_off = np.concatenate([[0], np.cumsum(count + 1)]).astype(np.int32)
    ends = np.arange(piece_p.size) + piece_row + 1  # where each piece's end entry goes
    cu_padded = np.zeros(int(out_cu_off[-1]), np.int32)
    cu_padded[ends] = np.cumsum(piece_p) - row_base
    real_base = np.repeat(
        np.cumsum(np.bincount(seg_row, n, rows)) - np.bincount(seg_row, n, rows), count
    )
    cu_real = np.zeros_like(cu_padded)
    cu_real[ends] = np.cumsum(piece_n) - real_base.astype(np.int64)
    return {
        "ids": ids,
        "labels": labels,
        "pos": pos,
        "row_offsets": row_offsets,
        "cu": cu_real,
        "cu_padded": cu_padded,
        "cu_offsets": out_cu_off,
    }


def cp_batch_of(multiple: int, max_len: int, pad: bool, pad_id: int) -> Callable:
    """The `ShardFiles.batch` of a CP run: buffers gathered without row padding -> a
    `CP_SCHEMA` record batch."""

    def batch(buf: Buffers, rows: int, tokens: int, cu_entries: int) -> pa.RecordBatch:
        c = cp_rows(buf, rows, tokens, cu_entries, multiple, max_len, pad, pad_id)
        segs = int(buf.sample_row_offsets[rows])
        samples = buf.sample_row_offsets[: rows + 1]
        return pa.RecordBatch.from_arrays(
            [
                _list(c["row_offsets"], c["ids"]),
                _list(c["row_offsets"], c["labels"]),
                _list(c["row_offsets"], c["pos"]),
                _list(c["cu_offsets"], c["cu"]),
                _list(samples, buf.sample[:segs]),
                _list(samples, buf.sample_offset[:segs]),
                arrow_array(buf.loss[:rows]),
                _list(c["cu_offsets"], c["cu_padded"]),
            ],
            schema=CP_SCHEMA,
        )

    return batch


def batch_tokens(batch: pa.RecordBatch, gathered: int) -> int:
    """The tokens a CP record batch holds, its padding included (the gathered count without)."""
    values = batch.column(0)
    return int(values.offsets[-1].as_py() - values.offsets[0].as_py())
