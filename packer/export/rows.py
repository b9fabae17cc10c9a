"""A committed packer output read back batch by batch, as the flat arrays every exporter needs.

Each record batch of each shard becomes one `RowBatch`: the rows' real tokens (a `--pad` tail,
which is its own final segment, cut off: every trainer pads its own way), their labels, and the
samples' lengths and provenance, all as Arrow-style offsets + values built with numpy, so an
export costs a few vector operations per batch and never a Python loop per sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.contract.names import IGNORE_INDEX
from packer.contract.shards import ShardArrays
from packer.errors import InputError
from packer.export.kernels import first_bad_position_row


@dataclass
class RowBatch:
    """Rows r = 0..rows-1 of one record batch, padding removed.

    Row r's tokens are `ids[off[r]:off[r + 1]]` (labels alike); its samples are
    `seq_lens[seq_off[r]:seq_off[r + 1]]`, in order, with their `sample_index` and
    `sample_offset` at the same places.
    """

    shard: str  # the shard file the rows come from
    first_row: int  # the first row's number in that shard
    rows: int
    off: np.ndarray  # int64, rows + 1
    ids: np.ndarray  # int32
    labels: np.ndarray  # int32
    seq_off: np.ndarray  # int64, rows + 1
    seq_lens: np.ndarray  # int64, one per sample
    sample_index: np.ndarray  # int64, one per sample
    sample_offset: np.ndarray  # int32, one per sample

    @property
    def row_lens(self) -> np.ndarray:
        return np.diff(self.off)

    @property
    def samples_per_row(self) -> np.ndarray:
        return np.diff(self.seq_off)

    def token_starts(self) -> np.ndarray:
        """Where each sample starts in `ids` (int64, one per sample): rows hold no padding, so
        the samples of a batch tile its tokens."""
        return np.cumsum(self.seq_lens) - self.seq_lens

    def seq_starts(self) -> np.ndarray:
        """Where each sample starts inside its row (int64, one per sample)."""
        return self.token_starts() - np.repeat(self.off[:-1], self.samples_per_row)

    def first_token_mask(self) -> np.ndarray:
        """True on the first token of every sample (bool, one per token)."""
        mask = np.zeros(self.ids.size, dtype=bool)
        mask[self.token_starts()] = True
        return mask

    def last_token_mask(self) -> np.ndarray:
        """True on the last token of every sample (bool, one per token)."""
        mask = np.zeros(self.ids.size, dtype=bool)
        mask[np.cumsum(self.seq_lens) - 1] = True
        return mask


def row_batch(batch: ShardArrays) -> RowBatch:
    """The rows of one shard batch without padding, checked where an exporter relies on them.

    Raises InputError naming the shard and row when a row's positions do not restart at every
    boundary: every target format rebuilds positions from the boundaries alone."""
    rows = batch.rows
    n_samples = np.diff(batch.si_off).astype(np.int64)
    n_segments = np.diff(batch.cu_off).astype(np.int64) - 1
    cu_base = batch.cu_off[:-1].astype(np.int64)
    bad = first_bad_position_row(batch.pos_off, batch.pos, batch.cu_off, batch.cu)
    if bad >= 0:
        raise InputError(
            f"row {batch.shard_row(int(bad))}: position_ids do not restart at every cu_seqlens "
            "boundary; the export formats rebuild positions from the boundaries",
            where=batch.name,
        )
    seg_lens = np.diff(batch.cu.astype(np.int64))
    if seg_lens.size:
        keep = np.ones(seg_lens.size, dtype=bool)
        keep[batch.cu_off[1:-1].astype(np.int64) - 1] = False  # the step from one row to the next
        seg_lens = seg_lens[keep]
    if batch.cu_real is not None:  # a CP output: every sample without its CP padding
        return _without_cp_padding(batch, n_samples)
    # real length of each row: the cu entry after its last sample
    real = batch.cu[(cu_base + n_samples)].astype(np.int64)
    ids_off = batch.ids_off.astype(np.int64)
    off = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(real, out=off[1:])
    if np.array_equal(real, np.diff(ids_off)):  # no padding: the arrays as they are
        ids, labels = batch.ids, batch.labels
    else:
        in_row = np.arange(int(ids_off[-1]) - int(ids_off[0])) - np.repeat(
            ids_off[:-1] - ids_off[0], np.diff(ids_off)
        )
        keep_tok = in_row < np.repeat(real, np.diff(ids_off))
        base = int(ids_off[0])
        ids = batch.ids[base : base + keep_tok.size][keep_tok]
        labels = batch.labels[base : base + keep_tok.size][keep_tok]
    # sample lengths: the first n_samples segments of every row
    seg_off = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(n_segments, out=seg_off[1:])
    take = np.repeat(seg_off[:-1], n_samples) + (
        np.arange(int(n_samples.sum())) - np.repeat(np.cumsum(n_samples) - n_samples, n_samples)
    )
    seq_off = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(n_samples, out=seq_off[1:])
    si0, so0 = int(batch.si_off[0]), int(batch.so_off[0])
    return RowBatch(
        shard=batch.name,
        first_row=batch.first_row,
        rows=rows,
        off=off,
        ids=ids,
        labels=labels,
        seq_off=seq_off,
        seq_lens=seg_lens[take],
        sample_index=batch.sample_index[si0 : si0 + int(n_samples.sum())].astype(np.int64),
        sample_offset=batch.sample_offset[so0 : so0 + int(n_samples.sum())].astype(np.int32),
    )


def _without_cp_padding(batch: ShardArrays, n_samples: np.ndarray) -> RowBatch:
    """The rows of a `--cp-size` shard with each sample's real tokens only.

    Sample j of row r starts at `cu_seqlens_padded[j]` in its row and has
    `cu_seqlens[j + 1] - cu_seqlens[j]` real tokens; its CP padding (and a `--pad` segment) is
    left out, so every format gets the samples exactly and pads them its own way."""
    rows = batch.rows
    total = int(n_samples.sum())
    within = np.arange(total) - np.repeat(np.cumsum(n_samples) - n_samples, n_samples)
    k = np.repeat(batch.cu_off[:-1].astype(np.int64), n_samples) + within
    kr = np.repeat(batch.cu_real_off[:-1].astype(np.int64), n_samples) + within
    lens = (batch.cu_real[kr + 1] - batch.cu_real[kr]).astype(np.int64)
    ids_off = batch.ids_off.astype(np.int64)
    starts = np.repeat(ids_off[:-1], n_samples) + batch.cu[k].astype(np.int64)
    index = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
    seq_off = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(n_samples, out=seq_off[1:])
    csum = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    si0, so0 = int(batch.si_off[0]), int(batch.so_off[0])
    return RowBatch(
        shard=batch.name,
        first_row=batch.first_row,
        rows=rows,
        off=csum[seq_off],
        ids=batch.ids[index],
        labels=batch.labels[index],
        seq_off=seq_off,
        seq_lens=lens,
        sample_index=batch.sample_index[si0 : si0 + total].astype(np.int64),
        sample_offset=batch.sample_offset[so0 : so0 + total].astype(np.int32),
    )


def row_runs(lengths: np.ndarray, max_tokens: int | None) -> list[tuple[int, int]]:
    """Consecutive runs [lo, hi) of rows of at most `max_tokens` tokens in all, each holding at
    least one row; one run of every row when `max_tokens` is None."""
    rows = lengths.size
    if max_tokens is None or rows == 0:
        return [(0, rows)]
    ends = np.cumsum(lengths)
    runs, lo = [], 0
    while lo < rows:
        base = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, base + max_tokens, side="right")))
        runs.append((lo, hi))
        lo = hi
    return runs


def label_mismatch(batch: RowBatch) -> int | None:
    """The first token (index into `batch.ids`) whose label is neither -100 nor its own id."""
    bad = (batch.labels != IGNORE_INDEX) & (batch.labels != batch.ids)
    if not bad.any():
        return None
    return int(np.argmax(bad))


def row_of_token(batch: RowBatch, token: int) -> int:
    return int(np.searchsorted(batch.off, token, side="right") - 1)
