"""Content hashes of the files packer writes, recorded in the manifest and checked by `verify`.

The default, xxh3_128, runs at memory speed (about 10 GB/s on one core here), where sha256
costs more than writing the bytes; it detects corruption and truncation, which is what the
manifest's hashes are for. `--hash sha256` is there when a cryptographic digest is required.
A manifest entry names its algorithm by key (`"xxh3_128": "…"` or `"sha256": "…"`).
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable
from pathlib import Path

import xxhash

ALGORITHMS: dict[str, Callable] = {
    "xxh3_128": xxhash.xxh3_128,
    "sha256": hashlib.sha256,
}
DEFAULT = "xxh3_128"


def new(algorithm: str = DEFAULT):
    return ALGORITHMS[algorithm]()


def file_digest(path: str | Path, algorithm: str = DEFAULT) -> str:
    """The file's digest, hashed from a memory map (no copy of the bytes: a quarter of the CPU
    time of reading them into buffers, 0.2 s against 0.87 s for 1.1 GB here)."""
    digest = new(algorithm)
    with open(path, "rb") as fh:
        try:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
                digest.update(view)
            return digest.hexdigest()
        except (ValueError, OSError):  # an empty file, or one that cannot be mapped
            pass
        while chunk := fh.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def recorded(entry: dict) -> tuple[str, str] | None:
    """(algorithm, hex digest) that a manifest entry records, or None."""
    for algorithm in ALGORITHMS:
        if algorithm in entry:
            return algorithm, entry[algorithm]
    return None
