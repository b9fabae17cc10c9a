"""`pack_dataset`: pack token data already in memory, with the planner, checks and output of
`packer pack`.

What comes back follows what goes in: a 🤗 `datasets.Dataset` gives a `Dataset`, a
`pyarrow.Table` (or a sequence of token lists or numpy arrays) gives a `pyarrow.Table`, and any
other iterable (a generator, a `datasets.IterableDataset`) gives an iterator of packed
`pyarrow.RecordBatch`es, packed in windows so the whole input is never held.

The samples are read and validated by `packer.read.objects` (the readers' own `validate`: the
same codes and messages as the CLI, with `sample N` in place of a file and line), planned by
`one_plan.plan_samples` and gathered by the compiled kernel into one set of buffers
(`write.in_memory`), each record batch of the result a zero-copy view of them: the output's
columns are the only memory that grows with the tokens.

A file-backed `datasets.Dataset` (one with `cache_files`) is packed to a cache file instead, as
`Dataset.map` does (`write.cache_file`): one Arrow IPC stream beside the input, written around
the page cache, then memory-mapped. Everything about `datasets` is in `hf_datasets`, imported
only when a Dataset comes in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer import arguments as A
from packer import workers as workers_mod
from packer.arguments import DEFAULT_INPUT, DEFAULT_LABELS
from packer.config import PackConfig
from packer.errors import InputError, OptionError, SampleError, UsageError
from packer.pipelines import hf_datasets
from packer.pipelines.mixture.dataset import HELD, pack_mixture_tables
from packer.pipelines.one_plan import plan_samples
from packer.pipelines.raw_dataset import (
    RawTokenizer,
    add_raw_rejects,
    check_token_options,
    check_unused,
    raw_tokenizer,
    tokenize_stream,
    tokenize_table,
)
from packer.pipelines.result import Stats, stats_of
from packer.pipelines.warmup import start_warming
from packer.planning.overlength import resolve
from packer.planning.row_order import WHOLE, WINDOW, order_rows
from packer.planning.strategies import Plan, plan, plan_arrays
from packer.read import objects
from packer.read.formats import RawTable
from packer.read.remote import stage_dir
from packer.read.samples import Rejects
from packer.read.windows import Piece, window_samples
from packer.storage import is_url, parse_url
from packer.write.cache_file import write_cache_file
from packer.write.in_memory import gather_batches
from packer.write.remote import upload_file
from packer.write.seq_lengths import SCHEMA_WITH_LENGTHS

DEFAULT_WINDOW = 100_000  # samples per window when an iterable is packed


@contextmanager
def _value_errors():
    """packer's errors as the `ValueError` subclasses Python callers expect."""
    try:
        yield
    except (OptionError, SampleError):
        raise
    except UsageError as exc:
        raise OptionError(exc.problem, where=exc.where) from None
    except InputError as exc:
        raise SampleError(exc.problem, where=exc.where) from None


def _records(rejects: Rejects) -> list[dict]:
    """The reject records of `pack --json`, without the file (there is none)."""
    return [{k: v for k, v in r.items() if k != "file"} for r in rejects.records]


# --------------------------------------------------------------------------------------------
# A table held in memory: one plan


def _pack_raw(
    raw: RawTable, cfg: PackConfig, workers: int, path: Path | None = None
) -> tuple[pa.Table | Path, dict]:
    """(packed table, stats); with `path`, the rows are written there and `path` comes back.

    The kernels load from numba's cache (or compile) on another thread while the samples are
    validated, as `packer pack` does it (0.35 s at the first call of a process).
    """
    if cfg.segment_multiple > 1:
        raise UsageError(
            "cp_size above 1 and sequence_parallel are for `packer pack` (pack_dataset writes "
            "no CP rows)"
        )
    warming = start_warming(cfg.strategy)
    try:
        samples, _, _ = objects.table_samples(raw, cfg)
        segs, pl, global_rows = plan_samples(samples, cfg)
    finally:
        warming.stop()
    if path is None:
        batches, loss_tokens, all_tokens = gather_batches(samples, segs, pl, cfg, workers)
        packed = pa.Table.from_batches(batches, SCHEMA_WITH_LENGTHS)
    else:
        loss_tokens, all_tokens = write_cache_file(samples, segs, pl, cfg, workers, path)
        packed = path
    pad_tokens = all_tokens - int(segs.length.sum())
    stats = stats_of(samples, segs, pl, cfg, loss_tokens, pad_tokens, global_rows).as_dict()
    if samples.rejects:
        stats["rejects"] = _records(samples.rejects)
    return packed, stats


