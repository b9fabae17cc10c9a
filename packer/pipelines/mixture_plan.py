"""`packer plan --mix`: the mixture a pack would make, from the lengths alone, writing nothing."""

from __future__ import annotations

import numpy as np

from packer.config import PackConfig
from packer.pipelines.mixture import describe_sources, file_counts, mixture_report
from packer.pipelines.mixture_select import (
    expand_sources,
    mix_sources,
    plan_mixture,
    selection_segments,
    source_ranges,
)
from packer.read.assemble import read_samples
from packer.read.columns import check_columns


def mixture_lengths(
    inputs: list, cfg: PackConfig, *, mix=None, mix_tokens=None, validation_split=None
) -> tuple[np.ndarray, dict]:
    """(the packed lengths of the training output's segments, its `mixture` report): what
    `pack` with these options would plan, as it would choose the samples."""
    sources = mix_sources(mix, inputs)
    files = expand_sources(sources)
    every = [f for part in files for f in part]
    check_columns(every, cfg)
    samples = read_samples(every, cfg.input_column, None, chunked=True)
    counts = file_counts(samples, files)
    ranges = source_ranges(samples, counts)
    planned = plan_mixture(
        samples, ranges, [s.weight for s in sources], cfg, mix_tokens, validation_split
    )
    bounds = np.cumsum([0, *counts], dtype=np.int64)
    described = describe_sources(sources, files, bounds)
    report = mixture_report(planned, described, cfg, validation_split, mix_tokens)
    return selection_segments(samples, planned.train, cfg).length, report
