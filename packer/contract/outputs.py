"""Recognise packer's own outputs among the inputs, so that packed rows are never packed again.

A packed row holds several samples in one attention span, with positions that do not restart:
read back as one "sample", it is exactly the cross-contamination packing must prevent. The
common way to get there is a Makefile that writes its output inside its input directory, so a
rerun (or any later run over the same tree) would pick up the first run's shards.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packer.contract.manifest import has_leftovers, packer_manifest
from packer.contract.names import WORK_MARKS
from packer.contract.schema import PACKED_MARKERS
from packer.errors import UsageError, option


def repack_hint() -> str:
    return f"use {option('repack=True', '--repack')} to re-pack its samples"


class PackedInputError(UsageError):
    """A packer output was given where samples were expected."""


def is_packer_output(directory: Path) -> bool:
    return packer_manifest(directory) is not None


def is_incomplete_output(directory: Path) -> bool:
    """A run's output that has no manifest yet (killed, or still being written): its shards
    are packed rows, and its spill files half of a block's samples, never input."""
    return not is_packer_output(directory) and has_leftovers(directory)


def is_work_dir(directory: Path) -> bool:
    """A run's hidden temporary, cache or previous-output directory beside its output."""
    name = directory.name
    return name.startswith(".") and any(mark in name for mark in WORK_MARKS)


def has_contract_schema(path: Path | str, fmt: str) -> bool:
    """Whether a Parquet or Arrow file has the packed-row columns (read from its schema only)."""
    if isinstance(path, str):  # a remote input, read in place (`packer.storage.files`)
        from packer.storage.files import open_random

        opened = open_random
    else:
        opened = lambda p: pa.memory_map(str(p))  # noqa: E731
    try:
        if fmt == "parquet":
            with opened(path) as source:
                names = pq.read_schema(source).names
        elif fmt == "arrow":
            with opened(path) as source:
                try:
                    names = pa.ipc.open_file(source).schema.names
                except pa.ArrowInvalid:
                    source.seek(0)
                    names = pa.ipc.open_stream(source).schema.names
        else:
            return False
    except (pa.ArrowInvalid, OSError):
        return False  # the reader reports what is wrong with the file
    return set(names) >= PACKED_MARKERS


def refuse(where: Path, why: str = "its rows are already packed") -> PackedInputError:
    return PackedInputError(
        f"{option('inputs', 'INPUT')} is a packer output ({why}); {repack_hint()}", where=str(where)
    )
