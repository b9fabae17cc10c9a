"""Mixtures by tokens: which samples of each source go into the output, and how often.

A weight is a share of the output's tokens. Each source gets a token target; a target above the
source's size takes whole epochs first (every sample once per epoch), and what remains of the
target is met by a seeded subset: a seeded permutation of the source, cut where its running token
count is closest to the remainder. So every source's tokens are within half of one of its
samples of its target. Without `tokens` the output is as large as the scarcest source allows
(relative to its weight): that source is used whole, once, and no source is repeated.

Randomness is per source: source i draws from PCG64 seeded by (seed, purpose, i), and only
through the generator's raw 64-bit stream (fixed by the PCG64 algorithm, not by numpy's
sampling methods), so a source's choice depends only on the seed, its index, its lengths and its
target, and a larger target within the same epochs takes a superset of the samples.

`split_validation` holds out samples of each source before mixing, disjoint by construction.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from packer import arguments as A
from packer.errors import InputError, UsageError, option

_MIX, _ORDER, _SPLIT = 0, 1, 2  # purposes: separate random streams per use and per source


@dataclass(frozen=True, eq=False)  # arrays: compare them with numpy
class MixedSource:
    """What one source gives the output. `indices` (read-only int64) index the source's
    samples in the order they are used: `epochs` seeded permutations of all of them, then the
    seeded subset of the remainder."""

    weight: float  # the normalised weight: the share of the output's tokens asked for
    target: float  # tokens asked for (weight x the output's tokens)
    indices: np.ndarray
    epochs: int  # whole passes over the source: 0 subsampled, 1 used whole once
    tokens: int
    samples: int  # samples used, repeats counted
    dropped: int  # samples of the source never used
    share: float  # achieved share of the output's tokens

    @property
    def repeats(self) -> int:
        """Whole passes beyond the first: 0 unless the source is repeated."""
        return max(self.epochs - 1, 0)

    def report(self) -> dict:
        """Plain numbers for a manifest or a JSON report (no arrays)."""
        fields = ("weight", "target", "tokens", "samples", "epochs", "repeats", "dropped")
        return {name: getattr(self, name) for name in fields} | {"share": self.share}


@dataclass(frozen=True, eq=False)  # arrays: compare them with numpy
class Mixture:
    """The plan of a mixture. `source_order` (read-only int32, one entry per output sample)
    says which source gives the next sample; the k-th entry naming source s takes
    `sources[s].indices[k']`, k' counting that source's earlier entries. The order spreads
    every source evenly over the output by tokens, so any long stretch of it holds about the
    weights' shares."""

    sources: tuple[MixedSource, ...]
    source_order: np.ndarray
    seed: int

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.sources)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.sources)

    def interleaved(self) -> tuple[np.ndarray, np.ndarray]:
        """The output's samples in order, as (source int32, sample index int64) arrays."""
        index = np.empty(self.source_order.size, np.int64)
        by_source = np.argsort(self.source_order, kind="stable")
        start = 0
        for source in self.sources:
            index[by_source[start : start + source.samples]] = source.indices
            start += source.samples
        return self.source_order, index


@dataclass(frozen=True, eq=False)  # arrays: compare them with numpy
class ValidationSplit:
    """Per source, the samples kept for training and those held out (ascending, read-only
    int64, disjoint: together every sample once)."""

    train: tuple[np.ndarray, ...]
    validation: tuple[np.ndarray, ...]


def _stream(seed: int, purpose: int, source: int) -> np.random.PCG64:
    return np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(purpose, source)))


def _ranked(keys: np.ndarray, bits: int) -> np.ndarray:
    """Positions 0..n-1 ordered by `keys` (uint64, low `bits` bits free), ties by position.
    The position fills the low bits, so every key is distinct and sorting the keys themselves
    (faster than a stable argsort) has one answer whatever the sort algorithm."""
    low = np.uint64((1 << bits) - 1)
    keys &= ~low
    keys |= np.arange(keys.size, dtype=np.uint64)
    keys.sort()
    keys &= low
    return keys.view(np.int64)


def seeded_permutation(bits: np.random.PCG64, n: int) -> np.ndarray:
    """A permutation of 0..n-1 from the raw stream: n random 64-bit keys in order of their
    top 64 - log2(n) bits (ties there, a few among millions, by position: a negligible bias)."""
    return _ranked(bits.random_raw(n), max(1, (n - 1).bit_length()))


