"""Every strategy against a plain-Python reference, and the invariants every plan must keep."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.errors import UsageError
from packer.planning import kernels as algorithms
from packer.planning.strategies import (
    STRATEGIES,
    best_bound,
    lower_bound,
    martello_toth_bound,
    plan,
)

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def lengths_and_l(draw, max_n: int = 60):
    max_len = draw(st.integers(1, 40))
    lengths = draw(st.lists(st.integers(1, max_len), max_size=max_n))
    return np.array(lengths, np.int64), max_len


# --------------------------------------------------------------------------------------------
# Plain-Python references: one sample at a time, O(N x rows)


def ref_pack(lengths, max_len, rule, visit=None):
    """Rows (lists of sample indices) under a fit rule: 'best', 'first', 'worst' or 'next'."""
    if visit is None:
        visit = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    free, rows = [], []
    for i in visit:
        v = int(lengths[i])
        fits = [r for r in range(len(free)) if free[r] >= v]
        if rule == "next":
            fits = [len(free) - 1] if free and free[-1] >= v else []
        elif rule == "best":
            fits.sort(key=lambda r: free[r])
        elif rule == "worst":
            fits.sort(key=lambda r: -free[r])
        if not fits:
            free.append(max_len)
            rows.append([])
        r = fits[0] if fits else len(free) - 1
        free[r] -= v
        rows[r].append(i)
    return rows


def ref_l2(lengths, max_len):
    """Martello–Toth L2, straight from its definition."""
    best = 0
    for a in range(0, max_len // 2 + 1):
        j1 = [v for v in lengths if v > max_len - a]
        j2 = [v for v in lengths if max_len / 2 < v <= max_len - a]
        j3 = [v for v in lengths if a <= v <= max_len / 2]
        spill = sum(j3) - (len(j2) * max_len - sum(j2))
        best = max(best, len(j1) + len(j2) + max(0, -(-spill // max_len)))
    return best


def check_plan(p, lengths, max_len):
    """Each sample in exactly one row, no row over L, no empty row."""
    assert sorted(p.order.tolist()) == list(range(len(lengths)))
    assert p.row_starts[0] == 0 and p.row_starts[-1] == len(lengths)
    sizes = np.diff(p.row_starts)
    assert (sizes > 0).all()
    for r in range(p.num_rows):
        assert lengths[p.row(r)].sum() <= max_len


def fills(rows_or_plan, lengths):
    if isinstance(rows_or_plan, list):
        return sorted(int(lengths[r].sum()) for r in rows_or_plan)
    p = rows_or_plan
    return sorted(int(lengths[p.row(r)].sum()) for r in range(p.num_rows))


# --------------------------------------------------------------------------------------------


@SETTINGS
@given(lengths_and_l())
def test_bfd_matches_one_at_a_time_best_fit(case):
    lengths, max_len = case
    p = plan(lengths, max_len, "bfd")
    check_plan(p, lengths, max_len)
    ref = ref_pack(lengths, max_len, "best")
    # rows of equal free space are interchangeable, so row fills match exactly
    assert p.num_rows == len(ref)
    assert fills(p, lengths) == fills(ref, lengths)


@SETTINGS
@given(lengths_and_l())
def test_ffd_is_first_fit_decreasing_row_for_row(case):
    lengths, max_len = case
    p = plan(lengths, max_len, "ffd")
    check_plan(p, lengths, max_len)
    ref = ref_pack(lengths, max_len, "first")
    assert [sorted(p.row(r).tolist()) for r in range(p.num_rows)] == [sorted(r) for r in ref]


@SETTINGS
@given(lengths_and_l())
def test_histogram_matches_one_at_a_time_worst_fit(case):
    lengths, max_len = case
    p = plan(lengths, max_len, "histogram")
    check_plan(p, lengths, max_len)
    ref = ref_pack(lengths, max_len, "worst")
    assert p.num_rows == len(ref)
    assert fills(p, lengths) == fills(ref, lengths)


@SETTINGS
@given(lengths_and_l())
def test_nf_is_next_fit_in_input_order(case):
    lengths, max_len = case
    p = plan(lengths, max_len, "nf")
    check_plan(p, lengths, max_len)
    assert p.order.tolist() == list(range(len(lengths)))
    ref = ref_pack(lengths, max_len, "next", visit=range(len(lengths)))
    assert [p.row(r).tolist() for r in range(p.num_rows)] == ref


@SETTINGS
@given(lengths_and_l(), st.integers(0, 3))
def test_ff_shuffle_is_first_fit_over_the_seeded_order(case, seed):
    lengths, max_len = case
    p = plan(lengths, max_len, "ff-shuffle", seed=seed)
    check_plan(p, lengths, max_len)
    visit = np.random.default_rng(seed).permutation(len(lengths))
    ref = ref_pack(lengths, max_len, "first", visit=visit)
    assert [p.row(r).tolist() for r in range(p.num_rows)] == [sorted(r) for r in ref]
    assert np.array_equal(plan(lengths, max_len, "ff-shuffle", seed=seed).order, p.order)


@SETTINGS
@given(lengths_and_l(max_n=40), st.sampled_from(STRATEGIES), st.integers(1, 12))
def test_windows_pack_each_window_alone(case, strategy, window):
    lengths, max_len = case
    p = plan(lengths, max_len, strategy, window=window)
    check_plan(p, lengths, max_len)
    # no row crosses a window boundary, and each window is planned as if alone
    for r in range(p.num_rows):
        assert len({int(i) // window for i in p.row(r)}) == 1
    if strategy != "ff-shuffle":  # (its windows draw their own seeded orders)
        expected = sum(
            plan(lengths[a : a + window], max_len, strategy).num_rows
            for a in range(0, len(lengths), window)
        )
        assert p.num_rows == expected


@SETTINGS
@given(lengths_and_l(max_n=30))
def test_bounds_are_lower_bounds_and_l2_matches_its_definition(case):
    lengths, max_len = case
    counts, bad = algorithms.length_histogram(lengths, max_len)
    assert bad == -1
    assert martello_toth_bound(counts, max_len) == ref_l2(lengths.tolist(), max_len)
    bound = best_bound(lengths, max_len)
    assert bound >= lower_bound(int(lengths.sum()), max_len)
    assert bound >= int((2 * lengths > max_len).sum())
    for strategy in STRATEGIES:
        assert plan(lengths, max_len, strategy).num_rows >= bound


def test_l2_beats_the_token_bound_when_long_samples_cannot_share():
    lengths = np.array([60] * 10 + [10] * 4)  # L=100: 10 rows needed, tokens say 7
    assert lower_bound(lengths.sum(), 100) == 7
    assert best_bound(lengths, 100) == 10
    assert plan(lengths, 100).num_rows == 10


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_int32_lengths_and_determinism(strategy):
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, 20_000).round(), 1, 2048).astype(np.int32)
    a = plan(lengths, 2048, strategy)
    b = plan(lengths.astype(np.int64), 2048, strategy)
    check_plan(a, lengths, 2048)
    assert np.array_equal(a.order, b.order) and np.array_equal(a.row_starts, b.row_starts)


def test_bfd_is_near_optimal_on_lognormal_lengths():
    rng = np.random.default_rng(0)
    for max_len in (2048, 8192):
        lengths = np.clip(rng.lognormal(np.log(300), 1.0, 200_000).round(), 1, max_len)
        rows = plan(lengths.astype(np.int64), max_len).num_rows
        assert rows <= 1.001 * best_bound(lengths.astype(np.int64), max_len)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bad_input_is_a_usage_error(strategy):
    with pytest.raises(UsageError, match="sample 1 has length 9"):
        plan([3, 9], 8, strategy)
    with pytest.raises(UsageError, match="sample 0 has length 0"):
        plan([0], 8, strategy)
    with pytest.raises(UsageError, match="integers"):
        plan([1.5], 8, strategy)
    assert plan([], 8, strategy).num_rows == 0


def test_bad_options_are_usage_errors():
    with pytest.raises(UsageError, match="unknown strategy"):
        plan([1], 8, "best")
    with pytest.raises(UsageError, match="^window must be at least 1"):
        plan([1], 8, window=0)
    with pytest.raises(UsageError, match="^max_len must be at least 1, got 0$"):
        plan([1], 0)
    with pytest.raises(UsageError, match="^max_len must be an integer, got '8'$"):
        plan([1], "8")
    with pytest.raises(UsageError, match="^seed must be at least 0, got -1$"):
        plan([1], 8, seed=-1)
    with pytest.raises(UsageError, match="^lengths must be a 1-d array of integers"):
        plan([[1], [2, 3]], 8)
    assert plan([1], np.int64(8)).num_rows == 1


@pytest.mark.parametrize(
    "kernel, bucketed",
    [
        (algorithms._best_fit, True),
        (algorithms._worst_fit, True),
        (algorithms._first_fit, False),
    ],
)
def test_a_full_events_table_is_regrown_and_rerun(kernel, bucketed):
    rng = np.random.default_rng(3)
    lengths = np.clip(rng.lognormal(np.log(40), 1.0, 5_000).round(), 1, 256).astype(np.int64)
    counts, _ = algorithms.length_histogram(lengths, 256)
    roomy = algorithms._decreasing(kernel, counts, 256, bucketed)
    tight = algorithms._decreasing(kernel, counts, 256, bucketed, events_size=1)
    n_events = int(roomy[4].max())
    assert n_events > 2  # so the tight run had to regrow several times
    assert roomy[1] == tight[1] and roomy[5] == tight[5]
    assert np.array_equal(roomy[0][: roomy[1], :4], tight[0][: tight[1], :4])
    assert np.array_equal(roomy[2][:n_events], tight[2][:n_events])
    assert np.array_equal(roomy[3], tight[3]) and np.array_equal(roomy[4], tight[4])
