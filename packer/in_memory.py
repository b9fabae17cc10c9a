"""`pack_dataset`: pack token data already in memory, with the planner, checks and output of
`packer pack`.

What comes back follows what goes in: a 🤗 `datasets.Dataset` gives a `Dataset`, a
`pyarrow.Table` (or a sequence of token lists or numpy arrays) gives a `pyarrow.Table`, and any
other iterable (a generator, a `datasets.IterableDataset`) gives an iterator of packed
`pyarrow.RecordBatch`es, packed in windows so the whole input is never held.

The samples are read and validated by the readers' own `validate` (`packer.read.validate`:
the same codes and messages as the CLI, with `sample N` in place of a file and line), planned
by `pipeline.plan_samples` and gathered by the compiled kernel into one set of buffers, each
record batch of the result a zero-copy view of them: the output's columns are the only memory
that grows with the tokens.

A file-backed `datasets.Dataset` (one with `cache_files`) is packed to a cache file instead, as
`Dataset.map` does: the record batches are gathered into a few reused buffers and written by
`write_shards` as one Arrow IPC stream beside the input, around the page cache
(`write.direct`), then memory-mapped. Writing 5 GiB into memory never touched before costs a
page fault per page (0.3-2 GiB/s on the development VM), and so does the page cache; reused
buffers that the device reads directly do not.
`datasets` is imported only when a Dataset comes in.
"""

from __future__ import annotations

import contextlib
import glob
import json
import mmap
import os
import sys
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer import arguments as A
from packer import hashing
from packer import workers as workers_mod
from packer.config import PackConfig
from packer.contract.names import TMP_MARK
from packer.contract.schema import SCHEMA
from packer.errors import InputError, OptionError, OutputError, SampleError, UsageError
from packer.interrupts import deferred_signals
from packer.jit import start_warming
from packer.pipeline import compute_stats, plan_samples
from packer.planning.overlength import Segments, resolve
from packer.planning.strategies import Plan, lower_bound, plan, plan_arrays
from packer.read.assemble import assemble_offsets, chunked_samples
from packer.read.formats import RawTable, _line_problem, _list_of_int
from packer.read.reasons import REASON_CODE
from packer.read.samples import Rejects, Samples, SourceFile, as_chunks
from packer.read.validate import validate
from packer.version import __version__
from packer.write.commit import fsync_dir, os_reason, pid_alive
from packer.write.gather import Buffers, shard_sizes
from packer.write.shard_file import shard_batch
from packer.write.shards import ShardFiles, batch_bounds, gather_batch, write_shards

SCHEMA_WITH_LENGTHS = SCHEMA.append(pa.field("seq_lengths", pa.list_(pa.int32())))
CACHE_PREFIX = "cache-packer-"  # datasets' `cleanup_cache_files` removes `cache-*.arrow`
SYNC_BYTES = 256 << 20  # a cache file is flushed and leaves the page cache every 256 MiB
DEFAULT_WINDOW = 100_000  # samples per window when an iterable is packed
_READ_CHUNK = 10_000  # samples of an iterable converted to Arrow at a time


# --------------------------------------------------------------------------------------------
# Where a sample is: "sample N" instead of a file and line


class _InMemorySource(SourceFile):
    """The data given to `pack_dataset`: rows are named by their global sample index."""

    def position(self, row: int) -> tuple[str, int]:
        return "sample", self.first_index + int(row)

    def locate(self, row: int) -> str:
        return f"sample {self.first_index + int(row)}"


def _source(num_samples: int, first_index: int = 0) -> _InMemorySource:
    return _InMemorySource(
        path=Path("input"),
        format="memory",
        num_samples=num_samples,
        first_index=first_index,
        size=0,
        fingerprint="",
        has_labels=False,
    )


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


# --------------------------------------------------------------------------------------------
# Inputs to one Arrow table of the token (and label) column


def _is_dataset(data, name: str) -> bool:
    module = sys.modules.get("datasets")  # no Dataset can exist before datasets is imported
    return module is not None and isinstance(data, getattr(module, name))


