"""Column options against the inputs: every column a caller named is in every input file.

A typo in a column option must not pack something else: a labels column that is not there
would train every token, an input column that is not there would read nothing. The columns of
each file are read before any sample (Parquet and Arrow from their schema, JSONL from its first
line, and from its bytes when a key is not on it), so a wrong name is refused in one line before anything is written, with the columns that
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
_SCAN_BLOCK = 16 << 20


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
        shown = display(path)
        fmt, compression = detect_format(Path(str(path)))
        try:
            missing = _missing(path, fmt, compression, wanted)
        except (OSError, pa.ArrowException, ValueError):
            continue  # unreadable here: the reader names the problem
        if missing is not None:
            name, have, seen = missing
            raise missing_column(name, wanted[name], have, shown, seen)


def _missing(path, fmt: str, compression, wanted: dict[str, str]):
    """(the option, the file's columns, what they are) of the first wanted column the file
    lacks, or None.

    A JSONL file lacks a column when no line has its key. The first line's keys answer for
    almost every file; a key missing there is looked for in the whole file's bytes (a line
    that lacks it is then a bad sample, named by the reader, and `--on-error skip` skips it).
    """
    if fmt == "jsonl":
        have = _first_line_keys(path, compression)
        if have is None:
            return None
        for name, column in wanted.items():
            needle = json.dumps(column, ensure_ascii=False).encode()
            if column not in have and not _mentions(path, compression, needle):
                return name, have, "no line has it; line 1 has"
        return None
    have = pq.read_schema(_random(path)).names if fmt == "parquet" else _ipc_names(path)
    for name, column in wanted.items():
        if column not in have:
            return name, have, "it has"
    return None


def _mentions(path, compression: str | None, needle: bytes) -> bool:
    """Whether the file's bytes hold `needle` anywhere (read in blocks, never whole)."""
    tail = b""
    with open_input(path, compression) as stream:
        while True:
            block = stream.read(_SCAN_BLOCK)
            if not block:
                return False
            if needle in tail + block:
                return True
            tail = block[-len(needle) :]


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
        data = b""
        while len(data) < _FIRST_LINE_LIMIT:
            chunk = stream.read(1 << 16)
            data += chunk
            if b"\n" in data.lstrip() or not chunk:
                break
        else:
            return None
    first = data.lstrip().split(b"\n", 1)[0]
    if not first.strip():
        return None
    row = json.loads(first)
    return list(row) if isinstance(row, dict) else None
