"""Column options against the inputs: every column a caller named is in every input file.

A typo in a column option must not pack something else: a labels column that is not there
would train every token, an input column that is not there would read nothing. The columns of
each file are read before any sample (Parquet and Arrow from their schema, JSONL from its first
line), so a wrong name is refused in one line before anything is written, with the columns that
are there and the closest one. The default labels column (`DEFAULT_LABELS`) is read when a file
has it; a labels column that was named must be in every file, and in every JSONL line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packer.arguments import missing_column, named
from packer.config import PackConfig
from packer.read.files import detect_format
from packer.read.progress import open_input
from packer.storage import display, is_url

_FIRST_LINE_LIMIT = 64 << 20  # a first JSONL line longer than this is left to the reader


def sample_columns(input_column: str, labels_column: str | None) -> dict[str, str]:
    """The columns a read of samples needs: option name -> column."""
    wanted = {"input_column": input_column}
    if labels_column and named(labels_column):
        wanted["labels_column"] = labels_column
    return wanted


def wanted_columns(cfg: PackConfig) -> dict[str, str]:
    """The column options a run reads that the inputs must have: option name -> column."""
    if cfg.pairs:
        return {
            "prompt_column": cfg.prompt_column,
            "chosen_column": cfg.chosen_column,
            "rejected_column": cfg.rejected_column,
        }
    return sample_columns(cfg.input_column, cfg.labels_column)


def check_columns(files: list[Path | str], cfg: PackConfig) -> None:
    """Refuse (`OptionError`, before reading) a column option that names a column some input
    file does not have."""
    check_files(files, wanted_columns(cfg))


def check_files(files: list[Path | str], wanted: dict[str, str]) -> None:
    """`check_columns` for the columns `wanted` (option name -> column)."""
    for path in files:
        have, where = file_columns(path)
        if have is None:
            continue  # unreadable here: the reader names the problem
        for name, column in wanted.items():
            if column not in have:
                raise missing_column(name, column, have, where)


def file_columns(path: Path | str) -> tuple[list[str] | None, str]:
    """(the column names of one input file, how to name where they were read), or None for the
    names when they cannot be read cheaply (the reader then says why)."""
    shown = display(path) if not isinstance(path, str) else path
    fmt, compression = detect_format(Path(str(path)))
    try:
        if fmt == "parquet":
            return pq.read_schema(_random(path)).names, shown
        if fmt == "arrow":
            return _ipc_names(path), shown
        return _first_line_keys(path, compression), f"{shown} line 1"
    except (OSError, pa.ArrowException, ValueError, UnicodeDecodeError):
        return None, shown


def _random(path: Path | str):
    if isinstance(path, str) and is_url(path):
        from packer.storage.files import open_random

        return open_random(path)
    return str(path)


def _ipc_names(path: Path | str) -> list[str]:
    source = _random(path)
    source = pa.memory_map(source) if isinstance(source, str) else source
    try:
        return pa.ipc.open_file(source).schema.names
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_stream(source).schema.names


def _first_line_keys(path: Path | str, compression: str | None) -> list[str] | None:
    """The keys of the first non-blank line of a JSONL file (None when it is no JSON object)."""
    with open_input(path, compression) as stream:
        buffered = pa.BufferedInputStream(stream, 1 << 16)
        data = b""
        while len(data) < _FIRST_LINE_LIMIT:
            chunk = buffered.read(1 << 16)
            data += chunk
            line = data.lstrip()
            if b"\n" in line or not chunk:
                break
        else:
            return None
    first = data.lstrip().split(b"\n", 1)[0]
    if not first.strip():
        return None
    row = json.loads(first)
    return list(row) if isinstance(row, dict) else None
