"""Read a packed shard as flat numpy arrays: what verify, repack and inspect check and read back.

Shards are read through a memory map, one record batch at a time: every list column is kept as
Arrow's own `offsets` + `values` of that batch (no copy), so the numba checks run over whole
batches without per-row Python objects and reading a large output needs little memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.contract.schema import SCHEMA, schema_problem


@dataclass
class ShardArrays:
    """One record batch of a shard; list column X is `X[X_off[r]:X_off[r + 1]]` for row r.

    Rows are numbered from 0 within the batch; `first_row + r` is the row in the shard file.
    """

    name: str
    rows: int
    ids_off: np.ndarray
    ids: np.ndarray
    lab_off: np.ndarray
    labels: np.ndarray
    pos_off: np.ndarray
    pos: np.ndarray
    cu_off: np.ndarray
    cu: np.ndarray
    si_off: np.ndarray
    sample_index: np.ndarray
    so_off: np.ndarray
    sample_offset: np.ndarray
    num_loss: np.ndarray
    first_row: int = 0
    # A CP shard (`pack --cp-size`): `cu` above holds `cu_seqlens_padded` (the boundaries in the
    # row, which every row check needs) and these the `cu_seqlens` column (cumulative real
    # lengths). None for other shards.
    cu_real_off: np.ndarray | None = None
    cu_real: np.ndarray | None = None

    def shard_row(self, r: int) -> int:
        """The row's number in its shard file, as messages give it."""
        return self.first_row + r

    def row_slice(self, r: int) -> slice:
        return slice(int(self.ids_off[r]), int(self.ids_off[r + 1]))

    def rows_slice(self, lo: int, hi: int) -> ShardArrays:
        """Rows lo..hi-1 as a batch of their own (views of the same memory, offsets from 0), so
        a consumer that must bound its working memory can take a record batch in parts."""

        def part(off: np.ndarray | None, values: np.ndarray | None):
            if off is None:
                return None, None
            a, b = int(off[lo]), int(off[hi])
            return off[lo : hi + 1] - off[lo], values[a:b]

        cu_real_off, cu_real = part(self.cu_real_off, self.cu_real)
        return ShardArrays(
            self.name,
            hi - lo,
            *part(self.ids_off, self.ids),
            *part(self.lab_off, self.labels),
            *part(self.pos_off, self.pos),
            *part(self.cu_off, self.cu),
            *part(self.si_off, self.sample_index),
            *part(self.so_off, self.sample_offset),
            self.num_loss[lo:hi],
            self.first_row + lo,
            cu_real_off,
            cu_real,
        )

    def row(self, r: int) -> dict:
        """Row r as numpy arrays (views), for the per-row checks and messages."""
        t = self.row_slice(r)
        return {
            "input_ids": self.ids[t],
            "labels": self.labels[int(self.lab_off[r]) : int(self.lab_off[r + 1])],
            "position_ids": self.pos[int(self.pos_off[r]) : int(self.pos_off[r + 1])],
            "cu_seqlens": self.cu[int(self.cu_off[r]) : int(self.cu_off[r + 1])],
            "sample_index": self.sample_index[int(self.si_off[r]) : int(self.si_off[r + 1])],
            "sample_offset": self.sample_offset[int(self.so_off[r]) : int(self.so_off[r + 1])],
            "num_loss_tokens": int(self.num_loss[r]),
        }


def _list_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    return _numpy(column.offsets), _numpy(column.values)


def _numpy(array: pa.Array) -> np.ndarray:
    """A numpy array of a shard column: a zero-copy view of integers without nulls."""
    if array.null_count or not pa.types.is_integer(array.type):
        return array.to_numpy(zero_copy_only=False)
    return numpy_view(array)


def numpy_view(array: pa.Array) -> np.ndarray:
    """Zero-copy numpy view of an Arrow array without nulls.

    Integers are viewed through their data buffer: `Array.to_numpy` goes through Arrow's
    pandas conversion, which imports pandas (half a second) the first time.
    """
    if not pa.types.is_integer(array.type):
        return array.to_numpy()
    kind = "i" if pa.types.is_signed_integer(array.type) else "u"
    dtype = np.dtype(f"{kind}{array.type.bit_width // 8}")
    if len(array) == 0:
        return np.zeros(0, dtype)
    return np.frombuffer(
        array.buffers()[1], dtype, count=len(array), offset=array.offset * dtype.itemsize
    )


def read_shard(path: Path) -> list[ShardArrays]:
    """The record batches of one Arrow IPC stream shard, as zero-copy arrays of the mapped file.

    Raises ValueError with a one-line reason. A shard without batches gives one empty batch.
    """
    source = pa.memory_map(str(path))
    try:
        reader = pa.ipc.open_stream(source)
        batches = list(reader)
    except pa.ArrowInvalid as exc:
        raise ValueError(f"not an Arrow IPC stream ({exc})") from None
    if not batches:
        return [arrays_from_table(reader.schema.empty_table(), path.name)]
    out, first = [], 0
    for batch in batches:
        out.append(arrays_from_table(pa.Table.from_batches([batch]), path.name, first))
        first += batch.num_rows
    return out


def arrays_from_table(table: pa.Table, name: str, first_row: int = 0) -> ShardArrays:
    """The flat arrays of a shard table (zero-copy when it is one batch); raises ValueError
    when it breaks the schema."""
    problem = schema_problem(table.schema)
    if problem:
        raise ValueError(problem)
    # one chunk is used as it is: combine_chunks would copy even a single chunk
    cols = {
        c: col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        for c, col in zip(table.column_names, table.columns)
    }
    if table.num_rows == 0:
        cols = {c: pa.nulls(0, SCHEMA.field(c).type) for c in SCHEMA.names}
    for column in SCHEMA.names:
        if cols[column].null_count:
            raise ValueError(f"column '{column}' holds nulls")
    ids_off, ids = _list_parts(cols["input_ids"])
    lab_off, labels = _list_parts(cols["labels"])
    pos_off, pos = _list_parts(cols["position_ids"])
    cu_off, cu = _list_parts(cols["cu_seqlens"])
    cu_real_off = cu_real = None
    if "cu_seqlens_padded" in cols:  # a CP shard: the row's boundaries are the padded ones
        cu_real_off, cu_real = cu_off, cu
        cu_off, cu = _list_parts(cols["cu_seqlens_padded"])
    si_off, sample_index = _list_parts(cols["sample_index"])
    so_off, sample_offset = _list_parts(cols["sample_offset"])
    num_loss = _numpy(cols["num_loss_tokens"])
    return ShardArrays(
        name,
        table.num_rows,
        ids_off,
        ids,
        lab_off,
        labels,
        pos_off,
        pos,
        cu_off,
        cu,
        si_off,
        sample_index,
        so_off,
        sample_offset,
        num_loss,
        first_row,
        cu_real_off,
        cu_real,
    )
