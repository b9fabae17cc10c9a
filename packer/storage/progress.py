"""Bytes moved per file, reported to the caller's `progress(stage, done, total, label)`.

Downloads report as stage "download" and uploads as "upload", one file at a time: `done` and
`total` are that file's bytes, `label` its URL. The pipeline sets the callback for a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_progress: ContextVar[Callable | None] = ContextVar("packer_storage_progress", default=None)


@contextmanager
def reporting(progress: Callable | None) -> Iterator[None]:
    token = _progress.set(progress)
    try:
        yield
    finally:
        _progress.reset(token)


def meter(stage: str, total: int, label: str) -> Callable[[int], None] | None:
    """A callback taking byte counts for one file, or None when nobody listens."""
    progress = _progress.get()
    if progress is None:
        return None
    state = [0]
    progress(stage, 0, total, label)

    def on_bytes(n: int) -> None:
        state[0] += n
        progress(stage, min(state[0], total), total, label)

    return on_bytes
