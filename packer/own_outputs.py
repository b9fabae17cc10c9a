"""Recognise packer's own outputs among the inputs, so that packed rows are never packed again.

A packed row holds several samples in one attention span, with positions that do not restart:
read back as one "sample", it is exactly the cross-contamination packing must prevent. The
common way to get there is a Makefile that writes its output inside its input directory, so a
rerun (or any later run over the same tree) would pick up the first run's shards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packer.errors import UsageError, option

MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"  # written with --on-error skip: one JSON line per rejected sample
# The source labels that split points overwrite with -100 (see `packer.write.manifest`).
SPLIT_LABELS = "split_labels.jsonl"
# Marks of the hidden siblings an output directory has while a run writes it (a run's temporary
# output and cache, a replaced output; see `packer.write.commit`).
TMP_MARK = ".packer-tmp-"
OLD_MARK = ".packer-old-"
WORK_MARKS = (TMP_MARK, OLD_MARK)
# Columns of the output contract that a sample dataset never has together.
CONTRACT_COLUMNS = frozenset({"cu_seqlens", "position_ids", "sample_index"})


def repack_hint() -> str:
    return f"use {option('repack=True', '--repack')} to re-pack its samples"


class PackedInputError(UsageError):
    """A packer output was given where samples were expected."""


def read_manifest(directory: Path) -> dict | None:
    """The packer manifest of `directory`, or None when it holds none."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and "packer_version" in data and "shards" in data:
        return data
    return None


def is_packer_output(directory: Path) -> bool:
    return read_manifest(directory) is not None


def is_work_dir(directory: Path) -> bool:
    """A run's hidden temporary, cache or previous-output directory beside its output."""
    name = directory.name
    return name.startswith(".") and any(mark in name for mark in WORK_MARKS)


def has_contract_schema(path: Path, fmt: str) -> bool:
    """Whether a Parquet or Arrow file has the packed-row columns (read from its schema only)."""
    try:
        if fmt == "parquet":
            names = pq.read_schema(path).names
        elif fmt == "arrow":
            with pa.memory_map(str(path)) as source:
                try:
                    names = pa.ipc.open_file(source).schema.names
                except pa.ArrowInvalid:
                    source.seek(0)
                    names = pa.ipc.open_stream(source).schema.names
        else:
            return False
    except (pa.ArrowInvalid, OSError):
        return False  # the reader reports what is wrong with the file
    return set(names) >= CONTRACT_COLUMNS


def refuse(where: Path, why: str = "its rows are already packed") -> PackedInputError:
    return PackedInputError(
        f"{option('inputs', 'INPUT')} is a packer output ({why}); {repack_hint()}", where=str(where)
    )
