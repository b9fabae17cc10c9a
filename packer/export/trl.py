"""TRL's padding-free format: a 🤗 `save_to_disk` dataset of rows with `seq_lengths`.

`SFTTrainer(padding_free=True)`'s collator (`DataCollatorForLanguageModeling` in
trl/trainer/sft_trainer.py) rebuilds each sample's positions from `seq_lengths`, concatenates
the rows of a batch, and takes `labels` as they are (-100 on what carries no loss). One Arrow
file per packer shard, laid out as `datasets.Dataset.save_to_disk` lays it out, written with
pyarrow alone so the export needs no `datasets`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from packer.export.rows import RowBatch
from packer.write.shard_file import HashingFile

_LIST_TYPES = {
    "input_ids": ("int32", pa.int32()),
    "labels": ("int32", pa.int32()),
    "seq_lengths": ("int32", pa.int32()),
    "sample_index": ("int64", pa.int64()),
    "sample_offset": ("int32", pa.int32()),
}
FEATURES = {
    name: {"feature": {"dtype": dtype, "_type": "Value"}, "_type": "List"}
    for name, (dtype, _) in _LIST_TYPES.items()
}
SCHEMA = pa.schema(
    [(name, pa.list_(t)) for name, (_, t) in _LIST_TYPES.items()],
    metadata={"huggingface": json.dumps({"info": {"features": FEATURES}})},
)
NOTES = ("position_ids and cu_seqlens are rebuilt by the collator from seq_lengths",)


def _list(offsets, values, arrow_type) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, arrow_type))


class TrlShard:
    """One `data-XXXXX-of-NNNNN.arrow`: an Arrow IPC stream, as `save_to_disk` writes it."""

    def __init__(self, path: Path):
        self.name = path.name
        self.file = HashingFile(path, "xxh3_128")  # hashed while written, never read back
        self._writer = pa.ipc.new_stream(self.file, SCHEMA)

    def write(self, batch: RowBatch) -> None:
        table = pa.Table.from_arrays(
            [
                _list(batch.off, batch.ids, pa.int32()),
                _list(batch.off, batch.labels, pa.int32()),
                _list(batch.seq_off, batch.seq_lens.astype("int32"), pa.int32()),
                _list(batch.seq_off, batch.sample_index, pa.int64()),
                _list(batch.seq_off, batch.sample_offset, pa.int32()),
            ],
            schema=SCHEMA,
        )
        self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()
        self.file.close()


class TrlWriter:
    """One `data-XXXXX-of-NNNNN.arrow` per source shard, then `state.json` and
    `dataset_info.json`. Shards are independent files, so two may be written at once."""

    PARALLEL = True

    def __init__(self, tmp: Path, shards: int, fingerprint: str):
        # an output without shards still gets one file, empty: `datasets` cannot load a
        # dataset of none (its own save_to_disk of 0 rows writes none and cannot load it back)
        self.tmp, self.shards, self.fingerprint = tmp, max(shards, 1), fingerprint
        self.files = [f"data-{n:05d}-of-{self.shards:05d}.arrow" for n in range(self.shards)]
        self._open: dict[int, TrlShard] = {}

    def shard(self, number: int) -> TrlShard:
        shard = TrlShard(self.tmp / self.files[number])
        self._open[number] = shard
        return shard

    @property
    def digests(self) -> dict[str, str]:
        """xxh3_128 of each file, hashed while written."""
        return {s.name: s.file.digest.hexdigest() for s in self._open.values()}

    def finish(self) -> dict:
        for number in range(self.shards):
            if number not in self._open:
                self.shard(number).close()
        state = {
            "_data_files": [{"filename": name} for name in self.files],
            "_fingerprint": self.fingerprint,
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        }
        info = {
            "citation": "",
            "description": "",
            "features": FEATURES,
            "homepage": "",
            "license": "",
        }
        for name, obj in (("state.json", state), ("dataset_info.json", info)):
            (self.tmp / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        return {}
