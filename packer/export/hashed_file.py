"""A file that hashes what is written to it, so an export's manifest needs no read-back."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import xxhash


class HashedFile:
    """A binary file open for writing whose bytes are hashed (xxh3_128) as they pass; `sink` is
    the same file as a pyarrow stream, for Arrow IPC and Parquet writers, and closing it closes
    the file."""

    def __init__(self, path: Path):
        self.name = path.name
        self._fh = open(path, "wb")  # noqa: SIM115  closed by close()
        self._hash = xxhash.xxh3_128()
        self.sink = pa.PythonFile(self, mode="w")

    # the methods pa.PythonFile calls on a writable file
    def write(self, data) -> int:
        self._hash.update(data)
        return self._fh.write(data)

    def tell(self) -> int:
        return self._fh.tell()

    def flush(self) -> None:
        self._fh.flush()

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def close(self) -> None:
        """Called by `sink.close()`, which is how a user closes it; `digest` stays readable."""
        self._fh.close()

    def digest(self) -> str:
        return self._hash.hexdigest()
