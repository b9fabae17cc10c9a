"""Mixture planning: exact token shares, whole-epoch repeats, seeded subsets, validation splits."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from packer.errors import InputError, UsageError, flag_names
from packer.planning.mixture import closest_prefix, mix, seeded_permutation, split_validation

SETTINGS = settings(max_examples=80, deadline=None)


@pytest.fixture(scope="module")
def two_sources():
    """Long samples (A) with 4x the tokens of the short samples (B): different distributions."""
    rng = np.random.default_rng(7)
    short = np.clip(rng.lognormal(5.0, 0.6, 30_000), 1, 4096).astype(np.int64)
    long = np.clip(rng.lognormal(6.4, 0.5, 40_000), 1, 8192).astype(np.int64)
    # trim A so that it holds 4x B's tokens (to within one sample)
    long = long[: int(np.searchsorted(np.cumsum(long), 4 * short.sum())) + 1]
    assert abs(long.sum() / short.sum() - 4) < 0.01
    return long, short


def counts_of(indices: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(indices, minlength=n)


# --------------------------------------------------------------------------------------------
# The bar of issue 36, at the planning level


def test_fifty_fifty_by_tokens_uses_the_scarcer_source_whole(two_sources):
    long, short = two_sources
    m = mix([long, short], [0.5, 0.5], seed=11)
    a, b = m.sources
    assert abs(a.share - 0.5) <= 0.0005 and abs(b.share - 0.5) <= 0.0005  # 0.1% of 0.5
    # the scarcer source: every sample exactly once, nothing dropped or repeated
    assert (b.epochs, b.repeats, b.dropped, b.samples) == (1, 0, 0, short.size)
    assert (counts_of(b.indices, short.size) == 1).all()
    assert b.tokens == short.sum() == b.target
    # the larger one: a subset without repeats, about a quarter of it
    assert (a.epochs, a.repeats) == (0, 0)
    assert (counts_of(a.indices, long.size) <= 1).all()
    assert a.dropped == long.size - a.samples > 0
    assert abs(a.tokens - short.sum()) <= long.max() / 2
    assert m.tokens == a.tokens + b.tokens and m.samples == a.samples + b.samples


def test_twice_the_tokens_repeats_the_scarcer_source_in_whole_epochs(two_sources):
    long, short = two_sources
    # the default output's size is 2x B's tokens (B is used whole for half of it)
    m = mix([long, short], [1, 1], tokens=2 * 2 * int(short.sum()), seed=11)
    a, b = m.sources
    assert (b.epochs, b.repeats, b.dropped) == (2, 1, 0)
    assert (counts_of(b.indices, short.size) == 2).all()
    assert (counts_of(a.indices, long.size) <= 1).all() and a.epochs == 0
    assert abs(a.share - 0.5) <= 0.0005 and abs(b.share - 0.5) <= 0.0005
    # each whole epoch is a full pass before the next one starts
    first, second = b.indices[: short.size], b.indices[short.size :]
    assert sorted(first) == sorted(second) == list(range(short.size))


def test_an_epoch_and_a_part_repeats_whole_first_then_a_subset(two_sources):
    long, short = two_sources
    m = mix([long, short], [1, 1], tokens=int(2.5 * short.sum()), seed=3)
    b = m.sources[1]
    assert b.epochs == 1 and b.repeats == 0
    counts = counts_of(b.indices, short.size)
    assert set(np.unique(counts)) == {1, 2}
    assert abs(b.tokens - 1.25 * short.sum()) <= short.max() / 2
    assert sorted(b.indices[: short.size]) == list(range(short.size))


def test_validation_split_holds_out_five_percent_of_each_source(two_sources):
    long, short = two_sources
    split = split_validation([long, short], 0.05, seed=5)
    for lengths, train, held in zip((long, short), split.train, split.validation):
        assert held.size == round(0.05 * lengths.size)
        assert np.intersect1d(train, held).size == 0
        assert np.array_equal(np.sort(np.concatenate([train, held])), np.arange(lengths.size))
    # mixing the training part never reaches a held-out sample
    train_lengths = [x[t] for x, t in zip((long, short), split.train)]
    m = mix(train_lengths, [1, 1], seed=5)
    for source, train, held in zip(m.sources, split.train, split.validation):
        assert np.intersect1d(train[source.indices], held).size == 0
    assert m.sources[1].dropped == 0  # the scarcer source's training part, whole


def test_every_stretch_of_the_output_holds_the_weights(two_sources):
    long, short = two_sources
    m = mix([long, short], [0.3, 0.7], seed=2)
    source, index = m.interleaved()
    tokens = np.where(source == 0, long[index * (source == 0)], short[index * (source == 1)])
    for part in np.array_split(np.arange(source.size), 10):
        share = tokens[part][source[part] == 0].sum() / tokens[part].sum()
        assert abs(share - 0.3) < 0.02, share


def test_interleaved_lists_each_sources_indices_in_order(two_sources):
    long, short = two_sources
    m = mix([long, short], [2, 1], seed=4)
    source, index = m.interleaved()
    for s, mixed in enumerate(m.sources):
        assert np.array_equal(index[source == s], mixed.indices)
    assert np.bincount(source).tolist() == [s.samples for s in m.sources]


# --------------------------------------------------------------------------------------------
# Determinism and what a source's choice depends on


def test_same_inputs_and_seed_give_identical_arrays_and_another_seed_does_not(two_sources):
    long, short = two_sources
    one, two = (mix([long, short], [1, 3], seed=9) for _ in range(2))
    for x, y in zip(one.sources, two.sources):
        assert np.array_equal(x.indices, y.indices) and x.tokens == y.tokens
    assert np.array_equal(one.source_order, two.source_order)
    other = mix([long, short], [1, 3], seed=10)
    assert not np.array_equal(one.sources[0].indices, other.sources[0].indices)


def test_adding_a_source_keeps_the_others_choice_when_their_targets_stay(two_sources):
    long, short = two_sources
    third = np.arange(1, 5000, dtype=np.int64)
    before = mix([long, short], [1, 1], tokens=1_000_000, seed=1)
    after = mix([long, short, third], [1, 1, 2], tokens=2_000_000, seed=1)
    for x, y in zip(before.sources, after.sources[:2]):
        assert np.array_equal(x.indices, y.indices)


def test_a_larger_target_takes_a_superset(two_sources):
    long, short = two_sources
    small = mix([long, short], [1, 1], tokens=400_000, seed=6).sources[0].indices
    large = mix([long, short], [1, 1], tokens=900_000, seed=6).sources[0].indices
    assert np.isin(small, large).all() and large.size > small.size


def test_results_are_read_only(two_sources):
    m = mix(list(two_sources), [1, 1])
    with pytest.raises(ValueError):
        m.sources[0].indices[0] = 0
    with pytest.raises(ValueError):
        m.source_order[0] = 0
    split = split_validation(list(two_sources), 3)
    with pytest.raises(ValueError):
        split.train[0][0] = 0


# --------------------------------------------------------------------------------------------
# The subset choice against a plain-Python reference


def ref_closest_prefix(lengths: list[int], target: Fraction) -> int:
    """Try every prefix; the closest sum wins, a tie goes to the longer prefix."""
    best = min(range(len(lengths) + 1), key=lambda m: (abs(sum(lengths[:m]) - target), -m))
    return best


@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=30),
    st.fractions(min_value=0, max_value=1),
)
@SETTINGS
def test_closest_prefix_matches_the_reference(lengths, part):
    target = part * sum(lengths)
    got = closest_prefix(np.array(lengths, np.int64), target)
    assert got == ref_closest_prefix(lengths, target)


def test_closest_prefix_ties_keep_the_crossing_sample():
    assert closest_prefix(np.array([4, 4]), Fraction(6)) == 2  # 8 and 4 are both 2 away
    assert closest_prefix(np.array([4, 4]), Fraction(5)) == 1
    assert closest_prefix(np.array([4, 4]), Fraction(0)) == 0


@given(st.integers(0, 200), st.integers(0, 2**32))
@SETTINGS
def test_seeded_permutation_is_a_permutation(n, seed):
    perm = seeded_permutation(np.random.PCG64(seed), n)
    assert perm.dtype == np.int64 and sorted(perm.tolist()) == list(range(n))


# --------------------------------------------------------------------------------------------
# Properties over random mixtures


@st.composite
def mixtures(draw):
    n_sources = draw(st.integers(1, 4))
    lengths = [
        np.array(draw(st.lists(st.integers(1, 300), min_size=1, max_size=40)), np.int64)
        for _ in range(n_sources)
    ]
    weights = draw(st.lists(st.floats(0.05, 20), min_size=n_sources, max_size=n_sources))
    tokens = draw(st.none() | st.integers(1, 60_000))
    return lengths, weights, tokens, draw(st.integers(0, 2**40))


def planned(lengths, weights, tokens, seed):
    try:
        return mix(lengths, weights, tokens=tokens, seed=seed)
    except UsageError as exc:  # a target below one sample, or nothing chosen: checked
        if "gives an empty mixture" in str(exc):
            assert tokens is not None and tokens < 2 * max(int(x.max()) for x in lengths)
            assume(False)
        whole = sum(Fraction(w) for w in weights)
        if tokens is None:
            size = min(
                Fraction(int(x.sum())) * whole / Fraction(w) for x, w in zip(lengths, weights)
            )
        else:
            size = Fraction(tokens)
        short = [int(x.min()) for x in lengths]
        assert any(size * Fraction(w) / whole < m for m, w in zip(short, weights)), exc
        assume(False)


@given(mixtures())
@SETTINGS
def test_tokens_are_within_half_a_sample_of_each_target(case):
    lengths, weights, tokens, seed = case
    m = planned(lengths, weights, tokens, seed)
    whole = math.fsum(weights)
    for x, w, s in zip(lengths, weights, m.sources):
        assert s.tokens == x[s.indices].sum()
        assert abs(s.tokens - s.target) <= x.max() / 2 + 1e-6 * s.target
        assert math.isclose(s.weight, w / whole)
        assert math.isclose(s.share, s.tokens / m.tokens)
    if tokens is not None:
        assert abs(m.tokens - tokens) <= sum(x.max() for x in lengths) / 2 + 1


@given(mixtures())
@SETTINGS
def test_indices_epochs_and_drops_are_counted_right(case):
    lengths, weights, tokens, seed = case
    m = planned(lengths, weights, tokens, seed)
    for x, s in zip(lengths, m.sources):
        assert s.indices.dtype == np.int64 and s.samples == s.indices.size
        assert ((s.indices >= 0) & (s.indices < x.size)).all()
        counts = counts_of(s.indices, x.size)
        assert set(np.unique(counts)) <= {s.epochs, s.epochs + 1}
        total = int(x.sum())
        assert s.epochs * total <= s.target * (1 + 1e-12) < (s.epochs + 1) * total
        assert s.dropped == int((counts == 0).sum())
        assert s.repeats == max(s.epochs - 1, 0)
    assert np.bincount(m.source_order, minlength=len(lengths)).tolist() == [
        s.samples for s in m.sources
    ]
    source, index = m.interleaved()
    for i, s in enumerate(m.sources):
        assert np.array_equal(index[source == i], s.indices)
    if tokens is None:  # by default nothing is repeated and the scarcest is used whole
        assert all(s.epochs <= 1 for s in m.sources)
        assert any(s.epochs == 1 and s.dropped == 0 for s in m.sources)


@given(mixtures())
@SETTINGS
def test_the_same_case_plans_identically(case):
    lengths, weights, tokens, seed = case
    one = planned(lengths, weights, tokens, seed)
    two = mix([x.copy() for x in lengths], list(weights), tokens=tokens, seed=seed)
    for x, y in zip(one.sources, two.sources):
        assert np.array_equal(x.indices, y.indices) and x.tokens == y.tokens
    assert np.array_equal(one.source_order, two.source_order)


def round_half_up(x: float) -> int:
    return math.floor(Fraction(x) + Fraction(1, 2))


@given(
    st.lists(st.integers(2, 300), min_size=1, max_size=5),
    st.floats(0.01, 0.99) | st.integers(1, 3),
    st.integers(0, 2**40),
)
@SETTINGS
def test_validation_splits_are_disjoint_and_complete(sizes, split, seed):
    lengths = [np.full(n, 3, np.int64) for n in sizes]
    assume(all(isinstance(split, float) or split < n for n in sizes))
    try:
        result = split_validation(lengths, split, seed=seed)
    except UsageError:
        assert isinstance(split, float) and any(round_half_up(split * n) >= n for n in sizes)
        return
    for n, train, held in zip(sizes, result.train, result.validation):
        assert np.intersect1d(train, held).size == 0
        assert np.array_equal(np.union1d(train, held), np.arange(n))
        expected = split if isinstance(split, int) else max(1, round_half_up(split * n))
        assert held.size == expected and train.size > 0
    again = split_validation(lengths, split, seed=seed)
    assert all(np.array_equal(x, y) for x, y in zip(result.validation, again.validation))


# --------------------------------------------------------------------------------------------
# Refusals: one line naming the parameter


@pytest.mark.parametrize(
    ("weights", "words"),
    [
        ([1, 0], "weights[1] must be a finite number above 0, got 0"),
        ([1, -2.0], "weights[1] must be a finite number above 0"),
        ([float("nan"), 1], "weights[0] must be a finite number above 0, got nan"),
        ([float("inf"), 1], "weights[0] must be a finite number above 0, got inf"),
        ([1e308, 1e308], "weights must sum to a finite number above 0"),
        ([1], "weights has 1 entries for 2 sources"),
        ([1, "a"], "weights[1] must be a number"),
        ([True, 1], "weights[0] must be a number"),
        ("11", "weights must be a list of numbers"),
    ],
)
def test_bad_weights_are_refused_in_one_line(weights, words):
    with pytest.raises(UsageError) as info:
        mix([np.array([5, 6]), np.array([7])], weights)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_bad_sources_are_refused_naming_the_source():
    with pytest.raises(InputError, match=r"^source 1 has no samples \(lengths\[1\] is empty\)$"):
        mix([np.array([5]), np.array([], np.int64)], [1, 1])
    with pytest.raises(InputError, match="source 0: sample 1 has length 0"):
        mix([np.array([5, 0])], [1])
    with pytest.raises(UsageError, match=r"lengths\[0\] must be a 1-d array of integers"):
        mix([np.array([1.5])], [1])
    with pytest.raises(UsageError, match=r"lengths\[1\] must be a 1-d array of integers"):
        mix([np.array([1]), [[1, 2], [3]]], [1, 1])
    with pytest.raises(UsageError, match="lengths must be a non-empty list"):
        mix([], [])


def test_too_few_tokens_are_refused_with_the_least_that_works():
    lengths = [np.array([100, 200]), np.array([10, 20])]
    with pytest.raises(UsageError) as info:
        mix(lengths, [1, 1], tokens=150)
    message = str(info.value)
    assert message.startswith("tokens 150 gives source 0 75.0 tokens") and "at least 200" in message
    assert mix(lengths, [1, 1], tokens=200).sources[0].samples == 1
    with flag_names(), pytest.raises(UsageError, match="^--mix-tokens 150 gives"):
        mix(lengths, [1, 1], tokens=150)
    with pytest.raises(UsageError, match="^tokens 1 gives an empty mixture: every source's"):
        mix([np.array([3, 1])], [1], tokens=1, seed=0)  # seed 0 draws the 3 first
    with pytest.raises(UsageError, match="tokens must be at least 1, got 0"):
        mix(lengths, [1, 1], tokens=0)
    with pytest.raises(UsageError, match="tokens must be an integer, got 1.5"):
        mix(lengths, [1, 1], tokens=1.5)
    with pytest.raises(UsageError, match="seed must be at least 0, got -1"):
        mix(lengths, [1, 1], seed=-1)


def test_a_weight_too_small_for_one_sample_is_refused():
    with pytest.raises(UsageError, match=r"^weights\[1\] 0.001 gives source 1 0.3 tokens"):
        mix([np.array([100, 200]), np.array([50, 60])], [0.999, 0.001])


@pytest.mark.parametrize(
    ("split", "words"),
    [
        (0, "validation_split must be a count of at least 1, got 0"),
        (-3, "validation_split must be a count of at least 1, got -3"),
        (0.0, "validation_split must be a fraction in (0, 1) or a whole count, got 0.0"),
        (1.0, "validation_split must be a fraction in (0, 1) or a whole count, got 1.0"),
        (1.5, "validation_split must be a fraction in (0, 1) or a whole count, got 1.5"),
        (float("nan"), "validation_split must be a fraction in (0, 1)"),
        (True, "validation_split must be a fraction in (0, 1) or a count, got True"),
        ("5%", "validation_split must be a fraction in (0, 1) or a count, got '5%'"),
        (4, "validation_split 4 holds out 4 of source 1's 4 samples, leaving none to train on"),
        (0.9, "validation_split 0.9 holds out 4 of source 1's 4 samples"),
    ],
)
def test_bad_validation_splits_are_refused_in_one_line(split, words):
    with pytest.raises(UsageError) as info:
        split_validation([np.arange(1, 100), np.array([1, 2, 3, 4])], split)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_count_holds_out_that_many_of_every_source():
    split = split_validation([np.arange(1, 100), np.array([1, 2, 3, 4])], np.int64(3), seed=2)
    assert [x.size for x in split.validation] == [3, 3]
    assert Counter(x.size for x in split.train) == Counter([96, 1])


def test_numpy_numbers_and_narrow_lengths_plan_as_python_ones():
    lengths = [np.array([5, 9, 2, 7], np.int32), np.array([3, 3, 4], np.uint16)]
    ref = mix([x.astype(np.int64) for x in lengths], [2, 1], tokens=20, seed=3)
    for weights in ([np.int64(2), np.int64(1)], np.array([2.0, 1.0], np.float32)):
        got = mix(lengths, weights, tokens=np.int64(20), seed=np.uint8(3))
        for x, y in zip(ref.sources, got.sources):
            assert np.array_equal(x.indices, y.indices) and x.tokens == y.tokens
    split = split_validation(lengths, np.float32(0.5), seed=1)
    assert [v.size for v in split.validation] == [2, 2]


def test_the_choice_is_pinned_across_numpy_versions():
    """PCG64's raw stream and SeedSequence are fixed by their algorithms, so these arrays
    must never change; a change here changes every user's mixture for the same seed."""
    m = mix([np.array([5, 9, 2, 7, 3, 8]), np.array([4, 4, 6, 1])], [2, 1], tokens=40, seed=7)
    assert [s.indices.tolist() for s in m.sources] == [[3, 1, 4, 5], [3, 2, 1, 0]]
    assert m.source_order.tolist() == [1, 0, 0, 1, 0, 1, 0, 1]
    assert [s.tokens for s in m.sources] == [27, 15]
    assert m.sources[1].report() == {
        "weight": 1 / 3,
        "target": 40 / 3,
        "tokens": 15,
        "samples": 4,
        "epochs": 0,
        "repeats": 0,
        "dropped": 0,
        "share": 15 / 42,
    }
    split = split_validation([np.arange(1, 11)], 3, seed=8)
    assert split.validation[0].tolist() == [0, 5, 9]


def test_seeded_permutations_are_uniform():
    """Over 3,000 seeds each of 5 items leads a permutation about equally often (chi-square
    with 4 degrees of freedom, p about 1e-4 at 23.5)."""
    first = [int(seeded_permutation(np.random.PCG64(s), 5)[0]) for s in range(3000)]
    counts = np.bincount(first, minlength=5)
    assert ((counts - 600) ** 2 / 600).sum() < 23.5, counts
