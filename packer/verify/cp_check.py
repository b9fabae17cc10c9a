"""The `cp` check of verify: a CP output's size against `--cp-size`, or whether an output packed
without CP can be split for a given size (every segment and row a multiple of 2N)."""

from __future__ import annotations

from packer.verify.cp_rows import splittable
from packer.verify.result import CheckResult, Failure
from packer.verify.row_checks import RowStatus


def check_cp_split(
    statuses: list[RowStatus], packed_cp: int, cp_size: int | None, result: CheckResult
) -> None:
    """Fill `result`: on a CP output (its layout is checked with the structure) the size asked
    must divide the one packed with; on another output every row must split for `cp_size`."""
    rows = sum(st.shard.rows for st in statuses)
    size = cp_size or packed_cp
    result.details.update({"cp_size": size, "packed_cp_size": packed_cp, "rows": rows})
    if packed_cp > 1:
        if cp_size is not None and packed_cp % cp_size:
            result.fail(
                Failure(
                    f"the output was packed with cp_size {packed_cp}: its samples are padded to "
                    f"multiples of {2 * packed_cp}, which {2 * cp_size} does not divide"
                )
            )
        result.details["splits"] = "packed for it"
        return
    for st in statuses:
        splittable(st.shard, size, st.cu_usable, result)
    result.details["splits"] = "every row" if result.ok else "not every row"
