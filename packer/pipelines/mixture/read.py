"""A mixture's sources read one by one, each with its own columns, joined into one `Samples`.

Source 0's files come first, then source 1's..., so global sample indices and token positions
run on across sources exactly as one read of all the files would number them. A source without
labels joined to one with labels trains every token, as it would packed alone (its labels are
its input ids). In memory, or streamed to a cache beside the output per source when the
decoded inputs would not fit the memory budget.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np

from packer.arguments import parse_size
from packer.config import PackConfig
from packer.errors import InputError, OutputError, option
from packer.pipelines.mixture.select import MixSource
from packer.read.assemble import read_samples
from packer.read.cache import (
    batch_bytes_for,
    default_budget,
    make_cache_dir,
    needs_out_of_core,
    remove_cache_dir,
    stream_samples,
)
from packer.read.columns import check_columns
from packer.read.samples import Rejects, Samples, as_chunks
from packer.write import commit as output


def check_source_columns(sources: list[MixSource], files: list[list], cfg: PackConfig) -> None:
    """Every source's column options against its files, before anything is read."""
    for source, part in zip(sources, files):
        check_columns(part, replace(cfg, **source.columns))


def read_sources(
    sources: list[MixSource],
    files: list[list],
    out: Path | None,
    cfg: PackConfig,
    memory_budget,
    stack: ExitStack,
) -> Samples:
    """Every source's files into one `Samples`: streamed to a cache beside `out` (removed when
    `stack` closes) when they would not fit the memory budget; always in memory without `out`."""
    budget = parse_size(memory_budget) if memory_budget is not None else default_budget()
    every = [f for part in files for f in part]
    columns = [cfg.input_column] + ([cfg.labels_column] if cfg.labels_column else [])
    streamed = out is not None and needs_out_of_core(every, columns, budget)
    parts = []
    for source, part in zip(sources, files):
        input_column, labels_column = source.read_columns(cfg)
        try:
            if not streamed:
                parts.append(
                    read_samples(
                        part, input_column, labels_column, on_error=cfg.on_error, chunked=True
                    )
                )
                continue
            cache_dir = _cache_dir(out)
            stack.callback(remove_cache_dir, cache_dir)
            parts.append(
                stream_samples(
                    part,
                    cache_dir,
                    input_column,
                    labels_column,
                    on_error=cfg.on_error,
                    batch_bytes=batch_bytes_for(budget),
                )
            )
        except InputError as exc:
            if source.from_mix and exc.problem.startswith("the dataset is empty"):
                raise InputError(f"{option('mix')} {source.paths[0]}: {exc.problem}") from None
            raise
    return join_samples(parts)


def _cache_dir(out: Path) -> Path:
    try:
        return make_cache_dir(out)
    except OSError as exc:
        raise OutputError(
            f"cannot create a cache directory: {output.os_reason(exc)}", where=str(out.parent)
        ) from None


def join_samples(parts: list[Samples]) -> Samples:
    """The samples of `parts` one after the other, in the chunked form, their values left
    where they are; sample indices and positions continue from part to part."""
    if len(parts) == 1:
        return parts[0]
    labelled = any(p.has_labels for p in parts)
    sources, offsets, index = [], [np.zeros(1, np.int64)], []
    tokens, labels, starts = [], [], [0]
    rejects = Rejects() if any(p.rejects is not None for p in parts) else None
    numbered = any(p.index is not None for p in parts)
    first = position = 0
    for p in parts:
        for src in p.sources:
            src.first_index += first
            sources.append(src)
        offsets.append(np.asarray(p.offsets[1:], np.int64) + position)
        if numbered:
            own = p.index if p.index is not None else np.arange(p.num_samples, dtype=np.int64)
            index.append(own + first)
        if p.rejects is not None:
            for record in p.rejects.records:
                record["sample_index"] += first
            rejects.records.extend(p.rejects.records)
            for reason, n in p.rejects.counts.items():
                rejects.counts[reason] = rejects.counts.get(reason, 0) + n
        values, label_values, bounds = _chunks_of(p)
        tokens.extend(values)
        labels.extend(label_values)
        starts.extend((bounds[1:] + position).tolist())
        first += p.num_input_samples
        position += p.num_tokens
    return Samples(
        tokens=None,
        offsets=np.concatenate(offsets),
        labels=None,
        sources=sources,
        index=np.concatenate(index) if numbered else None,
        rejects=rejects,
        token_chunks=as_chunks(tokens),
        label_chunks=as_chunks(labels) if labelled else None,
        chunk_starts=np.asarray(starts, np.int64),
    )


def _chunks_of(p: Samples) -> tuple[list, list, np.ndarray]:
    """(token chunks, label chunks, chunk boundaries) of one part; a part without labels
    gives its tokens as labels."""
    if p.token_chunks is not None:
        values = list(p.token_chunks)
        labels = list(p.label_chunks) if p.label_chunks is not None else values
        return values, labels, np.asarray(p.chunk_starts, np.int64)
    values = [p.tokens[: p.num_tokens]]
    labels = [p.labels[: p.num_tokens]] if p.labels is not None else values
    return values, labels, np.array([0, p.num_tokens], np.int64)
