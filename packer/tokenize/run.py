"""`tokenize`: raw records (chats, texts, prompt/completion pairs) to tokenized Parquet shards.

The driver reads the raw files as batches (`packer.tokenize.files`) and hands them to a pool of
worker processes, each with its own encoder, each writing its batch's shard
(`packer.tokenize.worker`); an input of one batch is tokenized in the driver itself. The
shards are named by input file and batch, never by worker, and batches are cut by rows and
bytes only: the output is the same bytes for any `workers`.
At most a few batches per worker are in flight, so memory does not grow with the input. The
output is built in a hidden temporary directory and renamed into place when complete
(`packer.tokenize.output`); Ctrl-C or SIGTERM stops the workers and leaves nothing, and so
does a worker that dies (killed, out of memory): one line names the batch it held
(`packer.tokenize.pool`).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from packer import arguments as A
from packer import hashing
from packer.errors import InputError, UsageError, option
from packer.interrupts import interrupt_once, raise_if_interrupted
from packer.storage import display
from packer.tokenize import output as out_dir
from packer.tokenize import resume as resume_
from packer.tokenize.files import (
    BATCH_BYTES,
    BATCH_ROWS,
    RawFile,
    batch_digest,
    raw_inputs,
    read_batches,
)
from packer.tokenize.forking import worker_start
from packer.tokenize.output import shard_name
from packer.tokenize.pool import WorkerPool
from packer.tokenize.worker import BatchDone, init_worker, setup, tokenize_batch
from packer.workers import available
from packer.workers import configure as configure_workers

ON_ERROR = ("error", "skip")
WORKER_BYTES = 512 << 20  # a worker's tokenizer, one decoded batch and its shard, at most
IN_FLIGHT = 2  # batches per worker queued or running
SHOWN_REJECTS = 1000  # rejects listed in tokenized.json (rejects.txt lists all)
RUNNER_CHUNK = 64  # batches handed to an engine at a time (at most 512 MiB of raw rows)
Progress = Callable[[str, int, int, str], None]
# runner(encoder, columns, on_error, batches, directory, records) -> their BatchDones, in
# order; with records, each task writes its batch's completion record (`resume.save_batch`)
Runner = Callable[..., list]


@dataclass
class TokenizeResult:
    """What a run tokenized: counts, the shards and the manifest it wrote."""

    output: str
    manifest: dict
    lines: int = 0
    samples: int = 0
    tokens: int = 0
    trained: int = 0
    rejected: int = 0
    workers: int = 1
    engine: str = "local"  # "ray": the batches ran as tasks of that engine
    tokenizer_engine: str | None = None  # what tokenized the texts (None: a cached output)
    seconds: float = 0.0
    reused: bool = False  # a cached output, not tokenized by this run
    rebuilt: str | None = None  # why a cache entry found unsound was tokenized again
    batches_reused: int = 0  # batches a resumed run kept from the killed one
    rejects: list[str] = field(default_factory=list)
    inputs: list[dict] = field(default_factory=list)  # the raw files as this run was given them

    def report(self) -> dict:
        return {
            "output": self.output,
            "lines": self.lines,
            "samples": self.samples,
            "tokens": self.tokens,
            "trained_tokens": self.trained,
            "rejected": self.rejected,
            "workers": self.workers,
            "engine": self.engine,
            "tokenizer_engine": self.tokenizer_engine,
            "seconds": round(self.seconds, 3),
            "tokens_per_second": round(self.tokens / self.seconds) if self.seconds else None,
            "reused": self.reused,
            "batches_reused": self.batches_reused,
            "encoder": self.manifest.get("encoder"),
        }


def tokenize(
    inputs: Iterable[str | Path] | str | Path,
    output: str | Path,
    encoder,
    columns=None,
    *,
    workers: int | None = None,
    memory_budget: int | str | None = None,
    on_error: str = "error",
    overwrite: bool = False,
    progress: Progress | None = None,
    batch_rows: int = BATCH_ROWS,
    resume: bool = False,
    runner: Runner | None = None,
) -> TokenizeResult:
    """Tokenize raw records into `part-*.parquet` shards (`input_ids`, `labels`: list<int32>,
    labels -100 where nothing is trained) plus `tokenized.json`, under `output`.

    encoder: a `packer.tokenize.encode.Encoder` (its spec rebuilds it in each worker).
    columns: a `RawColumns` (default names when None). on_error: "error" stops at the first
    bad record and names it `FILE:LINE`; "skip" leaves bad records out and lists them in
    `rejects.txt`. memory_budget caps the workers (each takes up to ~512 MiB).
    resume: a killed run to the same output keeps the batches it finished (refused in one line
    when the inputs or options changed; `packer.tokenize.resume`). runner: the batches run as
    an engine's tasks instead of this machine's worker processes (`--engine ray`).
    An existing `output` is replaced only with `overwrite`, also one that appears while the
    run runs (another run's): without it, an `OutputError` and nothing written.
    """
    from packer.tokenize.records import RawColumns

    t0 = time.perf_counter()
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    columns = columns if columns is not None else RawColumns()
    on_error = A.choice(on_error, "on_error", ON_ERROR)
    overwrite = A.boolean(overwrite, "overwrite")
    n = _workers(workers, memory_budget)
    if not isinstance(output, (str, os.PathLike)) or not str(output):
        raise UsageError(f"{option('output')} must be a path, got {output!r}")
    target = Path(output)
    inputs = list(inputs)
    if inputs and all(isinstance(f, RawFile) for f in inputs):
        files = inputs  # expanded already
    else:
        files = raw_inputs(inputs, skip=target)
    out_dir.check_target(target, overwrite)
    options = (columns, on_error, n, progress, batch_rows, A.boolean(resume, "resume"), runner)
    result = _tokenize_files(files, target, encoder, options, overwrite, entry=False)
    result.output = str(output)
    result.seconds = time.perf_counter() - t0
    return result


def tokenize_entry(
    files: list[RawFile],
    entry: Path,
    encoder,
    columns,
    *,
    workers=None,
    memory_budget=None,
    on_error: str = "error",
    progress=None,
    resume: bool = False,
    runner=None,
) -> TokenizeResult:
    """`tokenize` into a tokenize cache entry (`packer.tokenize.cache`): an unsound entry there
    is replaced, and a sound one that another process completed meanwhile is kept (its bytes
    are this run's: `result.reused`). A user's output is never treated so."""
    t0 = time.perf_counter()
    on_error = A.choice(on_error, "on_error", ON_ERROR)
    n = _workers(workers, memory_budget)
    options = (columns, on_error, n, progress, BATCH_ROWS, bool(resume), runner)
    result = _tokenize_files(files, Path(entry), encoder, options, False, entry=True)
    result.output = str(entry)
    result.seconds = time.perf_counter() - t0
    return result


def _workers(workers, memory_budget) -> int:
    """Worker processes: as asked (all cores by default), fewer where the budget has no room."""
    requested = A.integer(workers, "workers", minimum=1, none=True) or available()
    budget = A.parse_size(memory_budget) if memory_budget is not None else None
    return max(1, min(requested, budget // WORKER_BYTES)) if budget else requested


def _tokenize_files(files, target: Path, encoder, options, overwrite: bool, entry: bool):
    columns, on_error, n, progress, batch_rows, resume, runner = options
    configure_workers(1 if n > 1 else None)  # the driver's own Arrow pools stay small
    key = resume_.run_key(files, encoder.fingerprint, columns, on_error, [batch_rows, BATCH_BYTES])
    tmp, _ = resume_.open_run(target, key, resume)
    try:
        with interrupt_once():
            result = _run(files, tmp, encoder, columns, on_error, n, progress, batch_rows, runner)
            if not result.samples:
                raise InputError(_nothing_tokenized(files, result))
            resume_.drop_records(tmp)
            manifest = _manifest(files, encoder, columns, on_error, result, tmp)
            placed = out_dir.finish(tmp, target, manifest, overwrite, entry=entry)
    except BaseException:
        out_dir.discard(tmp)
        raise
    result.manifest, result.inputs = manifest, describe_inputs(files)
    result.reused = not placed
    return result


def _nothing_tokenized(files: list[RawFile], result: TokenizeResult) -> str:
    """Why a run has no sample: an output of none would look complete and fail only at pack."""
    names = ", ".join(f.shown for f in files[:3]) + (
        f" and {len(files) - 3} more" if len(files) > 3 else ""
    )
    if not result.rejected:
        verb = "holds" if len(files) == 1 else "hold"
        return f"the dataset is empty: {names or 'the inputs'} {verb} no records"
    return (
        f"the dataset is empty: all {result.rejected:,} records were rejected"
        f" (the first: {result.rejects[0]})"
    )


def _run(files, tmp, encoder, columns, on_error, n, progress, batch_rows, runner):
    columns_read = list(dict.fromkeys(_column_names(columns)))

    def batches():
        for index, raw in enumerate(files):
            yield from read_batches(raw, index, columns_read, batch_rows, BATCH_BYTES)

    size = sum(raw.path.stat().st_size for raw in files)  # what `auto`'s choice weighs
    return tokenize_batches(
        batches(),
        tmp,
        encoder,
        columns,
        on_error,
        n,
        progress,
        records=True,
        runner=runner,
        input_bytes=size,
    )


def tokenize_batches(
    batches: Iterable,
    directory,
    encoder,
    columns,
    on_error: str,
    n: int,
    progress=None,
    *,
    records: bool = False,
    runner: Runner | None = None,
    input_bytes: int | None = None,
) -> TokenizeResult:
    """Tokenize `RawBatch`es into their shards in `directory` with `n` worker processes, at
    most one per batch to run (in this process where that is one), or through `runner` (an
    engine's tasks): what `tokenize` does with a file's batches, also for rows that come from
    elsewhere (`pack_dataset`'s 🤗 datasets).

    records: each finished batch leaves a completion record, and a batch whose record and shard
    are sound already (an adopted killed run's, `packer.tokenize.resume`) is kept, not run.
    The counts come back, in batch order whatever ran where; nothing is placed. input_bytes:
    the input files' size, where known (`Encoder.resolve_engine`)."""
    result = TokenizeResult(output="", manifest={}, workers=n)
    t0 = time.perf_counter()
    tmp = Path(directory)
    # the engine is resolved here, before any worker starts, and said once: each worker
    # gets the resolved one (`Encoder.spec`) and only compares its first batch's texts
    result.tokenizer_engine = encoder.resolve_engine(input_bytes=input_bytes).name
    _say(encoder.take_note())
    said = set()

    def add(done: BatchDone, fresh: bool = True, saved: bool = False) -> None:
        if fresh and done.note is not None and done.note not in said:
            said.add(done.note)  # a worker whose own first batch made `auto` fall back
            _say(done.note)
        if records and fresh:
            # an engine's task saved its record itself
            resume_.fault_point(tmp) if saved else resume_.save_batch(tmp, done)
        result.batches_reused += not fresh
        result.lines += done.lines
        result.samples += done.samples
        result.tokens += done.tokens
        result.trained += done.trained
        result.rejected += len(done.rejects)
        result.rejects.extend(done.rejects)
        if progress is not None:
            seconds = max(time.perf_counter() - t0, 1e-9)
            progress(
                "tokenize",
                result.lines,
                0,
                f"{result.lines:,} lines, {result.tokens / seconds:,.0f} tokens/s",
            )

    items = _with_kept(batches, tmp) if records else ((b, None) for b in batches)
    if runner is None and n > 1:
        items, n = _fewer_workers(items, n)
        result.workers = n
    if runner is not None:
        result.engine = getattr(runner, "name", "engine")
        for chunk in _chunked(items, RUNNER_CHUNK):
            todo = [batch for batch, kept in chunk if kept is None]
            ran = iter(runner(encoder, columns, on_error, todo, str(tmp), records) if todo else [])
            for _, kept in chunk:
                add(kept, False) if kept is not None else add(next(ran), saved=records)
        return result
    if n == 1:
        setup(encoder.spec, columns, on_error, encoder=encoder)
        for batch, kept in items:
            raise_if_interrupted()
            add(kept, False) if kept is not None else add(tokenize_batch(batch, str(tmp)))
        return result
    with worker_start(encoder) as (context, first):
        pool = WorkerPool(context, n, tokenize_batch, init_worker, (first, columns, on_error))
    try:
        pending: deque = deque()  # a kept batch's result, or a running one's ticket
        for batch, kept in items:
            pending.append(kept or pool.submit((batch, str(tmp)), _place(batch)))
            while len(pending) >= IN_FLIGHT * n:
                _add_next(pending, pool, add)
        while pending:
            _add_next(pending, pool, add)
        pool.close()
    finally:
        pool.terminate()  # stops the workers at once on an error or an interrupt
    return result


def _fewer_workers(items: Iterator[tuple], n: int) -> tuple[Iterator[tuple], int]:
    """No more workers than batches to run: an input of one batch (most small files) is
    tokenized in this process, without the second or so that starting workers costs. Peeks at
    up to `n` batches, no more than the `IN_FLIGHT * n` the pool holds anyway."""
    items = iter(items)
    head = list(itertools.islice(items, n))
    if len(head) < n:
        n = max(1, sum(kept is None for _, kept in head))
    return itertools.chain(head, items), n


def _say(line: str | None) -> None:
    """A line for the user on stderr (`auto`'s fallback to `hf`)."""
    if line is not None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _add_next(pending: deque, pool: WorkerPool, add) -> None:
    item = pending.popleft()
    add(item, False) if isinstance(item, BatchDone) else add(pool.result(item))


def _place(batch) -> str:
    """Where a batch's rows are: `raw.jsonl:1025-2048`, `raw.parquet:rows 1-1024`."""
    first, last = batch.lines[0], batch.lines[-1]
    rows = "rows " if batch.columnar else ""
    return f"{batch.shown}:{rows}{first}-{last}" if last != first else batch.where(0)


def _with_kept(batches: Iterable, tmp: Path) -> Iterator[tuple]:
    """(batch, its kept result or None) for each batch."""
    for batch in batches:
        kept = resume_.kept_batch(tmp, shard_name(batch.file_index, batch.batch_index))
        if kept is not None and (
            kept.lines != len(batch.lines) or kept.source != batch_digest(batch)
        ):
            kept = None  # not the batch this run cut, or its input bytes changed
        yield batch, kept


def _chunked(items: Iterator, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _column_names(columns) -> list[str]:
    from dataclasses import fields

    return [getattr(columns, f.name) for f in fields(columns)]


def describe_inputs(files: list[RawFile]) -> list[dict]:
    """The raw files as `tokenized.json` (and a packed output's `tokenized_from`) records them."""
    return [
        {"path": display(f.path) if f.fmt != "json" else f.shown, "format": f.fmt} for f in files
    ]


def _manifest(files: list[RawFile], encoder, columns, on_error, result, tmp: Path) -> dict:
    from dataclasses import asdict

    from packer.version import __version__

    shards = sorted(p.name for p in tmp.glob("part-*.parquet"))
    rejects = None
    if on_error == "skip":
        text = "".join(line + "\n" for line in result.rejects)
        (tmp / out_dir.REJECTS_TEXT).write_text(text, encoding="utf-8")
        rejects = {"file": out_dir.REJECTS_TEXT, "count": result.rejected}
        rejects["first"] = result.rejects[:SHOWN_REJECTS]
    return {
        "format": out_dir.FORMAT,
        "packer_version": __version__,
        "encoder": encoder.describe(),
        "columns": asdict(columns),
        "on_error": on_error,
        "inputs": describe_inputs(files),
        "shards": [
            {"file": name, hashing.DEFAULT: hashing.file_digest(tmp / name)} for name in shards
        ],
        "rejects": rejects,
        "stats": {
            "lines": result.lines,
            "samples": result.samples,
            "tokens": result.tokens,
            "trained_tokens": result.trained,
            "rejected": result.rejected,
        },
    }