def _pack_held(
    data, labels, cfg, labels_column, workers, keep_in_memory, cache_file_name, tokenized=None
):
    """(packed, stats) of a Dataset, a table or a sequence of token lists: one plan.
    tokenized: the samples of raw rows (`raw_dataset.Tokenized`), packed instead of `data`'s."""
    if tokenized is not None:
        raw = RawTable(objects.check_columns(tokenized.table, DEFAULT_INPUT, DEFAULT_LABELS))
    if hf_datasets.is_dataset(data, "Dataset"):
        if labels is not None:
            raise UsageError("labels= is for token lists; a Dataset has a labels column")
        if tokenized is None:
            raw = RawTable(hf_datasets.dataset_table(data, cfg.input_column, labels_column))
        key = tokenized.fingerprint if tokenized is not None else None
        remote = is_url(cache_file_name) and parse_url(cache_file_name).protocol != "file"
        if remote:  # written locally (the result maps it), then uploaded whole
            local = stage_dir() / f"{os.getpid()}-{parse_url(cache_file_name).name}"
            path = hf_datasets.cache_path(data, cfg, keep_in_memory, local, key)
        else:
            path = hf_datasets.cache_path(data, cfg, keep_in_memory, cache_file_name, key)
        table, stats = _pack_raw(raw, cfg, workers, path)
        if remote:
            upload_file(path, cache_file_name)
        return hf_datasets.to_dataset(table, data, cfg, key), stats
    if tokenized is not None:
        return _pack_raw(raw, cfg, workers)
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        if labels is not None:
            raise UsageError("labels= is for token lists; a table has a labels column")
        table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
        raw = RawTable(objects.check_columns(table, cfg.input_column, labels_column))
        return _pack_raw(raw, cfg, workers)
    return _pack_raw(objects.lists_raw(data, labels, cfg.input_column, labels_column), cfg, workers)


# --------------------------------------------------------------------------------------------
# Iterables: windows of `window` segments, as `packer pack --window` plans them


