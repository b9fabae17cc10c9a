"""How many cores packer uses: one setting for Arrow's thread pools and packer's own threads.

`--workers N` (or `pack(..., workers=N)`) caps every pool: Arrow's CPU pool (Parquet and JSON
decoding), its I/O pool, the validation threads of the readers and the shard-writing overlap.
"""

from __future__ import annotations

import os

_workers: int | None = None


def available() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def configure(workers: int | None) -> int:
    """Set the worker count for this process (None: every available core); return it."""
    global _workers
    n = max(1, int(workers)) if workers else available()
    _workers = n
    import pyarrow as pa

    pa.set_cpu_count(n)
    pa.set_io_thread_count(max(1, n))
    return n


def current() -> int:
    """The configured worker count (every available core until `configure` is called)."""
    return _workers if _workers is not None else available()
