"""One worker's part of a tokenize run: a batch of raw rows in, one tokenized Parquet shard out.

Each worker process builds its own `Encoder` once, from the picklable spec (a tokenizer shared
between threads stops scaling), and writes its shards itself into the run's temporary
directory; the driver only hands out batches and adds up what comes back. The same function
runs in the driver's process with one worker.
"""

from __future__ import annotations

import gc
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packer.errors import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    InputError,
    Terminated,
)
from packer.tokenize.files import RawBatch, batch_digest, decode_rows
from packer.tokenize.output import shard_name

_state: dict = {}


@dataclass
class BatchDone:
    """What one batch gave: counts, the shard written (None when every row was rejected) and
    the rejected rows as `FILE:LINE: what`."""

    file_index: int
    batch_index: int
    lines: int
    samples: int = 0
    tokens: int = 0
    trained: int = 0
    shard: str | None = None
    rejects: list[str] = field(default_factory=list)
    source: str | None = None  # `batch_digest` of the rows: what a resumed run checks
    note: str | None = None  # the encoder's fallback line (`Encoder.take_note`), said once


def init_worker(encoder, columns, on_error: str) -> None:
    """Pool initializer: this process's encoder (its spec when spawned; a forked worker has its
    own copy already). Signals are the driver's to handle: it stops the workers itself (a
    Ctrl-C in a terminal reaches the whole process group). A forked worker starts with the
    driver's handlers: a `terminate` that reaches it before they are reset (a run that failed
    on its first batch while this worker started) ends it quietly, not with a traceback."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the driver's `terminate` ends the worker
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt as exc:  # the driver's handler, inherited by the fork
        os._exit(EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED)
    # the heap this worker inherited (the driver's imports, a forked encoder) lives as long as
    # the worker: frozen, the collector's full collections no longer traverse it (nor touch,
    # and so copy, its pages)
    gc.freeze()
    if isinstance(encoder, dict):
        setup(encoder, columns, on_error)
    else:
        setup(None, columns, on_error, encoder=encoder)


def setup(spec: dict | None, columns, on_error: str, encoder=None) -> None:
    from packer.tokenize.encode import Encoder

    _state["encoder"] = encoder if encoder is not None else Encoder.from_spec(spec)
    _state["columns"] = columns
    _state["on_error"] = on_error


def tokenize_batch(batch: RawBatch, directory: str) -> BatchDone:
    """Decode, check and encode the batch's rows; write their shard into `directory`."""
    from packer.tokenize.records import RawRecordError, to_record

    encoder, columns, skip = _state["encoder"], _state["columns"], _state["on_error"] == "skip"
    done = BatchDone(batch.file_index, batch.batch_index, len(batch.lines))
    done.source = batch_digest(batch)
    records, places, rejects = [], [], []
    for i, row in enumerate(decode_rows(batch)):
        problem = row if isinstance(row, str) else None
        if problem is None:
            try:
                records.append(to_record(row, columns))
                places.append(i)
                continue
            except RawRecordError as exc:
                problem = str(exc)
        _reject(rejects, batch, i, problem, skip)
    encoded = _encode(encoder, records, places, batch, rejects, skip)
    done.note = encoder.take_note()
    done.rejects = [f"{batch.where(i)}: {problem}" for i, problem in sorted(rejects)]
    if encoded:
        done.shard = shard_name(batch.file_index, batch.batch_index)
        done.tokens, done.trained = _write_shard(Path(directory) / done.shard, encoded)
        done.samples = len(encoded)
    return done


def _encode(encoder, records: list, places: list[int], batch: RawBatch, rejects, skip: bool):
    """The encoded samples in order (a chat under `--turns one-per-sample` gives several); a
    bad record stops the run, or with skip is left out, in the same one pass."""
    from packer.tokenize.records import RawRecordError
    from packer.tokenize.template import TemplateError

    if not records:
        return []
    try:
        results = encoder.encode_batch(records, skip_errors=skip)
    except TemplateError as exc:  # the template is refused, whatever --on-error says
        index = exc.index
        if exc.where is not None or index is None or not 0 <= index < len(records):
            raise
        where = batch.where(places[index])
        usage = exc.exit_code == EXIT_USAGE
        raise TemplateError(exc.problem, usage=usage, where=where) from None
    except RawRecordError as exc:
        index = getattr(exc, "index", None)
        if index is None or not 0 <= index < len(records):
            raise InputError(f"{batch.shown}: {exc}") from None
        raise InputError(str(exc), where=batch.where(places[index])) from None
    encoded = []
    for place, result in zip(places, results):
        if isinstance(result, RawRecordError):
            _reject(rejects, batch, place, str(result), skip)
        elif isinstance(result, list):
            encoded += result
        else:
            encoded.append(result)
    return encoded


def _reject(rejects: list, batch: RawBatch, i: int, problem: str, skip: bool) -> None:
    if not skip:
        raise InputError(problem, where=batch.where(i))
    rejects.append((i, problem))


def _write_shard(path: Path, encoded: list) -> tuple[int, int]:
    """input_ids and labels as list<int32>, one row group: the same bytes for the same rows.
    Returns (tokens, trained tokens), counted on the flat arrays."""
    lengths = np.fromiter((len(ids) for ids, _ in encoded), np.int64, len(encoded))
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.concatenate([np.asarray(i, np.int32) for i, _ in encoded])
    labels = np.concatenate([np.asarray(lab, np.int32) for _, lab in encoded])
    table = pa.Table.from_arrays(
        [
            pa.ListArray.from_arrays(_int32(offsets), _int32(ids)),
            pa.ListArray.from_arrays(_int32(offsets), _int32(labels)),
        ],
        names=["input_ids", "labels"],
    )
    pq.write_table(table, path, row_group_size=max(1, len(encoded)))
    return len(ids), int(np.count_nonzero(labels != -100))


def _int32(values: np.ndarray) -> pa.Array:
    """An int32 Arrow array over the numpy buffer. `pa.array` and `pa.table(dict)` would import
    pandas to look for its types: 1.3 s of CPU in every worker."""
    values = np.ascontiguousarray(values, np.int32)
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])
