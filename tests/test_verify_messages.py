"""Every structure code's message, word for word: the line a user reads must name the place and
say what differs (the end-to-end tests in test_verify_cli/test_verify_faults plant the faults)."""

from __future__ import annotations

import numpy as np
import pytest

from packer.verify import kernels as K
from packer.verify.result import CheckResult, Failure, VerificationFailed, VerifyResult
from packer.verify.row_messages import row_message


def make_row(pos=(0, 1, 2, 0, 1, 2, 3, 0, 1, 2), cu=(0, 3, 7, 10), index=(11, 12, 13)):
    return {
        "input_ids": np.arange(10),
        "labels": np.arange(10),
        "position_ids": np.array(pos),
        "cu_seqlens": np.array(cu),
        "sample_index": np.array(index),
        "sample_offset": np.array([0, 0, 4][: len(index)]),
        "num_loss_tokens": 7,
    }


ROW_PLACE = "s.arrow row 2"
SEG = {
    0: "s.arrow row 2, sample 11 (segment 0, tokens 0..2)",
    1: "s.arrow row 2, sample 12 (segment 1, tokens 3..6)",
    2: "s.arrow row 2, sample 13 (piece at token 4) (segment 2, tokens 7..9)",
}

CASES = [
    # (code, a, b, c, place, text)
    (K.LENGTHS_DIFFER, 1, 10, 9, ROW_PLACE, "labels has 9 entries but input_ids has 10"),
    (K.LENGTHS_DIFFER, 2, 10, 11, ROW_PLACE, "position_ids has 11 entries but input_ids has 10"),
    (K.LENGTHS_DIFFER, 3, 3, 2, ROW_PLACE, "sample_offset has 2 entries but sample_index has 3"),
    (K.EMPTY_ROW, 0, 0, 0, ROW_PLACE, "the row is empty"),
    (K.OVER_MAX_LEN, 300, 0, 0, ROW_PLACE, "the row holds 300 tokens, more than max_len 256"),
    (
        K.PAD_LENGTH,
        10,
        0,
        0,
        ROW_PLACE,
        "the output is padded but the row holds 10 tokens, not max_len 256",
    ),
    (
        K.CU_START,
        1,
        4,
        0,
        ROW_PLACE,
        "cu_seqlens must start at 0 and have at least 2 entries, got first entry 1 of 4",
    ),
    (
        K.CU_NOT_INCREASING,
        2,
        3,
        3,
        ROW_PLACE,
        "cu_seqlens is not strictly increasing: entry 2 is 3 after 3 (an empty or backwards "
        "segment)",
    ),
    (K.CU_END, 9, 10, 0, ROW_PLACE, "cu_seqlens ends at 9 but the row holds 10 tokens"),
    (
        K.SEGMENT_COUNT,
        3,
        2,
        0,
        ROW_PLACE,
        "cu_seqlens has 3 segments but sample_index lists 2 samples (padding, when stored, is "
        "one extra final segment)",
    ),
    (
        K.FIRST_LABEL,
        3,
        1,
        55,
        SEG[1],
        "the first label is 55, expected -100: after the model's shift the last token of "
        "sample 11 would be trained to predict token 3 of another sample",
    ),
    (
        K.FIRST_LABEL,
        0,
        0,
        7,
        SEG[0],
        "the first label is 7, expected -100 (the first token of a sample is never a target)",
    ),
    (K.LOSS_COUNT, 5, 6, 0, ROW_PLACE, "num_loss_tokens is 5 but 6 labels are not -100"),
    (K.BAD_LABEL, 4, 1, -5, SEG[1], "label at token 4 is -5: negative and not -100"),
    (K.BAD_TOKEN, 8, 2, -2, SEG[2], "token 8 has the negative id -2"),
    (
        K.POS_WRONG,
        5,
        1,
        5,
        SEG[1],
        "position_ids[5] = 5, expected 2 (position 2 of its sample)",
    ),
]


