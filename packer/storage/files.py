"""Input files by path or URL: random access for Parquet and Arrow (ranged reads on a store),
a stream for JSONL, and the size. Block tasks read their block of a remote input with these,
on whichever node they run, instead of a copy staged by the driver."""

from __future__ import annotations

import os

import pyarrow as pa

from packer.storage.stores import store_for
from packer.storage.urls import is_url, parse_url


def open_random(path: str) -> pa.NativeFile:
    """A random-access file: memory-mapped when local, ranged GETs on a store."""
    if not is_url(path):
        return pa.memory_map(str(path))
    url = parse_url(path)
    return store_for(url).fs.open_input_file(url.path)


def open_stream(path: str, compression: str | None) -> pa.NativeFile:
    """A sequential stream, decompressed on the fly."""
    if not is_url(path):
        return pa.input_stream(str(path), compression=compression)
    url = parse_url(path)
    return store_for(url).fs.open_input_stream(url.path, compression=compression)


def size(path: str) -> int:
    if not is_url(path):
        return os.stat(path).st_size
    url = parse_url(path)
    entry = store_for(url).entry(url.path)
    if entry is None:
        raise FileNotFoundError(f"no such object: {path}")
    return entry.size