class _Stream:
    """What a stream has read and not yet packed (`pieces`), and its figures so far."""

    def __init__(self, cfg: PackConfig, workers: int):
        self.cfg, self.workers = cfg, workers
        self.total = Stats(max_len=cfg.max_len)
        self.rejects: list[dict] = []
        self.lengths: list[np.ndarray] = []
        self.pieces: list[Piece] = []
        self.first_index = 0
        self.windows = 0
        self.has_labels = None

    def read(self, raw: RawTable) -> None:
        """Validate and resolve one chunk of the stream: one more piece waiting."""
        cfg = self.cfg
        samples, n, rejects = objects.table_samples(raw, cfg, self.first_index, global_index=True)
        read = Stats(max_len=cfg.max_len, samples_in=n)
        if rejects:
            read.rejected, read.rejected_by_reason = rejects.total, dict(rejects.counts)
            self.rejects.extend(_records(rejects))
        self.first_index += n
        if samples is not None:
            if self.has_labels is None:
                self.has_labels = samples.has_labels
            elif samples.has_labels != self.has_labels:
                raise InputError(
                    f"some samples have '{cfg.labels_column}' and others do not "
                    f"(from sample {self.first_index - n} on)"
                )
            segs = resolve(
                samples.lengths,
                cfg.max_len,
                cfg.overlength,
                starts=samples.offsets[:-1],
                locate=samples.locate,
            )
            segs.sample = samples.index[segs.sample]
            read.dropped, read.truncated = segs.dropped, segs.truncated
            read.split, read.tokens_removed = segs.split, segs.tokens_removed
            read.samples_packed = samples.num_samples - segs.dropped
            read.segments = segs.num_segments
            read.tokens_in = samples.num_tokens
            read.tokens = int(segs.length.sum())
            self.lengths.append(segs.length.astype(np.int32))
            self.pieces.append(Piece(samples, segs))
        self.total += read

    def window(self, take: int, alone: bool) -> Iterator[pa.RecordBatch]:
        """The packed record batches of the next `take` segments; `alone`: they are all the
        stream holds (planned with the seed alone, as one global plan)."""
        cfg = self.cfg
        samples, segs = window_samples(self.pieces, take)
        self.pieces = [p for p in self.pieces if p.left]
        seed = cfg.seed if alone else [cfg.seed, self.windows]
        order, row_starts = plan_arrays(segs.length, cfg.max_len, cfg.strategy, seed)
        pl = Plan(order=order, row_starts=row_starts)
        # alone, the stream's rows are ordered as one plan's (`plan_samples`), else per window
        key = (WHOLE,) if alone else (WINDOW, self.windows)
        pl = order_rows(pl, cfg.row_order, cfg.seed, *key)
        batches, loss_tokens, all_tokens = gather_batches(samples, segs, pl, cfg, self.workers)
        pad_tokens = all_tokens - int(segs.length.sum())
        self.total += Stats(
            max_len=cfg.max_len, pad_tokens=pad_tokens, loss_tokens=loss_tokens, rows=pl.num_rows
        )
        self.windows += 1
        yield from batches

    def finish(self, stats: dict) -> None:
        """Fill `stats`, the figures of the whole stream (an empty one is an error)."""
        total, cfg = self.total, self.cfg
        if total.samples_in == 0:
            raise InputError("the dataset is empty: the input holds no samples")
        if total.samples_in == total.rejected:
            counts = ", ".join(f"{k}: {v}" for k, v in sorted(total.rejected_by_reason.items()))
            raise InputError(
                f"the dataset is empty: all {total.samples_in} samples were rejected ({counts})"
            )
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int32)
        total.global_rows = plan(lengths, cfg.max_len, cfg.strategy, seed=cfg.seed).num_rows
        stats.update(total.as_dict())
        if cfg.on_error == "skip":
            stats["rejects"] = self.rejects


def _chunks(data, labels, cfg: PackConfig, raw=None, rejects=None) -> Iterator[RawTable]:
    """An iterable's samples as RawTables of up to `objects.READ_CHUNK` rows; with `raw` (a
    `RawTokenizer`), an IterableDataset's raw rows tokenized chunk by chunk."""
    if raw is not None:
        tables = hf_datasets.arrow_batches(data, objects.READ_CHUNK)
        return objects.table_chunks(tokenize_stream(tables, raw, cfg.on_error, rejects), cfg)
    if hf_datasets.is_dataset(data, "IterableDataset"):
        return objects.table_chunks(hf_datasets.arrow_batches(data, objects.READ_CHUNK), cfg)
    return objects.list_chunks(data, labels, cfg)


def _stream(data, labels, cfg: PackConfig, window: int, workers: int, stats: dict, encode=None):
    """Packed record batches of `data`, window by window; `stats` is complete at the end.
    encode: a `RawTokenizer` for an IterableDataset of raw rows."""
    stream = _Stream(cfg, workers)
    exhausted = False
    raw_rejects: list[str] = []
    chunks = _chunks(data, labels, cfg, encode, raw_rejects)
    while not exhausted:
        raw = next(chunks, None)
        if raw is None:
            exhausted = True
        else:
            stream.read(raw)
        pending = sum(p.left for p in stream.pieces)
        # a window is cut only once more segments are waiting (or none will come), so that
        # "one window holds everything" is known, as `plan(..., window=)` knows it
        while pending > window or (exhausted and pending):
            take = min(window, pending)
            yield from stream.window(
                take, alone=exhausted and stream.windows == 0 and take == pending
            )
            pending -= take
    stream.finish(stats)
    if encode is not None:
        encode.close()
        add_raw_rejects(stats, raw_rejects, cfg)


