"""The packed shard's schema: the columns every shard holds, with their Arrow types."""

from __future__ import annotations

import pyarrow as pa

SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("position_ids", pa.list_(pa.int32())),
        ("cu_seqlens", pa.list_(pa.int32())),
        ("sample_index", pa.list_(pa.int64())),
        ("sample_offset", pa.list_(pa.int32())),
        ("num_loss_tokens", pa.int32()),
    ]
)
CONTRACT_COLUMNS = tuple(SCHEMA.names)  # every row of every shard has them, in this order
LIST_COLUMNS = tuple(f.name for f in SCHEMA if pa.types.is_list(f.type))
# Columns that mark a table as packed rows: a sample dataset never has them together.
PACKED_MARKERS = frozenset({"cu_seqlens", "position_ids", "sample_index"})


def schema_problem(schema: pa.Schema) -> str | None:
    """What keeps this schema from the packed-shard contract, or None."""
    for field in SCHEMA:
        if field.name not in schema.names:
            return f"no '{field.name}' column"
        got = schema.field(field.name).type
        if got != field.type:
            return f"column '{field.name}' has type {got}, expected {field.type}"
    return None


# Mixtures (`pack --mix`, or a validation split): `sample_source`, per segment, is the index
# of its source in the manifest's `mixture.sources`; written only for those runs.
SOURCE_COLUMN = "sample_source"

# Preference pairs (`pack --pairs`): each pair is two adjacent segments of one row, prompt +
# chosen then prompt + rejected. Per segment, `pair_index` is the pair's input row (its global
# index, as `sample_index` is for samples) and `pair_side` says which completion it holds; a
# segment's `sample_index` is `2 * pair_index + pair_side`, unique as every sample's is.
PAIR_SIDES = ("chosen", "rejected")  # pair_side 0 and 1
PAIR_COLUMNS = ("pair_index", "pair_side")
PAIR_SCHEMA = SCHEMA.append(pa.field("pair_index", pa.list_(pa.int64()))).append(
    pa.field("pair_side", pa.list_(pa.int8()))
)

# Context parallelism (`pack --cp-size N`, N > 1): every segment is padded at its end to a
# multiple of 2N. `cu_seqlens` then holds the cumulative real lengths (Transformer Engine's
# `cu_seqlens_q`) and `cu_seqlens_padded` where each segment starts in the row
# (`cu_seqlens_q_padded`, the boundaries a varlen kernel without CP takes).
CP_COLUMNS = ("cu_seqlens_padded",)
CP_SCHEMA = SCHEMA.append(pa.field("cu_seqlens_padded", pa.list_(pa.int32())))