def _check_columns(table: pa.Table, input_column: str, labels_column: str | None) -> pa.Table:
    """The token and label columns of `table`; absent or mistyped columns are one clear error."""
    if input_column not in table.column_names:
        have = ", ".join(table.column_names) or "none"
        raise InputError(f"no '{input_column}' column (columns: {have})", where="input")
    keep = [input_column]
    if labels_column and labels_column in table.column_names:
        keep.append(labels_column)
    for name in keep:
        type_ = table.schema.field(name).type
        if pa.types.is_null(type_) or (
            (pa.types.is_list(type_) or pa.types.is_large_list(type_))
            and pa.types.is_null(type_.value_type)
        ):
            # only nulls and empty lists: let validation name the first such sample
            table = table.set_column(
                table.column_names.index(name), name, table.column(name).cast(pa.list_(pa.int64()))
            )
        elif not _list_of_int(type_):
            raise InputError(
                f"column '{name}' has type {type_}, expected a list of integers", where="input"
            )
    return table.select(keep)


def _dataset_table(ds, input_column: str, labels_column: str | None) -> pa.Table:
    """The Arrow table behind a `datasets.Dataset`, in its row order (select/shuffle honoured)."""
    table = _check_columns(ds.data.table, input_column, labels_column)
    if ds._indices is not None:
        table = table.take(ds._indices.column(0))
    return table


