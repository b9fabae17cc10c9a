"""Reading progress in bytes of the input files, for the bars `packer pack` draws on a terminal.

JSONL is parsed from one stream per file, so the bytes the parser has pulled are the only sign
of progress inside a large file: `open_input` counts them while a meter is active (only while
progress is shown; otherwise it is the plain Arrow stream). Parquet files are decoded a row
group or a batch at a time and report their share of the file's bytes (`ParquetMeter`), so a
large one moves from its first second; Arrow files are memory-mapped and count when done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import pyarrow as pa

from packer.storage.urls import is_url

_meter: ContextVar[Callable[[int], None] | None] = ContextVar("packer_read_meter", default=None)


class _Counting:
    """A binary file whose reads report their size."""

    def __init__(self, path: Path, on_bytes: Callable[[int], None]):
        self._file = open(path, "rb")  # noqa: SIM115 (closed through the Arrow stream)
        self._on_bytes = on_bytes
        self._pos = 0
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        data = self._file.read(n)
        self._pos += len(data)
        self._on_bytes(len(data))
        return data

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        """Arrow seeks to learn the size before a whole read(); only reads are counted."""
        self._pos = self._file.seek(offset, whence)
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._file.close()
        self.closed = True


def open_input(path: Path, compression: str | None):
    """An Arrow input stream over `path`, counted when a meter is active."""
    on_bytes = _meter.get()
    if isinstance(path, str) and is_url(path):  # a block of a remote input, read by its task
        from packer.storage.files import open_stream

        return open_stream(path, compression)
    if on_bytes is None:
        return pa.input_stream(str(path), compression=compression)
    stream = pa.PythonFile(_Counting(path, on_bytes), mode="r")
    return pa.CompressedInputStream(stream, compression) if compression else stream


class ParquetMeter:
    """Reports a Parquet file's bytes in proportion to the rows decoded so far (a no-op when no
    meter is active)."""

    def __init__(self, path, num_rows: int):
        self._on_bytes = _meter.get()
        self._size = Path(path).stat().st_size if self._on_bytes is not None else 0
        self._rows, self._num_rows, self._reported = 0, max(num_rows, 1), 0

    @property
    def active(self) -> bool:
        return self._on_bytes is not None

    def rows_done(self, rows: int) -> None:
        if self._on_bytes is None:
            return
        self._rows += rows
        now = self._size * min(self._rows, self._num_rows) // self._num_rows
        self._on_bytes(now - self._reported)
        self._reported = now


@contextmanager
def metering(on_bytes: Callable[[int], None] | None) -> Iterator[None]:
    """Count the bytes `open_input` streams read, while inside this block."""
    token = _meter.set(on_bytes)
    try:
        yield
    finally:
        _meter.reset(token)
