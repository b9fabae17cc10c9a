"""Reasons: what makes a sample invalid, as the readers, `rejects.jsonl` and the manifest name it.

Token ids must fit int32 and be non-negative; labels may also be `IGNORE_INDEX` (-100).
"""

from __future__ import annotations

import numpy as np

INT32_MAX = np.iinfo(np.int32).max

# Why a sample can be rejected. Code i + 1 in the readers' per-row uint8 arrays is REASONS[i];
# 0 means valid. These names appear in rejects.jsonl and in the manifest's stats.
REASONS = (
    "malformed_json",  # not JSON, not UTF-8, not an object, or a line arrow cannot parse
    "not_integer_list",  # input_ids / labels is not a list of integers (string, float, null...)
    "missing_input_ids",  # the token column is absent or null in this sample
    "empty",  # the token list is []
    "negative_id",  # a negative token id, or a negative label other than -100
    "id_out_of_range",  # an id that does not fit int32
    "missing_labels",  # no labels in this sample, though other samples of the file have them
    "labels_length",  # labels and input_ids differ in length
    "missing_side",  # a preference pair without its prompt, chosen or rejected column
)
REASON_CODE = {name: i + 1 for i, name in enumerate(REASONS)}
