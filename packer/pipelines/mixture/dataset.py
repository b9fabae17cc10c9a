"""`pack_dataset(None, ..., mix=...)`: a weighted mixture of data held in memory.

The sources (🤗 Datasets, Arrow tables, sequences of token lists) are validated one by one and
joined in order, so their global sample indices run on from source to source exactly as
`packer.pack --mix` numbers the same samples written one file per source. The mixture is
planned once by `select.plan_mixture`, the selected samples planned and gathered as
`pack` writes them, and every row carries `sample_source` (the index of each segment's source).
So a source table written to a file and mixed by `packer.pack` gives the same rows.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa

from packer.config import PackConfig
from packer.contract.schema import SOURCE_COLUMN
from packer.errors import InputError, UsageError
from packer.pipelines import hf_datasets
from packer.pipelines.mixture.read import join_samples
from packer.pipelines.mixture.report import mixture_report, validation_report
from packer.pipelines.mixture.select import (
    Selection,
    plan_mixture,
    selection_segments,
    source_ranges,
)
from packer.pipelines.result import stats_of
from packer.planning.row_order import order_plan_rows
from packer.planning.strategies import plan
from packer.read import objects
from packer.read.formats import RawTable
from packer.write.in_memory import gather_batches
from packer.write.seq_lengths import SCHEMA_WITH_LENGTHS

HELD = (pa.Table, pa.RecordBatch, list, tuple, np.ndarray)  # data packed whole, in memory
SCHEMA_WITH_SOURCE = SCHEMA_WITH_LENGTHS.append(pa.field(SOURCE_COLUMN, pa.list_(pa.int32())))


def dataset_sources(mix, data) -> list[tuple[str, object, float]]:
    """(name, data, weight) of every source: `mix` as [(data, weight), ...] or
    {name: (data, weight)}; without `mix`, `data` as one source of weight 1."""
    if mix is None:
        if data is None:
            raise UsageError("data is None: pass the data to pack, or mix")
        return [("data", data, 1.0)]
    if data is not None:
        raise UsageError("mix names the data to pack: pass data=None with mix")
    if isinstance(mix, Mapping):
        entries = [(str(k), v) for k, v in mix.items()]
    elif isinstance(mix, Sequence) and not isinstance(mix, (str, bytes)):
        entries = [(f"source {i}", v) for i, v in enumerate(mix)]
    else:
        raise UsageError(
            "mix must be a list of (data, weight) pairs or {name: (data, weight)}, "
            f"got {type(mix).__name__}"
        )
    if not entries:
        raise UsageError("mix is empty: name at least one (data, weight) pair")
    sources = []
    for name, entry in entries:
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise UsageError(f"mix {name}: an entry must be a (data, weight) pair")
        held, weight = entry
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise UsageError(f"mix {name}: the weight must be a number, got {weight!r}")
        if not np.isfinite(weight) or weight <= 0:
            raise UsageError(f"mix {name}: the weight must be a number above 0, got {weight}")
        sources.append((name, held, float(weight)))
    return sources


def _check_arguments(data, labels, tokenizer, cache_file_name) -> None:
    """What a mixture or a validation split of `pack_dataset` cannot take."""
    for name, given in (
        ("labels=", labels is not None),
        ("tokenizer=", tokenizer is not None),
        ("cache_file_name=", cache_file_name is not None),
    ):
        if given:
            raise UsageError(
                f"{name} cannot be used with mix or validation_split (they pack held token data "
                "in memory)"
            )
    if data is not None and not (hf_datasets.is_dataset(data, "Dataset") or isinstance(data, HELD)):
        raise UsageError(
            "validation_split needs data held in memory (a datasets.Dataset, a pyarrow.Table "
            f"or a sequence of token lists), got {type(data).__name__}"
        )


def _raw(name: str, held, cfg: PackConfig) -> RawTable:
    """One source's token (and label) columns, as `pack_dataset` reads a held input."""
    labels_column = cfg.labels_column or None
    if hf_datasets.is_dataset(held, "Dataset"):
        return RawTable(hf_datasets.dataset_table(held, cfg.input_column, labels_column))
    if isinstance(held, (pa.Table, pa.RecordBatch)):
        table = pa.Table.from_batches([held]) if isinstance(held, pa.RecordBatch) else held
        return RawTable(objects.check_columns(table, cfg.input_column, labels_column))
    if isinstance(held, (list, tuple, np.ndarray)):
        return objects.lists_raw(held, None, cfg.input_column, labels_column)
    raise UsageError(
        f"mix {name}: a source must be a datasets.Dataset, a pyarrow.Table or a sequence of "
        f"token lists, got {type(held).__name__}"
    )


