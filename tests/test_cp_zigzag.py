"""The zigzag split of a CP row (planning.cp.zigzag_index) against a plain Python reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.planning.cp import zigzag_index


def reference(cu, rank, size):
    out = []
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        chunk = (b - a) // (2 * size)
        for c in (rank, 2 * size - 1 - rank):
            out.extend(range(a + c * chunk, a + (c + 1) * chunk))
    return out


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 8),
    chunks=st.lists(st.integers(0, 5), min_size=0, max_size=6),
    data=st.data(),
)
def test_matches_the_reference_and_ranks_cover_the_row_once(size, chunks, data):
    cu = np.concatenate([[0], np.cumsum([c * 2 * size for c in chunks])]).astype(np.int64)
    rank = data.draw(st.integers(0, size - 1))
    assert zigzag_index(cu, rank, size).tolist() == reference(cu.tolist(), rank, size)
    every = np.concatenate([zigzag_index(cu, r, size) for r in range(size)])
    assert sorted(every.tolist()) == list(range(int(cu[-1])))


def test_three_samples_at_cp_size_2():
    # segments of 8, 4 and 4 tokens: chunks of 2, 1, 1
    cu = np.array([0, 8, 12, 16])
    assert zigzag_index(cu, 0, 2).tolist() == [0, 1, 6, 7, 8, 11, 12, 15]
    assert zigzag_index(cu, 1, 2).tolist() == [2, 3, 4, 5, 9, 10, 13, 14]


def test_refuses_a_length_that_does_not_split():
    with pytest.raises(ValueError, match="segment 1 has length 6"):
        zigzag_index(np.array([0, 8, 14]), 0, 2)
    with pytest.raises(ValueError, match="cp_rank"):
        zigzag_index(np.array([0, 8]), 2, 2)