@pytest.mark.parametrize(("code", "a", "b", "c", "place", "text"), CASES)
def test_row_message(code, a, b, c, place, text):
    failure = row_message("s.arrow", 2, make_row(), code, a, b, c, 256, 0)
    assert failure.message == f"{place}: {text}"
    assert (failure.shard, failure.row) == ("s.arrow", 2)
    if place == ROW_PLACE:
        assert failure.segment is None and failure.sample is None
    else:
        assert failure.segment == b and failure.sample == 11 + b
        assert failure.sample_offset == [0, 0, 4][b]


def test_padding_segment_messages():
    row = make_row(index=(11, 12))  # three segments, two samples: the last is padding
    for code, c, text in (
        (K.PAD_LABEL, 4, "padding token 8 has label 4, expected -100"),
        (K.PAD_TOKEN, 3, "padding token 8 is 3, expected the pad id 9"),
    ):
        failure = row_message("s.arrow", 2, row, code, 8, 2, c, 256, 9)
        assert failure.message == (
            f"s.arrow row 2, the padding segment (segment 2, tokens 7..9): {text}"
        )
        assert failure.segment == 2 and failure.sample is None and failure.sample_offset is None


def test_boundary_shifted_forward():
    """cu_seqlens says 7, positions restart at 6."""
    row = make_row(pos=(0, 1, 2, 0, 1, 2, 0, 1, 2, 3))
    failure = row_message("s.arrow", 2, row, K.POS_RESTART_INSIDE, 6, 1, 0, 256, 0)
    assert failure.message == (
        f"{SEG[1]}: cu_seqlens[2] = 7 but position_ids restart at token 6: the boundary is "
        "shifted by +1, so tokens of two samples attend to each other"
    )


def test_boundary_shifted_backward():
    """cu_seqlens says 7, positions restart at 8."""
    row = make_row(pos=(0, 1, 2, 0, 1, 2, 3, 4, 0, 1))
    failure = row_message("s.arrow", 2, row, K.POS_NO_RESTART, 7, 2, 4, 256, 0)
    assert failure.message == (
        f"{SEG[2]}: cu_seqlens[2] = 7 but position_ids restart at token 8: the boundary is "
        "shifted by -1, so tokens of two samples attend to each other"
    )


def test_boundary_merged():
    row = make_row(pos=(0, 1, 2, 0, 1, 2, 3, 0, 1, 2), cu=(0, 7, 10), index=(11, 12))
    failure = row_message("s.arrow", 2, row, K.POS_RESTART_INSIDE, 3, 0, 0, 256, 0)
    assert failure.message == (
        "s.arrow row 2, sample 11 (segment 0, tokens 0..6): position_ids restart at token 3 "
        "inside cu_seqlens segment 0..6 but cu_seqlens has no boundary there: two samples "
        "(samples 11 and 12) are merged into one attention segment"
    )
    # in the last segment there is no next sample to name
    row = make_row(pos=(0, 1, 2, 0, 1, 2, 3, 0, 1, 2), cu=(0, 3, 10), index=(11, 12))
    failure = row_message("s.arrow", 2, row, K.POS_RESTART_INSIDE, 7, 1, 0, 256, 0)
    assert failure.message == (
        "s.arrow row 2, sample 12 (segment 1, tokens 3..9): position_ids restart at token 7 "
        "inside cu_seqlens segment 3..9 but cu_seqlens has no boundary there: two samples "
        "are merged into one attention segment"
    )


def test_raise_for_failure_says_how_many_more():
    check = CheckResult("structure")
    for i in range(3):
        check.fail(Failure(f"problem {i}"))
    with pytest.raises(VerificationFailed) as info:
        VerifyResult("o", {"structure": check}).raise_for_failure()
    assert str(info.value) == "problem 0 (and 2 more)"
    assert info.value.exit_code == 1
    one = CheckResult("structure")
    one.fail(Failure("only"))
    with pytest.raises(VerificationFailed) as info:
        VerifyResult("o", {"structure": one}).raise_for_failure()
    assert str(info.value) == "only"
    counted = CheckResult("input", failure_count=1)  # counted past the listed failures
    with pytest.raises(VerificationFailed) as info:
        VerifyResult("o", {"input": counted}).raise_for_failure()
    assert str(info.value) == "a check failed"
    VerifyResult("o", {"structure": CheckResult("structure")}).raise_for_failure()
