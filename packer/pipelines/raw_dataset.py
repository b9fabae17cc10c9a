"""`pack_dataset(..., tokenizer=...)`: raw rows held in memory (a 🤗 `datasets.Dataset`, an
`IterableDataset`, an Arrow table of chats, texts, prompt/completion, ShareGPT or Alpaca
columns, as TRL's SFT users hold them) tokenized before they are packed.

The rows go through what `packer tokenize` runs on a Parquet file's rows: the same batches of
`BATCH_ROWS` rows, the same decoding (`decode_rows`), checks and `Encoder`, in worker
processes (`tokenize_batches`, one tokenizer each), into Parquet shards in a temporary
directory that are read back in row order. So the ids and labels are those `packer pack RAW
--tokenizer` packs for the same records in a JSONL file, and a bad row is named `row N` (its
index in the dataset, as `ds[N]` reads it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packer import arguments as A
from packer.arguments import DEFAULT_INPUT, DEFAULT_LABELS
from packer.errors import InputError, UsageError, option
from packer.tokenize.files import BATCH_ROWS, RawBatch
from packer.tokenize.run import tokenize_batches

TRAIN_ON = ("assistant", "last", "all")
_TEXT_MARKS = ("{%", "{{")  # a chat_template string holding these is the template itself


@dataclass
class RowBatch(RawBatch):
    """A batch of a dataset's rows: a bad one is `row N`, N its index in the dataset."""

    def where(self, i: int) -> str:
        return f"row {self.lines[i]}"


@dataclass
class Tokenized:
    """The tokenized samples (`input_ids`, `labels`), the rows left out (`row N: what`) and
    the encoder's fingerprint."""

    table: pa.Table
    rejects: list[str]
    fingerprint: str


