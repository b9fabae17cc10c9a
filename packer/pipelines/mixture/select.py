"""Which samples a mixture packs, and in what order: the sources, the validation split, the plan.

Every source's files are read together into one `Samples` (source 0's files first), so a
source is a contiguous range of global sample indices and `sample_index` numbers the manifest's
inputs as in any run. The mixture is planned once, over every source's lengths as they will be
packed (after `overlength`: a truncated sample counts L tokens, a dropped one is never chosen),
so the achieved shares are those of the output's tokens. The planning core is
`packer.planning.mixture`.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packer.config import PackConfig
from packer.errors import InputError, UsageError, option
from packer.planning.mixture import Mixture, mix, split_validation
from packer.planning.overlength import Segments, resolve
from packer.read.files import expand_inputs
from packer.read.samples import Samples
from packer.storage import display

COLUMN_KEYS = ("input_column", "labels_column")  # what a source may set for itself


class TokenizedEntry(str):
    """A tokenize cache entry packed in place of the raw inputs a user named (`pack RAW
    --tokenizer`): the path of the entry, and in `raw` those inputs, which a validation split's
    mixture names as its source (the entry under `tokenized`), as a raw mixture does."""

    raw: str | list[str]

    def __new__(cls, entry: str, raw: str | list[str]):
        self = super().__new__(cls, entry)
        self.raw = raw
        return self


@dataclass(frozen=True)
class MixSource:
    """One source of a mixture: what the user named (a path, directory or glob; several for
    the plain inputs of a run without a mixture), its weight (a share of the tokens), and the
    column options it reads with where they are its own."""

    paths: tuple[str, ...]
    weight: float
    columns: dict = field(default_factory=dict)
    from_mix: bool = True  # named by `mix` (not the plain inputs of a split)
    raw: str | list[str] | None = None  # the raw data `paths` were tokenized from (--tokenizer)

    def read_columns(self, cfg: PackConfig) -> tuple[str, str | None]:
        """(input column, labels column or None) this source is read with."""
        labels = self.columns.get("labels_column", cfg.labels_column)
        return self.columns.get("input_column", cfg.input_column), labels or None


def mix_sources(mix, inputs: Sequence) -> list[MixSource]:
    """The sources of a run: `mix` as {path: weight}, or a list of (path, weight) pairs or
    {"path", "weight", "input_column", "labels_column"} mappings; without it, the inputs as one
    source of weight 1 (a validation split of a plain run)."""
    name = option("mix")
    if mix is None:
        if not inputs:
            raise UsageError("no input: name the datasets to pack")
        raw = getattr(inputs[0], "raw", None) if len(inputs) == 1 else None
        return [MixSource(tuple(str(p) for p in inputs), 1.0, from_mix=False, raw=raw)]
    if inputs:
        raise UsageError(
            f"{option('mix')} names every source of the mixture: pass the datasets there, "
            "not as inputs too"
        )
    pairs = list(mix.items()) if isinstance(mix, Mapping) else mix
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence) or not pairs:
        raise UsageError(f"{name} must be a non-empty {{path: weight}} or list of (path, weight)")
    return [_source(entry, name) for entry in pairs]


def _source(entry, name: str) -> MixSource:
    """One entry of `mix`, checked."""
    columns, raw = {}, None
    if isinstance(entry, Mapping):
        extra = sorted(set(entry) - {"path", "weight", "raw", *COLUMN_KEYS})
        if extra or "path" not in entry:
            raise UsageError(
                f"{name} entries take path, weight, input_column and labels_column, got {entry!r}"
            )
        columns = {k: entry[k] for k in COLUMN_KEYS if k in entry}
        raw = entry.get("raw")
        entry = (entry["path"], entry.get("weight", 1))
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
        raise UsageError(f"{name} entries must be (path, weight) pairs, got {entry!r}")
    path, weight = entry
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise UsageError(f"{name}: a source's path must be a path or glob, got {path!r}")
    if not isinstance(weight, numbers.Real) or isinstance(weight, bool):
        raise UsageError(f"{name} {path}: the weight must be a number, got {weight!r}")
    if not math.isfinite(weight) or weight <= 0:
        raise UsageError(f"{name} {path}: the weight must be a number above 0, got {weight}")
    for key, value in columns.items():
        if not (isinstance(value, str) and value) and not (
            key == "labels_column" and value is None
        ):
            raise UsageError(f"{name} {path}: {key} must be a column name, got {value!r}")
    return MixSource((str(path),), float(weight), columns, raw=None if raw is None else str(raw))


def expand_sources(sources: list[MixSource], stage: bool = True) -> list[list]:
    """Each source's files; a pattern that matches nothing, or a file in two sources, is
    refused in one line naming `mix`."""
    files, seen = [], {}
    for i, source in enumerate(sources):
        try:
            found = list(expand_inputs(list(source.paths), stage=stage))
        except InputError as exc:
            if not source.from_mix:
                raise
            raise InputError(f"{option('mix')} {source.paths[0]}: {exc.problem}") from None
        for f in found:
            key = str(Path(str(f)).resolve()) if not str(f).startswith(("s3:", "gs:")) else str(f)
            if key in seen and seen[key] != i:
                raise UsageError(
                    f"{option('mix')}: {display(f)} is in sources {seen[key]} and {i}; "
                    "a file belongs to one source"
                )
            seen[key] = i
        files.append(found)
    return files


def source_ranges(samples: Samples, counts: list[int]) -> list[tuple[int, int]]:
    """Each source's positions [start, end) in `samples`, from its files' sample counts (rows
    read, rejected ones included)."""
    bounds = np.cumsum([0, *counts], dtype=np.int64)
    pos = bounds if samples.index is None else np.searchsorted(samples.index, bounds, side="left")
    return [(int(pos[i]), int(pos[i + 1])) for i in range(len(counts))]


def packed_lengths(samples: Samples, start: int, end: int, cfg: PackConfig):
    """(positions relative to `start` that can be packed, their lengths as packed, over-length
    samples dropped): `overlength` applied before mixing, so weights count packed tokens."""
    lengths = samples.lengths[start:end]
    over = lengths > cfg.max_len
    if not over.any():
        return np.arange(lengths.size, dtype=np.int64), lengths, 0
    if cfg.overlength == "error":  # the usual one-line message, naming the first such sample
        resolve(lengths, cfg.max_len, "error", locate=lambda i: samples.locate(start + i))
    if cfg.overlength == "drop":
        keep = np.flatnonzero(~over)
        return keep, lengths[keep], int(over.sum())
    if cfg.overlength == "truncate":
        return np.arange(lengths.size, dtype=np.int64), np.minimum(lengths, cfg.max_len), 0
    return np.arange(lengths.size, dtype=np.int64), lengths, 0  # split: every token packed


@dataclass
class Selection:
    """Samples to pack, in order: their positions in `Samples` (repeats included) and the
    source of each."""

    positions: np.ndarray  # int64
    source: np.ndarray  # int32
    dropped: int = 0  # over-length samples of the sources left out (overlength drop)


@dataclass
class MixturePlan:
    train: Selection
    validation: Selection | None
    mixture: Mixture | None  # None for a single source: every training sample once
    held_out: list[int]  # validation samples per source
    held_out_tokens: list[int]
    tokens: list[int]  # per source: tokens of the training output
    samples: list[int]
    available: list[int]  # samples each source can give (after overlength drop and the split)


def plan_mixture(
    samples: Samples,
    ranges: list[tuple[int, int]],
    weights: list[float],
    cfg: PackConfig,
    mix_tokens: int | None,
    validation_split,
) -> MixturePlan:
    """Split (optional) and mix the sources: which positions each output packs, in order."""
    if cfg.overlength == "error":  # every source's over-length samples counted in one line
        resolve(samples.lengths, cfg.max_len, "error", locate=samples.locate)
    kept, lengths, dropped = [], [], 0
    for start, end in ranges:
        keep, packed, n_dropped = packed_lengths(samples, start, end, cfg)
        kept.append(start + keep)
        lengths.append(packed)
        dropped += n_dropped
    return choose_samples(kept, lengths, dropped, weights, cfg, mix_tokens, validation_split)


def choose_samples(
    kept: list[np.ndarray],
    lengths: list[np.ndarray],
    dropped: int,
    weights: list[float],
    cfg: PackConfig,
    mix_tokens: int | None,
    validation_split,
) -> MixturePlan:
    """Split (optional) and mix the sources from their packable samples alone: `kept[i]` the
    positions of source i's samples that can be packed, `lengths[i]` their lengths as packed.
    The one-plan and the block pipelines both choose here, so they choose alike."""
    validation = None
    held, held_tokens = [0] * len(kept), [0] * len(kept)
    if validation_split is not None:
        split = split_validation(lengths, validation_split, seed=cfg.seed)
        held = [int(v.size) for v in split.validation]
        held_tokens = [int(x[v].sum()) for x, v in zip(lengths, split.validation)]
        vpos = [k[v] for k, v in zip(kept, split.validation)]
        validation = Selection(
            positions=np.concatenate(vpos),
            source=np.repeat(np.arange(len(kept), dtype=np.int32), held),
        )
        kept = [k[t] for k, t in zip(kept, split.train)]
        lengths = [x[t] for x, t in zip(lengths, split.train)]
    available = [int(k.size) for k in kept]
    if len(kept) == 1 and mix_tokens is None:  # no mixture: every sample once, input order
        train = Selection(kept[0], np.zeros(kept[0].size, np.int32), dropped)
        tokens = [int(lengths[0].sum())]
        return MixturePlan(
            train, validation, None, held, held_tokens, tokens, [kept[0].size], available
        )
    m = mix(lengths, weights, tokens=mix_tokens, seed=cfg.seed)
    source, index = m.interleaved()
    positions = np.empty(index.size, np.int64)
    for i, k in enumerate(kept):
        sel = source == i
        positions[sel] = k[index[sel]]
    train = Selection(positions, source.astype(np.int32, copy=False), dropped)
    tokens = [s.tokens for s in m.sources]
    counts = [s.samples for s in m.sources]
    return MixturePlan(train, validation, m, held, held_tokens, tokens, counts, available)


def selection_segments(samples: Samples, selection: Selection, cfg: PackConfig) -> Segments:
    """The segments of the selected samples under `overlength` (none of them is dropped:
    the selection left out what `drop` would), numbered by their global sample index."""
    pos = selection.positions
    segs = resolve(
        samples.lengths[pos],
        cfg.max_len,
        cfg.overlength,
        starts=samples.offsets[pos],
        locate=lambda i: samples.locate(int(pos[i])),
    )
    globals_ = samples.index[pos] if samples.index is not None else pos
    segs.sample = np.asarray(globals_, np.int64)[segs.sample]
    return segs