def _plain(value):
    """A sample's value as JSON-able Python (numpy scalars and arrays included)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _problem(value, name: str) -> tuple[str, str] | None:
    """(reason, message) of one sample's value, in the JSONL reader's words (error path only)."""
    if value is None:
        return None  # a null: validation says "no 'input_ids' in this sample"
    if isinstance(value, np.ndarray) and value.ndim != 1:
        return (
            "not_integer_list",
            f"'{name}' must be a 1-d list of integers, got shape {value.shape}",
        )
    if isinstance(value, (str, bytes)):
        return (
            "not_integer_list",
            f"'{name}' must be a list of integers, got {type(value).__name__}",
        )
    text = json.dumps({name: _plain(value)}, default=repr)
    return _line_problem(text, [name])


def _int_column(values, name: str) -> tuple[pa.Array, np.ndarray | None, dict[int, str]]:
    """A list<int> Arrow array of the samples, plus per-sample reason codes and messages for
    those that are not integer lists (nulls in the array; the codes are None when all are)."""
    values = list(values) if not isinstance(values, (list, tuple)) else values
    n = len(values)
    if n and all(
        isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu" for v in values
    ):
        flat = np.concatenate(values)
        if flat.dtype.kind in "iu":  # int64 mixed with uint64 would have become float64
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(np.fromiter((v.size for v in values), np.int64, n), out=offsets[1:])
            return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat)), None, {}
    try:
        # inferred, not cast: an explicit int type would silently truncate 2.5 to 2
        array = pa.array(values)
        type_ = array.type
        if pa.types.is_null(type_) or (
            (pa.types.is_list(type_) or pa.types.is_large_list(type_))
            and pa.types.is_null(type_.value_type)
        ):
            return array.cast(pa.list_(pa.int64())), None, {}
        if _list_of_int(type_):
            return array, None, {}
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        pass
    # Some sample is not a list of integers: name each such sample, keep the others.
    codes = np.zeros(n, np.uint8)
    messages = {}
    clean = list(values)
    for i, value in enumerate(values):
        problem = _problem(value, name)
        if problem:
            codes[i] = REASON_CODE[problem[0]]
            messages[i] = problem[1]
            clean[i] = None
    try:
        array = pa.array([_plain(v) for v in clean], pa.list_(pa.int64()))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError) as exc:
        raise InputError(f"'{name}' cannot be read as lists of integers ({exc})") from None
    return array, codes, messages


def _lists_raw(data, labels, input_column: str, labels_column: str | None) -> RawTable:
    """Token sequences (lists, tuples, numpy arrays, a 2-d array or dict rows) as a RawTable."""
    if isinstance(data, np.ndarray) and data.ndim == 2 and data.dtype.kind in "iu":
        n, width = data.shape
        offsets = np.arange(n + 1, dtype=np.int64) * width
        ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(data.reshape(-1)))
        id_codes, id_messages = None, {}
    else:
        if len(data) and all(isinstance(row, dict) for row in data[:1]):
            rows = data
            data = [row.get(input_column) if isinstance(row, dict) else row for row in rows]
            if labels is None and labels_column:
                found = [row.get(labels_column) if isinstance(row, dict) else None for row in rows]
                labels = found if any(x is not None for x in found) else None
        ids, id_codes, id_messages = _int_column(data, input_column)
    columns = {input_column: ids}
    codes, messages = id_codes, id_messages
    if labels is not None:
        if isinstance(labels, np.ndarray) and labels.ndim == 2:
            labels = list(labels)
        if len(labels) != len(ids):
            raise UsageError(f"labels has {len(labels)} entries but there are {len(ids)} samples")
        lab, lab_codes, lab_messages = _int_column(labels, labels_column or "labels")
        columns[labels_column or "labels"] = lab
        if lab_codes is not None:
            codes = codes if codes is not None else np.zeros(len(ids), np.uint8)
            for i in np.flatnonzero(lab_codes & (codes == 0)).tolist():
                codes[i], messages[i] = lab_codes[i], lab_messages[i]
    return RawTable(pa.table(columns), parse_codes=codes, messages=messages)


# --------------------------------------------------------------------------------------------
# Validation, planning and the gather into one set of buffers


def _samples(
    raw: RawTable, cfg: PackConfig, first_index: int = 0, global_index: bool = False
) -> tuple[Samples | None, int, Rejects | None]:
    """Validate one table of samples: (Samples or None when every one was rejected, rows, rejects).

    global_index: always fill `Samples.index` (a window of a stream starts at `first_index`).
    """
    n = raw.table.num_rows
    src = _source(n, first_index)
    rejects = Rejects() if cfg.on_error == "skip" else None
    labels_column = cfg.labels_column or None
    tokens, lengths, lab, kept, has_labels = validate(
        raw, src, 0, cfg.input_column, labels_column, cfg.on_error, rejects, chunked=True
    )
    src.has_labels = has_labels
    if not global_index:
        offsets, index = assemble_offsets(
            [lengths], [kept if kept is not None else (0, n)], n, rejects
        )
    else:
        if len(lengths) == 0:
            return None, n, rejects
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        index = first_index + (kept if kept is not None else np.arange(n, dtype=np.int64))
    samples = chunked_samples([tokens], [lab], offsets, [src], index, rejects)
    return samples, n, rejects


def _seq_lengths(view: Buffers, rows: int, cu_entries: int) -> pa.Array:
    """Each row's segment lengths (TRL's `seq_lengths`): cu_seqlens differences, padding
    included, so that they sum to the row's length."""
    cu = view.cu[:cu_entries]
    cu_offsets = view.cu_offsets[: rows + 1]
    diffs = np.diff(cu)
    keep = np.ones(diffs.size, bool)
    keep[cu_offsets[1:-1] - 1] = False  # the step from one row's end to the next row's 0
    offsets = (cu_offsets - np.arange(rows + 1, dtype=np.int32)).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(diffs[keep].astype(np.int32)))


def _packed_batch(buf: Buffers, rows: int, tokens: int, cu_entries: int) -> pa.RecordBatch:
    """A shard's record batch of the filled buffers plus `seq_lengths`."""
    batch = shard_batch(buf, rows, tokens, cu_entries)
    return batch.append_column("seq_lengths", _seq_lengths(buf, rows, cu_entries))


