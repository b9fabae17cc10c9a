"""`packer plan --mix`: the mixture a pack would make, from the lengths alone, writing nothing."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np

from packer.config import PackConfig
from packer.pipelines.mixture.read import check_source_columns, read_sources
from packer.pipelines.mixture.report import describe_sources, file_counts, mixture_report
from packer.pipelines.mixture.select import (
    expand_sources,
    mix_sources,
    plan_mixture,
    selection_segments,
    source_ranges,
)


def mixture_lengths(
    inputs: list, cfg: PackConfig, *, mix=None, mix_tokens=None, validation_split=None
) -> tuple[np.ndarray, dict]:
    """(the packed lengths of the training output's segments, its `mixture` report): what
    `pack` with these options would plan, as it would choose the samples."""
    sources = mix_sources(mix, inputs)
    files = expand_sources(sources)
    check_source_columns(sources, files, cfg)
    with ExitStack() as stack:  # plan reads in memory, as it does without a mixture
        samples = read_sources(sources, files, None, cfg, None, stack)
    counts = file_counts(samples, files)
    ranges = source_ranges(samples, counts)
    planned = plan_mixture(
        samples, ranges, [s.weight for s in sources], cfg, mix_tokens, validation_split
    )
    bounds = np.cumsum([0, *counts], dtype=np.int64)
    described = describe_sources(sources, files, bounds)
    report = mixture_report(planned, described, cfg, validation_split, mix_tokens)
    return selection_segments(samples, planned.train, cfg).length, report