def _guarded(gen: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    with _value_errors():
        yield from gen


# --------------------------------------------------------------------------------------------


def _check_arguments(data, labels, return_stats, keep_in_memory, cache_file_name) -> None:
    """The checks of `pack_dataset`'s arguments that `PackConfig` does not make."""
    if labels is not None and (
        isinstance(labels, (str, bytes, dict)) or not isinstance(labels, Iterable)
    ):
        raise UsageError(
            f"labels must be label lists parallel to data's samples, got {type(labels).__name__}"
        )
    for name, value in (("return_stats", return_stats), ("keep_in_memory", keep_in_memory)):
        A.boolean(value, name)
    if keep_in_memory and cache_file_name is not None:
        raise UsageError("use either keep_in_memory=True or cache_file_name=, not both")
    if cache_file_name is not None and not hf_datasets.is_dataset(data, "Dataset"):
        raise UsageError(
            "cache_file_name= is for a datasets.Dataset; "
            f"a {type(data).__name__} is packed in memory"
        )


def _held(data) -> bool:
    """Whether `data` is held whole in memory (packed with one plan)."""
    return hf_datasets.is_dataset(data, "Dataset") or isinstance(data, HELD)


def _pack_raw_rows(data, cfg, labels, workers, keep_in_memory, cache_file_name, options, stats_):
    """pack_dataset of raw rows: tokenized (`raw_dataset`), then packed as token data."""
    check_token_options(cfg, labels)
    if hf_datasets.is_dataset(data, "IterableDataset"):
        if cfg.window is None:
            cfg.window = DEFAULT_WINDOW
        raw = RawTokenizer(*options)
        stats: dict = {}
        batches = _guarded(_stream(data, None, cfg, cfg.window, workers, stats, raw))
        return (batches, stats) if stats_ else batches
    if hf_datasets.is_dataset(data, "Dataset"):
        table = hf_datasets.rows_table(data)
    elif isinstance(data, (pa.Table, pa.RecordBatch)):
        table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    else:
        raise UsageError(
            "with tokenizer=, data must be a datasets.Dataset, a datasets.IterableDataset or a "
            f"pyarrow.Table of raw rows, got {type(data).__name__}"
        )
    with raw_tokenizer(*options) as raw:
        tokenized = tokenize_table(table, raw, cfg.on_error, workers)
    packed, stats = _pack_held(
        data, None, cfg, DEFAULT_LABELS, workers, keep_in_memory, cache_file_name, tokenized
    )
    add_raw_rejects(stats, tokenized.rejects, cfg)
    return (packed, stats) if stats_ else packed


def pack_dataset(
    data,
    max_len: int,
    *,
    strategy: str = "bfd",
    overlength: str = "error",
    pad: bool = False,
    pad_id: int = 0,
    seed: int = 0,
    row_order: str = "shuffle",
    input_column: str = DEFAULT_INPUT,
    labels_column: str | None = DEFAULT_LABELS,
    on_error: str = "error",
    window: int | None = None,
    workers: int | None = None,
    labels: Iterable | None = None,
    return_stats: bool = False,
    keep_in_memory: bool = False,
    cache_file_name: str | os.PathLike | None = None,
    tokenizer=None,
    chat_template: str | os.PathLike | None = None,
    train_on: str | None = None,
    allow_empty_mask: bool = False,
    raw_columns: dict[str, str] | None = None,
    tokenizer_engine: str = "auto",
    mix=None,
    mix_tokens: int | None = None,
    validation_split: float | int | None = None,
):
    """Pack tokenized samples held in memory into rows of at most `max_len` tokens; with
    `tokenizer`, raw chats and texts, tokenized first.

    data: a `datasets.Dataset` (returns a `Dataset`), a `pyarrow.Table` (returns a Table), a
    list/tuple of token sequences (Python lists or numpy arrays; returns a Table, `labels` an
    optional parallel sequence), or any other iterable, `datasets.IterableDataset` included
    (returns an iterator of `pyarrow.RecordBatch`, packed in windows of `window` samples,
    100,000 by default). The columns are those of `packer pack`'s shards plus `seq_lengths`;
    other input columns are not carried. The options mean what `packer pack`'s flags mean;
    `row_order="shuffle"` (the default) returns the rows in a permutation seeded by `seed`
    (per window for an iterable), `"plan"` in the planner's order (docs/format.md).

    A file-backed Dataset (one with `cache_files`, e.g. from `load_from_disk`, `load_dataset`
    or `Dataset.from_file`) is packed, as `Dataset.map` does, to a cache file in the directory
    of its first cache file, `cache-packer-<fingerprint>.arrow` (one Arrow IPC stream), and the
    result is that file memory-mapped; with `datasets.disable_caching()` the file goes to
    datasets' temporary cache directory, removed at exit. The file is always written afresh
    (never reused; an existing one is replaced), under a temporary name renamed into place once
    complete. `keep_in_memory=True` packs into memory instead, as for an in-memory Dataset;
    `cache_file_name` writes the file to that path instead (for any Dataset input): same bytes.

    Bad samples raise `packer.errors.SampleError`, bad options `OptionError` (both
    `ValueError`s), with the CLI's messages naming `sample N`; a cache file that cannot be
    written raises `packer.errors.OutputError` naming its path, and leaves no file behind.
    `return_stats=True` returns `(packed, stats)`, stats being the figures of
    `packer pack --json` (for an iterator they are filled in once it is exhausted).

    tokenizer (a directory, hub name, transformers tokenizer or `packer.tokenize.Encoder`):
    `data` holds raw rows (a Dataset, IterableDataset or table of chats, texts, prompt/
    completion, ShareGPT or Alpaca columns), tokenized as `packer pack RAW --tokenizer` does,
    to the same rows; chat_template (a file or its text), train_on, allow_empty_mask, raw_columns
    (`{"messages": "dialog"}`) and tokenizer_engine as its flags. A bad row is `row N` (its index);
    `on_error="skip"` lists it in the stats' `raw_rejects` (`packer.pipelines.raw_dataset`).
    mix (`[(data, weight), ...]` or `{name: (data, weight)}`, with `data=None`), mix_tokens and
    validation_split: a weighted mixture and a held-out split (`pipelines.mixture.dataset`).
    """
    with _value_errors():
        labels_column = labels_column or None  # "" reads no labels, as None does
        cfg = PackConfig(
            max_len=max_len,
            strategy=strategy,
            overlength=overlength,
            pad=pad,
            pad_id=pad_id,
            seed=seed,
            row_order=row_order,
            window=window,
            input_column=input_column,
            labels_column=labels_column or "",
            on_error=on_error,
        ).validate()
        workers = A.integer(workers, "workers", minimum=1, none=True)
        n_workers = workers_mod.configure(workers) if workers else workers_mod.current()
        _check_arguments(data, labels, return_stats, keep_in_memory, cache_file_name)
        raw = (tokenizer, chat_template, train_on, allow_empty_mask, raw_columns, tokenizer_engine)
        check_unused(*raw)
        if any(v is not None for v in (mix, mix_tokens, validation_split)):
            args = (labels, tokenizer, cache_file_name, n_workers)
            packed, stats = pack_mixture_tables(mix, data, cfg, mix_tokens, validation_split, *args)
        elif tokenizer is not None:
            return _pack_raw_rows(
                data, cfg, labels, n_workers, keep_in_memory, cache_file_name, raw, return_stats
            )
        elif _held(data):
            packed, stats = _pack_held(
                data, labels, cfg, labels_column, n_workers, keep_in_memory, cache_file_name
            )
        elif isinstance(data, Iterable) and not isinstance(data, (str, bytes, dict)):
            if window is None:
                cfg.window = DEFAULT_WINDOW
            stats: dict = {}
            batches = _guarded(_stream(data, labels, cfg, cfg.window, n_workers, stats))
            return (batches, stats) if return_stats else batches
        else:
            raise UsageError(
                "data must be a datasets.Dataset, a pyarrow.Table, a sequence of token lists "
                f"or an iterable of them, got {type(data).__name__}"
            )
    return (packed, stats) if return_stats else packed
