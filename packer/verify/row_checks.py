"""The row checks of one record batch: the `check_rows` kernel, and a failure per bad row.

What the kernel finds per row is kept (`RowStatus`): the provenance and source checks read the
segment lengths, and the attention rows are picked from the rows it found usable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.contract.shards import ShardArrays
from packer.verify import kernels as K
from packer.verify.result import CheckResult
from packer.verify.row_messages import row_message


@dataclass
class RowStatus:
    """Per-batch kernel output kept for the later checks (attention rows are picked from it)."""

    shard: ShardArrays
    code: np.ndarray
    seg_len: np.ndarray
    cp_sound: np.ndarray | None = None  # a CP shard's rows that keep the CP layout

    @property
    def cu_usable(self) -> np.ndarray:
        """Rows whose cu_seqlens can drive an attention kernel (0, increasing, row length)."""
        return ~np.isin(self.code, K.CU_CODES)


def check_shard_rows(
    shard: ShardArrays, max_len: int, pad: bool, pad_id: int, result: CheckResult
) -> RowStatus:
    """Run the row kernel over one record batch; a failure in `result` for each bad row."""
    rows = shard.rows
    code = np.zeros(rows, np.int64)
    a, b, c = (np.zeros(rows, np.int64) for _ in range(3))
    seg_len = np.zeros(shard.sample_index.size, np.int64)
    columns = (
        shard.ids_off,
        shard.ids,
        shard.lab_off,
        shard.labels,
        shard.pos_off,
        shard.pos,
        shard.cu_off,
        shard.cu,
        shard.si_off,
        shard.so_off,
        shard.num_loss,
    )
    K.check_rows(
        *map(K.frozen, columns),  # the argument types `K.load` loaded
        int(max_len),
        bool(pad),
        int(pad_id),
        seg_len,
        code,
        a,
        b,
        c,
    )
    for r in np.flatnonzero(code):
        r = int(r)
        result.fail(
            row_message(
                shard.name,
                shard.shard_row(r),
                shard.row(r),
                int(code[r]),
                int(a[r]),
                int(b[r]),
                int(c[r]),
                max_len,
                pad_id,
            )
        )
    return RowStatus(shard, code, seg_len)