def _fresh(n: int, dtype) -> np.ndarray:
    """An uninitialised array in its own anonymous mapping, without transparent huge pages.

    The output is the one large allocation of `pack_dataset`, written once. Under THP's
    `defrag=madvise` (numpy advises huge pages for large arrays) first writes stalled in
    compaction: on the development VM a 100k-sample pack took 1.5-1.8 s with numpy's arrays
    and 0.8-1.1 s with these, and plain fills of 2 GiB 0.25-5.8 s against 0.9-1.4 s.
    """
    dtype = np.dtype(dtype)
    if n == 0 or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.empty(n, dtype)
    region = mmap.mmap(-1, n * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(region, dtype, count=n)  # keeps `region` alive


def _output_buffers(tokens: int, rows: int, segments: int) -> Buffers:
    """`Buffers.allocate`'s arrays, from `_fresh`."""
    return Buffers(
        ids=_fresh(tokens, np.int32),
        labels=_fresh(tokens, np.int32),
        pos=_fresh(tokens, np.int32),
        row_offsets=_fresh(rows + 1, np.int32),
        cu=_fresh(segments + rows, np.int32),
        cu_offsets=_fresh(rows + 1, np.int32),
        sample=_fresh(segments, np.int64),
        sample_offset=_fresh(segments, np.int32),
        sample_row_offsets=_fresh(rows + 1, np.int32),
        loss=_fresh(rows, np.int32),
    )


def _gather(
    samples: Samples, segs: Segments, pl: Plan, cfg: PackConfig, workers: int
) -> tuple[list[pa.RecordBatch], int, int]:
    """(record batches as `pack` writes them, loss tokens, tokens with padding).

    Every batch is gathered into its own slice of one set of buffers sized for the whole
    output, on `workers` threads (the kernel releases the GIL), and wrapped without a copy.
    """
    bounds = [(a, b) for _, a, b in batch_bounds(pl, cfg)]
    if not bounds:
        return [], 0, 0
    sizes = np.array(
        [
            shard_sizes(pl.order, pl.row_starts, segs.length, a, b, cfg.max_len, cfg.pad)
            for a, b in bounds
        ],
        np.int64,
    ).reshape(-1, 2)
    rows = np.array([b - a for a, b in bounds], np.int64)
    tok0 = np.concatenate(([0], np.cumsum(sizes[:, 0])))
    seg0 = np.concatenate(([0], np.cumsum(sizes[:, 1])))
    row0 = np.concatenate(([0], np.cumsum(rows)))
    cu0 = seg0 + row0
    big = _output_buffers(int(tok0[-1]), int(row0[-1]) + len(bounds), int(seg0[-1]))

    def one(k: int) -> tuple[pa.RecordBatch, int, int]:
        t, s, r, c, o = int(tok0[k]), int(seg0[k]), int(row0[k]), int(cu0[k]), int(row0[k]) + k
        n = int(rows[k])
        view = Buffers(
            ids=big.ids[t:],
            labels=big.labels[t:],
            pos=big.pos[t:],
            row_offsets=big.row_offsets[o : o + n + 1],
            cu=big.cu[c:],
            cu_offsets=big.cu_offsets[o : o + n + 1],
            sample=big.sample[s:],
            sample_offset=big.sample_offset[s:],
            sample_row_offsets=big.sample_row_offsets[o : o + n + 1],
            loss=big.loss[r : r + n],
        )
        a, b = bounds[k]
        tokens, cu_entries = gather_batch(samples, segs, pl, cfg, a, b, view)
        batch = _packed_batch(view, n, tokens, cu_entries)
        return batch, int(view.loss[:n].sum()), tokens

    first = one(0)  # also builds the per-segment chunk lookup, once, before the threads
    if len(bounds) > 1 and workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            rest = list(pool.map(one, range(1, len(bounds))))
    else:
        rest = [one(k) for k in range(1, len(bounds))]
    done = [first, *rest]
    return [d[0] for d in done], sum(d[1] for d in done), sum(d[2] for d in done)


def _remove_stale(path: Path) -> None:
    """Remove the temporary files of earlier writes of `path` whose process has died."""
    prefix = f".{path.name}{TMP_MARK}"
    with contextlib.suppress(OSError):
        for entry in path.parent.glob(glob.escape(prefix) + "*"):
            pid = entry.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                entry.unlink(missing_ok=True)


def _write_file(
    samples: Samples, segs: Segments, pl: Plan, cfg: PackConfig, workers: int, path: Path
) -> tuple[int, int]:
    """Write the packed rows to `path` as one Arrow IPC stream; (loss tokens, tokens with
    padding).

    The record batches are those of the in-memory result, gathered into reused buffers and
    written by `write_shards` under a hidden temporary name beside `path`, around the page cache
    (or, where the file system refuses that, flushed and dropped from it as they go), and
    renamed to `path` once complete: `path` is never a partial file, and a failure leaves
    nothing. An existing `path` is replaced.
    """
    _remove_stale(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        (entry,) = write_shards(
            samples,
            segs,
            pl,
            cfg,
            path.parent,
            workers=workers,
            names=lambda _: tmp.name,
            files=ShardFiles(
                schema=SCHEMA_WITH_LENGTHS,
                batch=_packed_batch,
                one_file=True,
                sync_bytes=SYNC_BYTES,
                hashed=False,
                direct=True,
            ),
        )
        with deferred_signals():
            os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OutputError(
                f"cannot write the packed dataset: {os_reason(exc)}; nothing was written",
                where=str(path),
            ) from None
        raise
    return entry["loss_tokens"], entry["tokens"]


def _pack_raw(
    raw: RawTable, cfg: PackConfig, workers: int, path: Path | None = None
) -> tuple[pa.Table | Path, dict]:
    """(packed table, stats); with `path`, the rows are written there and `path` comes back.

    The kernels load from numba's cache (or compile) on another thread while the samples are
    validated, as `packer pack` does it (0.35 s at the first call of a process).
    """
    warming = start_warming(cfg.strategy)
    try:
        samples, _, _ = _samples(raw, cfg)
        segs, pl, global_rows = plan_samples(samples, cfg)
    finally:
        warming.stop()
    if path is None:
        batches, loss_tokens, all_tokens = _gather(samples, segs, pl, cfg, workers)
        packed = pa.Table.from_batches(batches, SCHEMA_WITH_LENGTHS)
    else:
        loss_tokens, all_tokens = _write_file(samples, segs, pl, cfg, workers, path)
        packed = path
    pad_tokens = all_tokens - int(segs.length.sum())
    stats = compute_stats(samples, segs, pl, cfg, loss_tokens, pad_tokens, global_rows)
    if samples.rejects:
        stats["rejects"] = [
            {k: v for k, v in r.items() if k != "file"} for r in samples.rejects.records
        ]
    return packed, stats


# --------------------------------------------------------------------------------------------
# Iterables: windows of `window` segments, as `packer pack --window` plans them


class _Piece:
    """One validated chunk of a stream and how many of its segments are already packed."""

    def __init__(self, samples: Samples, segs: Segments):
        self.samples = samples
        self.segs = segs
        self.used = 0

    @property
    def left(self) -> int:
        return self.segs.num_segments - self.used


def _window_samples(pieces: list[_Piece], take: int) -> tuple[Samples, Segments]:
    """The next `take` segments of the pieces as one Samples/Segments pair (no token copy)."""
    parts = []
    chunks, label_chunks, starts = [], [], [0]
    need = take
    for p in pieces:
        if need == 0:
            break
        k = min(need, p.left)
        if k == 0:
            continue
        sl = slice(p.used, p.used + k)
        shift = starts[-1] - int(p.samples.chunk_starts[0])
        parts.append(
            (p.segs.sample[sl], p.segs.start[sl] + shift, p.segs.length[sl], p.segs.offset[sl])
        )
        chunks.extend(p.samples.token_chunks)
        if p.samples.label_chunks is not None:
            label_chunks.extend(p.samples.label_chunks)
        starts.extend((p.samples.chunk_starts[1:] + shift).tolist())
        p.used += k
        need -= k
    first = pieces[0].samples
    samples = Samples(
        tokens=None,
        offsets=np.zeros(1, np.int64),  # the window is read through its segments only
        labels=None,
        sources=first.sources,
        token_chunks=as_chunks(chunks),
        label_chunks=as_chunks(label_chunks) if first.label_chunks is not None else None,
        chunk_starts=np.asarray(starts, np.int64),
    )
    cat = [np.concatenate([p[i] for p in parts]) for i in range(4)]
    segs = Segments(*cat, dropped=0, truncated=0, split=0, tokens_removed=0)
    return samples, segs


def _raw_chunks(data, labels, cfg: PackConfig) -> Iterator[RawTable]:
    """An iterable's samples as RawTables of up to `_READ_CHUNK` rows."""
    labels_column = cfg.labels_column or None
    if _is_dataset(data, "IterableDataset"):
        for table in data.with_format("arrow").iter(batch_size=_READ_CHUNK):
            yield RawTable(_check_columns(table, cfg.input_column, labels_column))
        return
    items = iter(data)
    label_items = iter(labels) if labels is not None else None
    while True:
        chunk = []
        for item in items:
            chunk.append(item)
            if len(chunk) == _READ_CHUNK:
                break
        if not chunk:
            if label_items is not None and next(label_items, None) is not None:
                raise UsageError("labels has more entries than there are samples")
            return
        lab = None
        if label_items is not None:
            lab = [x for _, x in zip(chunk, label_items)]
            if len(lab) != len(chunk):
                raise UsageError("labels has fewer entries than there are samples")
        yield _lists_raw(chunk, lab, cfg.input_column, labels_column)


def _stream(data, labels, cfg: PackConfig, window: int, workers: int, stats: dict):
    """Packed record batches of `data`, window by window; `stats` is complete at the end."""
    keys = ("samples_in", "samples_packed", "rejected", "dropped", "truncated", "split")
    keys += ("segments", "tokens_in", "tokens", "tokens_removed", "pad_tokens", "loss_tokens")
    totals = dict.fromkeys(keys, 0)
    by_reason: dict[str, int] = {}
    rejects: list[dict] = []
    all_lengths: list[np.ndarray] = []
    pieces: list[_Piece] = []
    first_index = 0
    rows = 0
    w = 0
    has_labels = None

    def emit(take: int, alone: bool):
        nonlocal rows, w, pieces
        samples, segs = _window_samples(pieces, take)
        pieces = [p for p in pieces if p.left]
        order, row_starts = plan_arrays(
            segs.length, cfg.max_len, cfg.strategy, cfg.seed if alone else [cfg.seed, w]
        )
        pl = Plan(order=order, row_starts=row_starts)
        batches, loss_tokens, all_tokens = _gather(samples, segs, pl, cfg, workers)
        totals["loss_tokens"] += loss_tokens
        totals["pad_tokens"] += all_tokens - int(segs.length.sum())
        yield from batches
        rows += pl.num_rows
        w += 1

    exhausted = False
    chunks = _raw_chunks(data, labels, cfg)
    while not exhausted:
        raw = next(chunks, None)
        if raw is None:
            exhausted = True
        else:
            samples, n, piece_rejects = _samples(raw, cfg, first_index, global_index=True)
            totals["samples_in"] += n
            if piece_rejects:
                totals["rejected"] += piece_rejects.total
                for reason, count in piece_rejects.counts.items():
                    by_reason[reason] = by_reason.get(reason, 0) + count
                rejects.extend(
                    {k: v for k, v in r.items() if k != "file"} for r in piece_rejects.records
                )
            first_index += n
            if samples is not None:
                if has_labels is None:
                    has_labels = samples.has_labels
                elif samples.has_labels != has_labels:
                    raise InputError(
                        f"some samples have '{cfg.labels_column}' and others do not "
                        f"(from sample {first_index - n} on)"
                    )
                segs = resolve(
                    samples.lengths,
                    cfg.max_len,
                    cfg.overlength,
                    starts=samples.offsets[:-1],
                    locate=samples.locate,
                )
                segs.sample = samples.index[segs.sample]
                for key in ("dropped", "truncated", "split", "tokens_removed"):
                    totals[key] += getattr(segs, key)
                totals["samples_packed"] += samples.num_samples - segs.dropped
                totals["segments"] += segs.num_segments
                totals["tokens_in"] += samples.num_tokens
                totals["tokens"] += int(segs.length.sum())
                all_lengths.append(segs.length.astype(np.int32))
                pieces.append(_Piece(samples, segs))
        pending = sum(p.left for p in pieces)
        # a window is cut only once more segments are waiting (or none will come), so that
        # "one window holds everything" is known, as `plan(..., window=)` knows it
        while pending > window or (exhausted and pending):
            take = min(window, pending)
            yield from emit(take, alone=exhausted and w == 0 and take == pending)
            pending -= take
    if totals["samples_in"] == 0:
        raise InputError("the dataset is empty: the input holds no samples")
    if totals["samples_in"] == totals["rejected"]:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(by_reason.items()))
        raise InputError(
            f"the dataset is empty: all {totals['samples_in']} samples were rejected ({counts})"
        )
    lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, np.int32)
    global_rows = plan(lengths, cfg.max_len, cfg.strategy, seed=cfg.seed).num_rows
    lb = lower_bound(totals["tokens"], cfg.max_len)
    stats.update(
        {
            **{k: totals[k] for k in keys[:3]},
            "rejected_by_reason": dict(sorted(by_reason.items())),
            **{k: totals[k] for k in keys[3:]},
            "rows": rows,
            "lower_bound": lb,
            "rows_over_lower_bound": round(rows / lb, 6) if lb else 1.0,
            "efficiency": round(totals["tokens"] / (rows * cfg.max_len), 6) if rows else 1.0,
            "global_rows": global_rows,
            "window_cost": round(rows / global_rows - 1, 6) if global_rows else 0.0,
        }
    )
    if cfg.on_error == "skip":
        stats["rejects"] = rejects


