"""Megatron-Bridge's packed Parquet (`*.idx.parquet`) and its packing metadata JSON.

As megatron/bridge/data/packing/parquet.py and gpt_sft.py read it: per row `input_ids`
(list<int32>), `seq_start_id` (list<int32>, where each sub-sequence starts) and `loss_mask`
(list<int8>). The collate function feeds `input_ids[start:end - 1]` of each sub-sequence and
takes `input_ids[start + 1:end]` as its targets, so every sub-sequence carries one token more
than the model sees: a packer sample is stored whole, its last token being only a target, and
the loss is the same. The loss mask is shifted by one, as Bridge's own packer rolls it:
`loss_mask[j]` says whether the target `input_ids[j + 1]` counts (packer's label at j + 1 is
not -100); the mask of a sub-sequence's last token is 0. Bridge pads rows itself (with the
tokenizer's EOS id) at collate time, so a `--pad` tail is not stored. Provenance travels in
two extra columns, which Bridge's reader ignores.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packer.contract.names import IGNORE_INDEX
from packer.export.rows import RowBatch
from packer.write.shard_file import HashingFile

ROW_GROUP = 500  # Bridge's own write_packed_parquet default
SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("seq_start_id", pa.list_(pa.int32())),
        ("sample_index", pa.list_(pa.int64())),
        ("sample_offset", pa.list_(pa.int32())),
    ]
)
METADATA = "packing_metadata.json"
NOTES = (
    "labels travel as a loss mask: each target is the next input id",
    "the trainer sees each sample without its last token as input (it is only a target)",
)


def loss_mask(batch: RowBatch) -> np.ndarray:
    """Bridge's shifted mask: 1 at j when the label at j + 1, in the same sample, counts."""
    counts = batch.labels != IGNORE_INDEX
    mask = np.zeros(batch.ids.size, dtype=np.int8)
    mask[:-1] = counts[1:]
    mask[batch.last_token_mask()] = 0
    return mask


def _list(offsets, values, arrow_type) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, arrow_type))