def pack_mixture_tables(
    mix,
    data,
    cfg: PackConfig,
    mix_tokens,
    validation_split,
    labels,
    tokenizer,
    cache_file_name,
    workers: int,
):
    """(packed, stats): the training rows, or {"train", "validation"} with a validation split
    (a `datasets.DatasetDict` of in-memory Datasets when every source is a Dataset)."""
    _check_arguments(data, labels, tokenizer, cache_file_name)
    sources = dataset_sources(mix, data)
    if mix_tokens is not None and mix is None:
        raise UsageError("mix_tokens sizes a mixture: pass mix")
    parts, counts = [], []
    for i, (name, held, _) in enumerate(sources):
        try:
            samples, n, rejects = objects.table_samples(_raw(name, held, cfg), cfg)
        except InputError as exc:  # "sample N" counts within the source
            if mix is None:
                raise
            where = f"mix {name}, {exc.where}" if exc.where else f"mix {name}"
            raise InputError(exc.problem, where=where) from None
        for record in rejects.records if rejects else []:
            record["source"] = i
        parts.append(samples)
        counts.append(n)
    samples = join_samples(parts)
    bounds = np.cumsum([0, *counts], dtype=np.int64)
    ranges = source_ranges(samples, counts)
    planned = plan_mixture(
        samples, ranges, [w for _, _, w in sources], cfg, mix_tokens, validation_split
    )
    described = [
        {"name": name, "first_index": int(bounds[i]), "input_samples": counts[i]}
        for i, (name, _, _) in enumerate(sources)
    ]
    table, stats = _gather(samples, planned.train, cfg, bounds, workers)
    stats["mixture"] = mixture_report(planned, described, cfg, validation_split, mix_tokens)
    if samples.rejects:
        stats["rejects"] = [
            {k: v for k, v in r.items() if k != "file"} for r in samples.rejects.records
        ]
    datasets_in = all(hf_datasets.is_dataset(h, "Dataset") for _, h, _ in sources)
    key = [[name, h._fingerprint, w] for name, h, w in sources] if datasets_in else None
    key = [key, mix_tokens, validation_split]
    if planned.validation is None:
        return (hf_datasets.mixed_dataset(table, key, cfg) if datasets_in else table), stats
    held = Selection(planned.validation.positions, planned.validation.source)
    vtable, vstats = _gather(samples, held, cfg, bounds, workers)
    vstats["mixture"] = validation_report(planned, described, cfg, validation_split, "train")
    stats["validation"] = vstats
    if datasets_in:
        splits = {"train": table, "validation": vtable}
        return hf_datasets.mixed_dataset_dict(splits, key, cfg), stats
    return {"train": table, "validation": vtable}, stats


def _gather(samples, selection: Selection, cfg: PackConfig, bounds, workers: int):
    """(table, stats) of the selected samples, planned and ordered as `pack` plans them."""
    segs = selection_segments(samples, selection, cfg)
    pl = plan(segs.length, cfg.max_len, cfg.strategy, seed=cfg.seed, window=cfg.window)
    pl = order_plan_rows(pl, cfg.row_order, cfg.seed, cfg.window)
    global_rows = None
    if cfg.window is not None:
        global_rows = plan(segs.length, cfg.max_len, cfg.strategy, seed=cfg.seed).num_rows
    batches, loss_tokens, all_tokens = gather_batches(samples, segs, pl, cfg, workers)
    starts = np.asarray(bounds[1:-1], np.int64)
    batches = [_with_source(b, starts) for b in batches]
    table = pa.Table.from_batches(batches, SCHEMA_WITH_SOURCE)
    pad_tokens = all_tokens - int(segs.length.sum())
    stats = stats_of(samples, segs, pl, cfg, loss_tokens, pad_tokens, global_rows)
    stats = replace(stats, samples_packed=int(selection.positions.size), dropped=selection.dropped)
    return table, stats.as_dict()


def _with_source(batch: pa.RecordBatch, starts: np.ndarray) -> pa.RecordBatch:
    """`batch` with `sample_source`, read off `sample_index` (source s holds the global
    indices from its first one on)."""
    index = batch.column("sample_index")
    values = index.flatten().to_numpy(zero_copy_only=False)
    source = np.searchsorted(starts, values, side="right").astype(np.int32)
    offsets = np.asarray(index.offsets)
    offsets = pa.array(offsets - offsets[0])  # a sliced list array's offsets start past 0
    column = pa.ListArray.from_arrays(offsets, pa.array(source))
    return pa.RecordBatch.from_arrays([*batch.columns, column], schema=SCHEMA_WITH_SOURCE)