def _guarded(gen: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    with _value_errors():
        yield from gen


# --------------------------------------------------------------------------------------------


def pack_dataset(
    data,
    max_len: int,
    *,
    strategy: str = "bfd",
    overlength: str = "error",
    pad: bool = False,
    pad_id: int = 0,
    seed: int = 0,
    input_column: str = "input_ids",
    labels_column: str | None = "labels",
    on_error: str = "error",
    window: int | None = None,
    workers: int | None = None,
    labels: Iterable | None = None,
    return_stats: bool = False,
    keep_in_memory: bool = False,
    cache_file_name: str | os.PathLike | None = None,
):
    """Pack tokenized samples held in memory into rows of at most `max_len` tokens.

    data: a `datasets.Dataset` (returns a `Dataset`), a `pyarrow.Table` (returns a Table), a
    list/tuple of token sequences (Python lists or numpy arrays; returns a Table, `labels` an
    optional parallel sequence), or any other iterable, `datasets.IterableDataset` included
    (returns an iterator of `pyarrow.RecordBatch`, packed in windows of `window` samples,
    100,000 by default). The columns are those of `packer pack`'s shards plus `seq_lengths`;
    other input columns are not carried. The options mean what `packer pack`'s flags mean.

    A file-backed Dataset (one with `cache_files`, e.g. from `load_from_disk`, `load_dataset`
    or `Dataset.from_file`) is packed, as `Dataset.map` does, to a cache file in the directory
    of its first cache file, `cache-packer-<fingerprint>.arrow` (one Arrow IPC stream), and the
    result is that file memory-mapped; with `datasets.disable_caching()` the file goes to
    datasets' temporary cache directory, removed at exit. The file is always written afresh
    (never reused; an existing one is replaced), under a temporary name renamed into place once
    complete. `keep_in_memory=True` packs into memory instead, as for an in-memory Dataset;
    `cache_file_name` writes the file to that path instead (for any Dataset input). Either way
    the rows and bytes are the same.

    Bad samples raise `packer.errors.SampleError`, bad options `OptionError` (both
    `ValueError`s), with the CLI's messages naming `sample N`; a cache file that cannot be
    written raises `packer.errors.OutputError` naming its path, and leaves no file behind.
    `return_stats=True` returns `(packed, stats)`, stats being the figures of
    `packer pack --json` (for an iterator they are filled in once it is exhausted).
    """
    with _value_errors():
        if isinstance(labels_column, str) and not labels_column:
            labels_column = None
        cfg = PackConfig(
            max_len=max_len,
            strategy=strategy,
            overlength=overlength,
            pad=pad,
            pad_id=pad_id,
            seed=seed,
            window=window,
            input_column=input_column,
            labels_column=labels_column or "",
            on_error=on_error,
        ).validate()
        workers = A.integer(workers, "workers", minimum=1, none=True)
        n_workers = workers_mod.configure(workers) if workers else workers_mod.current()
        if labels is not None and (
            isinstance(labels, (str, bytes, dict)) or not isinstance(labels, Iterable)
        ):
            raise UsageError(
                "labels must be label lists parallel to data's samples, "
                f"got {type(labels).__name__}"
            )
        for name, value in (("return_stats", return_stats), ("keep_in_memory", keep_in_memory)):
            A.boolean(value, name)
        if keep_in_memory and cache_file_name is not None:
            raise UsageError("use either keep_in_memory=True or cache_file_name=, not both")
        if cache_file_name is not None and not _is_dataset(data, "Dataset"):
            raise UsageError(
                "cache_file_name= is for a datasets.Dataset; "
                f"a {type(data).__name__} is packed in memory"
            )
        if _is_dataset(data, "Dataset"):
            if labels is not None:
                raise UsageError("labels= is for token lists; a Dataset has a labels column")
            raw = RawTable(_dataset_table(data, cfg.input_column, labels_column))
            path = _cache_path(data, cfg, keep_in_memory, cache_file_name)
            table, stats = _pack_raw(raw, cfg, n_workers, path)
            packed = _to_dataset(table, data, cfg)
        elif isinstance(data, (pa.Table, pa.RecordBatch)):
            if labels is not None:
                raise UsageError("labels= is for token lists; a table has a labels column")
            table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
            raw = RawTable(_check_columns(table, cfg.input_column, labels_column))
            packed, stats = _pack_raw(raw, cfg, n_workers)
        elif isinstance(data, (list, tuple, np.ndarray)):
            packed, stats = _pack_raw(
                _lists_raw(data, labels, cfg.input_column, labels_column), cfg, n_workers
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


def _fingerprint(source, cfg: PackConfig) -> str:
    """The result's fingerprint: from the input's and the options (datasets would otherwise
    hash every byte of an in-memory table)."""
    digest = hashing.new("xxh3_128")
    key = {"input": source._fingerprint, "config": cfg.to_dict(), "packer": __version__}
    digest.update(json.dumps(key, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _cache_path(ds, cfg: PackConfig, keep_in_memory: bool, cache_file_name) -> Path | None:
    """Where the packed rows of `ds` are written, or None to pack them in memory: the choice
    `Dataset.map` makes for its result."""
    if cache_file_name is not None:
        return Path(os.fspath(cache_file_name)).absolute()
    if keep_in_memory or not ds.cache_files:
        return None
    import datasets

    name = f"{CACHE_PREFIX}{_fingerprint(ds, cfg)}.arrow"
    if datasets.is_caching_enabled():
        return Path(ds.cache_files[0]["filename"]).absolute().parent / name
    from datasets.fingerprint import get_temporary_cache_files_directory

    return Path(get_temporary_cache_files_directory()) / name


def _to_dataset(table: pa.Table | Path, source, cfg: PackConfig):
    """A `datasets.Dataset` over the packed table (no copy) or the cache file it was written to
    (memory-mapped, as `Dataset.from_file` maps it), with the fingerprint of `_fingerprint`."""
    import datasets

    if isinstance(table, Path):
        table = _mapped_table(table)
    return datasets.Dataset(table, fingerprint=_fingerprint(source, cfg))


def _mapped_table(path: Path):
    """The cache file as a `MemoryMappedTable` (what `Dataset.from_file` returns), opened
    without reading its body.

    `from_file` maps it with `pyarrow.memory_map`, which advises the kernel to read every
    record batch it opens (MADV_WILLNEED): 3.2 of 4.9 GiB read back from disk, 3-4.5 s, right
    after writing it. A plain `mmap` faults pages in only when a row is read. Opening reads
    each batch's header: written around the page cache, none is cached, and each fault's
    read-around would pull megabytes of body with it (4.5 s for 5 GiB); under MADV_RANDOM a
    fault reads its page alone (0.05 s), and the advice is lifted again for the rows' reads.
    Pickled (for `map` workers), the table reopens by path as `from_file` does.
    """
    from datasets.table import MemoryMappedTable

    with open(path, "rb") as fh:
        region = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):
        region.madvise(mmap.MADV_RANDOM)
    table = pa.ipc.open_stream(pa.py_buffer(region)).read_all()  # the buffer holds `region`
    if hasattr(mmap, "MADV_NORMAL"):
        region.madvise(mmap.MADV_NORMAL)
    return MemoryMappedTable(table, str(path))