class RawTokenizer:
    """An encoder for `pack_dataset`'s options, and the temporary directory its tokenizer or
    template lives in when given as an object or as text (removed by `close`)."""

    def __init__(
        self,
        tokenizer,
        chat_template,
        train_on,
        allow_empty_mask,
        raw_columns,
        tokenizer_engine: str = "auto",
    ):
        from packer.tokenize.encode import Encoder
        from packer.tokenize.records import RawColumns

        self.tmp: Path | None = None
        self.columns = _columns(raw_columns, RawColumns())
        try:
            if isinstance(tokenizer, Encoder):
                given = chat_template is not None or train_on is not None or allow_empty_mask
                if given or tokenizer_engine != "auto":
                    raise UsageError(
                        "chat_template, train_on, allow_empty_mask and tokenizer_engine are the "
                        "Encoder's own: give them to Encoder(...), not with it"
                    )
                self.encoder = tokenizer
                return
            source = self._source(tokenizer)
            template = self._template(chat_template)
            train_on = A.choice(train_on or "assistant", "train_on", TRAIN_ON)
            self.encoder = Encoder(
                source, template, train_on, allow_empty_mask, tokenizer_engine=tokenizer_engine
            )
        except BaseException:
            self.close()
            raise

    def _dir(self) -> Path:
        if self.tmp is None:
            self.tmp = Path(tempfile.mkdtemp(prefix="packer-raw-"))
            # a stream never read to its end leaves it to the garbage collector
            weakref.finalize(self, shutil.rmtree, str(self.tmp), True)
        return self.tmp

    def _source(self, tokenizer) -> str:
        """A directory or hub name as given; a tokenizer object saved to a temporary directory
        (each worker process loads it from there)."""
        if isinstance(tokenizer, (str, os.PathLike)):
            return os.fspath(tokenizer)
        if callable(getattr(tokenizer, "save_pretrained", None)):
            path = self._dir() / "tokenizer"
            tokenizer.save_pretrained(str(path))
            return str(path)
        raise UsageError(
            "tokenizer must be a tokenizer directory, a hub name, a transformers tokenizer or "
            f"a packer Encoder, got {type(tokenizer).__name__}"
        )

    def _template(self, chat_template) -> str | None:
        """A template file's path; a template given as text written to a file first."""
        if chat_template is None or isinstance(chat_template, os.PathLike):
            return None if chat_template is None else os.fspath(chat_template)
        if not isinstance(chat_template, str) or not chat_template:
            raise UsageError(
                f"{option('chat_template')} must be a template file or the template's text, "
                f"got {chat_template!r}"
            )
        if not any(mark in chat_template for mark in _TEXT_MARKS):
            return chat_template
        path = self._dir() / "chat_template.jinja"
        path.write_text(chat_template, encoding="utf-8")
        return str(path)

    def close(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def _columns(raw_columns, default):
    """`RawColumns` with `raw_columns` ({"messages": "dialog"}) renamed."""
    if raw_columns is None:
        return default
    keys = {f.name for f in fields(default)}
    if not isinstance(raw_columns, dict) or not all(
        k in keys and isinstance(v, str) and v for k, v in raw_columns.items()
    ):
        raise UsageError(
            f"raw_columns must map kinds ({', '.join(sorted(keys))}) to column names, "
            f"got {raw_columns!r}"
        )
    return replace(default, **raw_columns)


@contextmanager
def raw_tokenizer(*options):
    """A `RawTokenizer(*options)` for the call, its temporary files removed at the end."""
    raw = RawTokenizer(*options)
    try:
        yield raw
    finally:
        raw.close()


def check_unused(
    tokenizer, chat_template, train_on, allow_empty_mask, raw_columns, tokenizer_engine="auto"
) -> None:
    """Tokenizer options without a tokenizer are a mistake, not something to ignore."""
    if tokenizer is not None:
        return
    given = {
        "chat_template": chat_template is not None,
        "train_on": train_on is not None,
        "allow_empty_mask": bool(allow_empty_mask),
        "raw_columns": raw_columns is not None,
        "tokenizer_engine": tokenizer_engine != "auto",
    }
    for name, present in given.items():
        if present:
            raise UsageError(f"{name} needs tokenizer= (data holds raw chats or text)")


def check_token_options(cfg, labels) -> None:
    """Options for token data that raw rows cannot take."""
    if labels is not None:
        raise UsageError("labels= is for token lists; with tokenizer= data holds raw rows")
    if cfg.input_column != DEFAULT_INPUT or (cfg.labels_column or None) != DEFAULT_LABELS:
        raise UsageError(
            "input_column and labels_column name token columns; with tokenizer= the raw rows "
            "are tokenized into input_ids and labels (raw_columns renames raw columns)"
        )


def add_raw_rejects(stats: dict, rejects: list[str], cfg) -> None:
    """The raw rows left out by `on_error="skip"` (`row N: what`), in the stats."""
    if cfg.on_error == "skip":
        stats["raw_rejected"] = len(rejects)
        stats["raw_rejects"] = rejects


def tokenize_table(
    table: pa.Table, raw: RawTokenizer, on_error: str, workers: int, first_row: int = 0
) -> Tokenized:
    """The rows of `table` tokenized, in order; rows are numbered from `first_row`."""
    names = [getattr(raw.columns, f.name) for f in fields(raw.columns)]
    present = [c for c in dict.fromkeys(names) if c in table.column_names]
    if not present:
        raise InputError(
            f"data has none of the raw columns ({', '.join(dict.fromkeys(names))}); "
            f"its columns: {', '.join(table.column_names) or 'none'}"
        )
    table = table.select(present)
    batches = _batches(table, first_row)  # cut as the workers take them
    n = max(1, workers)  # no more workers than batches: `tokenize_batches` sees to it
    directory = Path(tempfile.mkdtemp(prefix="packer-raw-shards-"))
    try:
        result = tokenize_batches(
            batches, directory, raw.encoder, raw.columns, on_error, n, input_bytes=table.nbytes
        )
        shards = sorted(directory.glob("part-*.parquet"))
        if shards:
            tokenized = pq.read_table(shards, memory_map=False)
            tokenized = tokenized.combine_chunks()  # owned by this process, not the files
        else:
            empty = pa.array([], pa.list_(pa.int32()))
            tokenized = pa.table({"input_ids": empty, "labels": empty})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return Tokenized(tokenized, result.rejects, raw.encoder.fingerprint)


def _batches(table: pa.Table, first_row: int) -> Iterator[RowBatch]:
    """Batches of `BATCH_ROWS` rows, as `packer tokenize` cuts a Parquet file."""
    for index, offset in enumerate(range(0, table.num_rows, BATCH_ROWS)):
        batch = table.slice(offset, BATCH_ROWS).combine_chunks().to_batches()[0]
        lines = list(range(first_row + offset, first_row + offset + batch.num_rows))
        yield RowBatch(0, index, "data", lines, batch, columnar=True)


def tokenize_stream(
    tables: Iterable[pa.Table], raw: RawTokenizer, on_error: str, rejects: list[str]
) -> Iterator[pa.Table]:
    """Each table of an iterable's rows tokenized in this process, rows numbered across them;
    the rows left out are added to `rejects`."""
    first = 0
    for table in tables:
        done = tokenize_table(table, raw, on_error, 1, first)
        first += table.num_rows
        rejects.extend(done.rejects)
        yield done.table