def _uniform(bits: np.random.PCG64, n: int) -> np.ndarray:
    """n floats in [0, 1) from the raw stream's top 53 bits."""
    return (bits.random_raw(n) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def closest_prefix(lengths: np.ndarray, target: Fraction) -> int:
    """How many leading samples of `lengths` sum closest to `target` tokens: the prefix whose
    running sum first reaches the target, or one fewer where that is closer (a tie keeps
    it). Needs target <= lengths.sum()."""
    if target <= 0:
        return 0
    sums = np.cumsum(lengths, dtype=np.int64)
    m = int(np.searchsorted(sums, math.ceil(target), side="left"))  # sums[m] >= target
    over = int(sums[m]) - target
    under = target - (int(sums[m - 1]) if m else 0)
    return m + 1 if over <= under else m


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _check_lengths(lengths) -> list[np.ndarray]:
    name = option("lengths")
    if isinstance(lengths, np.ndarray) or not isinstance(lengths, Sequence) or not lengths:
        raise UsageError(f"{name} must be a non-empty list of length arrays, one per source")
    checked = []
    for i, source in enumerate(lengths):
        try:
            a = np.asarray(source)
        except (TypeError, ValueError):
            a = np.empty((0, 0))
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise UsageError(f"{name}[{i}] must be a 1-d array of integers")
        if a.size == 0:
            raise InputError(f"source {i} has no samples ({name}[{i}] is empty)")
        short = int(np.argmin(a))
        if a[short] < 1:
            raise InputError(
                f"source {i}: sample {short} has length {a[short]}; every sample needs a token"
            )
        checked.append(a)
    return checked


def _check_weights(weights, n_sources: int) -> list[Fraction]:
    name = option("weights")
    if isinstance(weights, (str, bytes)) or not isinstance(weights, (Sequence, np.ndarray)):
        raise UsageError(f"{name} must be a list of numbers, one per source, got {weights!r}")
    if len(weights) != n_sources:
        raise UsageError(f"{name} has {len(weights)} entries for {n_sources} sources")
    for i, w in enumerate(weights):
        if not isinstance(w, numbers.Real) or isinstance(w, bool):
            raise UsageError(f"{name}[{i}] must be a number, got {w!r}")
        if not math.isfinite(w) or w <= 0:
            raise UsageError(f"{name}[{i}] must be a finite number above 0, got {w}")
    total = sum(float(w) for w in weights)
    if not math.isfinite(total) or total <= 0:
        raise UsageError(f"{name} must sum to a finite number above 0, got {total}")
    return [Fraction(int(w) if isinstance(w, numbers.Integral) else float(w)) for w in weights]


def _targets(totals: list[int], weights: list[Fraction], tokens: int | None) -> list[Fraction]:
    """Each source's token target, exact. Without `tokens`, the scarcest source relative to
    its weight sets the output's size, so its target is its whole size."""
    whole = sum(weights)
    if tokens is not None:
        return [Fraction(tokens) * w / whole for w in weights]
    scarcest = min(range(len(totals)), key=lambda i: Fraction(totals[i]) / weights[i])
    size = Fraction(totals[scarcest]) * whole / weights[scarcest]
    return [size * w / whole for w in weights]


def _check_targets(
    targets: list[Fraction], shortest: list[int], weights: list[Fraction], by_tokens: bool
) -> None:
    """Refuse a target below one sample of its source: that source could not take part."""
    whole = sum(weights)
    for i, target in enumerate(targets):
        if target >= shortest[i]:
            continue
        if by_tokens:
            least = max(math.ceil(shortest[j] * whole / weights[j]) for j in range(len(targets)))
            raise UsageError(
                f"{option('tokens', '--mix-tokens')} {math.floor(sum(targets)):,} gives source "
                f"{i} {float(target):,.1f} tokens, fewer than its shortest sample "
                f"({shortest[i]:,}); ask for at least {least:,}"
            )
        raise UsageError(
            f"{option('weights')}[{i}] {float(weights[i] / whole):.3g} gives source {i} "
            f"{float(target):,.1f} tokens, fewer than its shortest sample ({shortest[i]:,}); "
            f"raise its weight or set {option('tokens', '--mix-tokens')}"
        )


def _choose(lengths: np.ndarray, target: Fraction, seed: int, source: int) -> np.ndarray:
    """The source's samples for `target` tokens: whole epochs, then the closest prefix of a
    seeded permutation (drawn first, so that the subset does not depend on the epochs)."""
    total = int(lengths.sum(dtype=np.int64))
    epochs = math.floor(target / total)
    bits = _stream(seed, _MIX, source)
    subset = seeded_permutation(bits, lengths.size)
    take = closest_prefix(lengths[subset], target - epochs * total)
    passes = [seeded_permutation(bits, lengths.size) for _ in range(epochs)]
    return np.concatenate([*passes, subset[:take]]) if passes else subset[:take].copy()


def _interleave(sources: list[np.ndarray], chosen: list[np.ndarray], seed: int) -> np.ndarray:
    """The source of each output sample: every sample is keyed by where it falls in its own
    source's tokens (its start plus a seeded fraction of its length, over the source's tokens)
    and all are merged by key, so each source is spread evenly by tokens. Keys never decrease
    within a source, so its samples keep their order."""
    sizes = [c.size for c in chosen]
    starts = np.cumsum([0, *sizes], dtype=np.int64)
    bits = max(1, (int(starts[-1]) - 1).bit_length())
    scale, below = float(1 << (64 - bits)), np.nextafter(1.0, 0.0)
    keys = np.empty(int(starts[-1]), np.uint64)
    for i, (lengths, c) in enumerate(zip(sources, chosen)):
        if c.size == 0:
            continue
        used = lengths[c]
        ends = np.cumsum(used, dtype=np.int64)
        jitter = _uniform(_stream(seed, _ORDER, i), c.size)
        fraction = np.minimum(((ends - used) + used * jitter) / float(ends[-1]), below)
        keys[starts[i] : starts[i + 1]] = (fraction * scale).astype(np.uint64)
    keys <<= np.uint64(bits)
    order = _ranked(keys, bits)
    return (np.searchsorted(starts, order, side="right") - 1).astype(np.int32)


def mix(
    lengths: Sequence[np.ndarray],
    weights: Sequence[float],
    tokens: int | None = None,
    seed: int = 0,
) -> Mixture:
    """Choose the samples of each source (`lengths[i]`: its samples' token counts) so that
    source i holds `weights[i] / sum(weights)` of the output's tokens, each within half of
    one of its samples. `tokens` sets the output's size (sources repeated or subsampled to
    fit); without it, the scarcest source relative to its weight is used whole and none is
    repeated. Deterministic in (lengths, weights, tokens, seed)."""
    sources = _check_lengths(lengths)
    fractions = _check_weights(weights, len(sources))
    tokens = A.integer(tokens, "tokens", minimum=1, none=True, flag="--mix-tokens")
    seed = A.integer(seed, "seed", minimum=0)
    totals = [int(a.sum(dtype=np.int64)) for a in sources]
    targets = _targets(totals, fractions, tokens)
    _check_targets(targets, [int(a.min()) for a in sources], fractions, tokens is not None)
    chosen = [_choose(a, t, seed, i) for i, (a, t) in enumerate(zip(sources, targets))]
    achieved = [int(a[c].sum(dtype=np.int64)) for a, c in zip(sources, chosen)]
    output = sum(achieved)
    if output == 0:  # only with `tokens`: by default the scarcest source is used whole
        raise UsageError(
            f"{option('tokens', '--mix-tokens')} {tokens:,} gives an empty mixture: every "
            "source's target is closer to no sample than to one; ask for more tokens"
        )
    whole = sum(fractions)
    mixed = []
    for i, (a, c) in enumerate(zip(sources, chosen)):
        epochs = math.floor(targets[i] / totals[i])
        unused = 0 if epochs else a.size - c.size
        mixed.append(
            MixedSource(
                weight=float(fractions[i] / whole),
                target=float(targets[i]),
                indices=_read_only(c),
                epochs=epochs,
                tokens=achieved[i],
                samples=int(c.size),
                dropped=int(unused),
                share=achieved[i] / output,
            )
        )
    order = _read_only(_interleave(sources, chosen, seed))
    return Mixture(sources=tuple(mixed), source_order=order, seed=seed)


def _held_out(split, n: int, source: int) -> int:
    """How many of a source's n samples `split` (a fraction or a count) holds out."""
    name = option("validation_split")
    if isinstance(split, numbers.Integral):
        k = int(split)
    else:
        k = max(1, math.floor(Fraction(float(split)) * n + Fraction(1, 2)))
    if k >= n:
        raise UsageError(
            f"{name} {split} holds out {k:,} of source {source}'s {n:,} samples, "
            "leaving none to train on"
        )
    return k


def split_validation(lengths: Sequence[np.ndarray], validation_split, seed: int = 0):
    """Hold out samples of every source for validation, by seed, before mixing: a fraction in
    (0, 1) of each source's samples (rounded, at least one), or an integer count per source.
    Returns a `ValidationSplit`; mix the training samples with `lengths[i][split.train[i]]`."""
    sources = _check_lengths(lengths)
    name = option("validation_split")
    split = validation_split
    if isinstance(split, bool) or not isinstance(split, numbers.Real):
        raise UsageError(f"{name} must be a fraction in (0, 1) or a count, got {split!r}")
    if isinstance(split, numbers.Integral) and split < 1:
        raise UsageError(f"{name} must be a count of at least 1, got {split}")
    if not isinstance(split, numbers.Integral) and not (0 < split < 1):
        raise UsageError(f"{name} must be a fraction in (0, 1) or a whole count, got {split}")
    seed = A.integer(seed, "seed", minimum=0)
    train, validation = [], []
    for i, a in enumerate(sources):
        k = _held_out(split, a.size, i)
        order = seeded_permutation(_stream(seed, _SPLIT, i), a.size)
        validation.append(_read_only(np.sort(order[:k])))
        train.append(_read_only(np.sort(order[k:])))
    return ValidationSplit(train=tuple(train), validation=tuple(validation))