def cp_layout(batch: RowBatch, multiple: int, eos_id: int) -> tuple[np.ndarray, ...]:
    """Row offsets, tokens, loss mask and sub-sequence lengths as Bridge stores rows for
    context parallelism (`pad_seq_to_mult = multiple`, offline.py's `_pre_pad_data_point`):
    the model sees every sub-sequence but its last token, so each sample of n tokens is stored
    with EOS padding to `ceil((n - 1) / multiple) * multiple + 1` tokens, mask 0 on the padding.
    """
    n = batch.seq_lens
    stored = (n - 1 + multiple - 1) // multiple * multiple + 1
    begin = np.cumsum(stored) - stored
    dest = np.repeat(begin - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
    ids = np.full(int(stored.sum()), eos_id, dtype=np.int32)
    ids[dest] = batch.ids
    mask = np.zeros(ids.size, dtype=np.int8)
    mask[dest] = loss_mask(batch)
    csum = np.concatenate([[0], np.cumsum(stored)]).astype(np.int64)
    return csum[batch.seq_off], ids, mask, stored


def first_loss_after_eos_tail(batch: RowBatch, eos_id: int) -> int | None:
    """The first token (index into `batch.ids`) whose loss Bridge's CP collate would drop: it
    takes a sub-sequence's real length to end at its last non-EOS token, so a loss-bearing
    position inside a sample's trailing run of EOS ids would count as padding."""
    if not batch.ids.size:
        return None
    starts = batch.token_starts()
    local = np.arange(batch.ids.size) - np.repeat(starts, batch.seq_lens)
    last_real = np.maximum.reduceat(np.where(batch.ids != eos_id, local, -1), starts)
    bad = (loss_mask(batch) == 1) & (local > np.repeat(last_real, batch.seq_lens))
    return int(np.argmax(bad)) if bad.any() else None


class BridgeShard:
    """One `shard-NNNNN.idx.parquet`, with the statistics its rows add to the metadata."""

    def __init__(self, path: Path, multiple: int, eos_id: int | None):
        self.multiple, self.eos_id = multiple, eos_id
        self.name = path.name
        self.file = HashingFile(path, "xxh3_128")  # hashed while written, never read back
        # token ids are near-random over a large vocabulary: dictionary-encoding them costs a
        # third of the write and saves little; the 0/1 loss mask is where it pays. Bridge reads
        # whole row groups and never filters on column statistics, which cost a third more.
        self._writer = pq.ParquetWriter(
            self.file, SCHEMA, use_dictionary=["loss_mask"], write_statistics=False
        )
        self.rows = self.samples = self.tokens = 0
        # dataset_max_seqlen and min_packed_seqlen: the longest sub-sequence and the shortest
        # row the model sees (for CP, with their pre-padding); Bridge's collate with
        # pad_cu_seqlens sizes the attention kernel's max_seqlen from them
        self.max_seqlen = self.max_per_row = 0
        self.min_row: int | None = None

    def write(self, batch: RowBatch) -> None:
        if self.multiple > 1:
            off, ids, mask, seq_lens = cp_layout(batch, self.multiple, self.eos_id)
            starts = (np.cumsum(seq_lens) - seq_lens) - np.repeat(off[:-1], batch.samples_per_row)
        else:
            off, ids, mask, seq_lens = batch.off, batch.ids, loss_mask(batch), batch.seq_lens
            starts = batch.seq_starts()
        table = pa.Table.from_arrays(
            [
                _list(off, ids, pa.int32()),
                _list(off, mask, pa.int8()),
                _list(batch.seq_off, starts.astype(np.int32), pa.int32()),
                _list(batch.seq_off, batch.sample_index, pa.int64()),
                _list(batch.seq_off, batch.sample_offset, pa.int32()),
            ],
            schema=SCHEMA,
        )
        self._writer.write_table(table, row_group_size=ROW_GROUP)
        if batch.rows:
            lens = np.diff(off)
            self.rows += batch.rows
            # runtime lengths, as Bridge's collate counts them: each sub-sequence is fed
            # without its last stored token, so a row of k sub-sequences feeds len - k tokens
            self.samples += int(batch.seq_off[-1])
            self.tokens += int(lens.sum()) - int(batch.seq_off[-1])
            self.max_seqlen = max(self.max_seqlen, int(seq_lens.max()) - 1)
            self.max_per_row = max(self.max_per_row, int(batch.samples_per_row.max()))
            low = int((lens - batch.samples_per_row).min())
            self.min_row = low if self.min_row is None else min(self.min_row, low)

    def close(self) -> None:
        self._writer.close()
        self.file.close()


class BridgeWriter:
    """One `shard-NNNNN.idx.parquet` per source shard and `packing_metadata.json`.

    `multiple` > 1 (a `--cp-size` output: 2 x cp_size) stores rows as Bridge's own packer does
    with `pad_seq_to_mult`, padded with `eos_id`. Shards are independent files, so two may be
    written at once (`PARALLEL`)."""

    PARALLEL = True

    def __init__(self, tmp: Path, pack_size: int, multiple: int = 1, eos_id: int | None = None):
        self.tmp, self.pack_size = tmp, pack_size
        self.multiple, self.eos_id = multiple, eos_id
        self._shards: dict[int, BridgeShard] = {}

    def shard(self, number: int) -> BridgeShard:
        shard = BridgeShard(
            self.tmp / f"shard-{number:05d}.idx.parquet", self.multiple, self.eos_id
        )
        self._shards[number] = shard
        return shard

    @property
    def digests(self) -> dict[str, str]:
        """xxh3_128 of each shard, hashed while written."""
        return {s.name: s.file.digest.hexdigest() for s in self._shards.values()}

    def finish(self) -> dict:
        shards = [self._shards[n] for n in sorted(self._shards)]
        rows = sum(s.rows for s in shards)
        lows = [s.min_row for s in shards if s.min_row is not None]
        metadata = {
            "dataset_max_seqlen": max((s.max_seqlen for s in shards), default=0),
            "max_samples_per_bin": max((s.max_per_row for s in shards), default=0),
            "min_packed_seqlen": min(lows, default=0),
            "pack_size": self.pack_size,
            "packing_factor": round(sum(s.samples for s in shards) / max(rows, 1), 2),
            "packing_efficiency": round(
                sum(s.tokens for s in shards) / max(rows, 1) / self.pack_size * 100, 2
            ),
        }
        if self.multiple > 1:  # what the recipe's packed_sequence_specs must say
            metadata["pad_seq_to_mult"] = self.multiple
        (self.tmp / METADATA).write_text(json.dumps([metadata], sort_keys=True) + "\n")
        return {"metadata": metadata}
