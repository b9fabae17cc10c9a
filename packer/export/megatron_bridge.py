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


class BridgeWriter:
    """One `shard-NNNNN.idx.parquet` per source shard and `packing_metadata.json`."""

    def __init__(self, tmp: Path, pack_size: int):
        self.tmp, self.pack_size = tmp, pack_size
        self._writer = None
        self.rows = self.samples = self.tokens = 0
        self.max_seqlen = self.max_per_row = 0
        self.min_row = None

    def start_shard(self, number: int) -> None:
        self._close()
        # token ids are near-random over a large vocabulary: dictionary-encoding them costs a
        # third of the write and saves little; the 0/1 loss mask is where it pays
        self._writer = pq.ParquetWriter(
            str(self.tmp / f"shard-{number:05d}.idx.parquet"), SCHEMA, use_dictionary=["loss_mask"]
        )

    def write(self, batch: RowBatch) -> None:
        table = pa.Table.from_arrays(
            [
                _list(batch.off, batch.ids, pa.int32()),
                _list(batch.off, loss_mask(batch), pa.int8()),
                _list(batch.seq_off, batch.seq_starts().astype(np.int32), pa.int32()),
                _list(batch.seq_off, batch.sample_index, pa.int64()),
                _list(batch.seq_off, batch.sample_offset, pa.int32()),
            ],
            schema=SCHEMA,
        )
        self._writer.write_table(table, row_group_size=ROW_GROUP)
        if batch.rows:
            lens = batch.row_lens
            self.rows += batch.rows
            self.samples += int(batch.seq_off[-1])
            self.tokens += int(lens.sum())
            self.max_seqlen = max(self.max_seqlen, int(batch.seq_lens.max()))
            self.max_per_row = max(self.max_per_row, int(batch.samples_per_row.max()))
            low = int(lens.min())
            self.min_row = low if self.min_row is None else min(self.min_row, low)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def finish(self) -> dict:
        self._close()
        rows = max(self.rows, 1)
        metadata = {
            "dataset_max_seqlen": self.max_seqlen,
            "max_samples_per_bin": self.max_per_row,
            "min_packed_seqlen": self.min_row or 0,
            "pack_size": self.pack_size,
            "packing_factor": round(self.samples / rows, 2),
            "packing_efficiency": round(self.tokens / rows / self.pack_size * 100, 2),
        }
        (self.tmp / METADATA).write_text(json.dumps([metadata], sort_keys=True) + "\n")
        return {"metadata": metadata}
