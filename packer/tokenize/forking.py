"""How a tokenize run starts its worker processes: forked where this process runs no other
thread (each gets a copy of the loaded tokenizer, no import and no load), else spawned; either
way with their tokenizers on one thread each (`ONE_THREAD`: one process per core)."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

ONE_THREAD = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
_forking = False  # set while the pool forks: its children take the workers' signals


def _worker_signals() -> None:
    """In a forked worker, at once: SIGTERM ends it (the pool's `terminate`) and Ctrl-C is the
    driver's. Otherwise the driver's handlers, inherited, raised in the worker's start-up
    before its initializer ran and printed a traceback (a run that failed at once)."""
    if _forking:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_worker_signals)


@contextmanager
def worker_start(encoder) -> Iterator[tuple]:
    """(context, what each worker builds its encoder from) while the pool starts.

    On Linux the workers are forked: each gets its own copy of the loaded tokenizer, with no
    import and no load (about 3 s per worker here, a third of a 20,000-line run).
    `TOKENIZERS_PARALLELISM=false` and `RAYON_NUM_THREADS=1` (fastokens' thread pool) while
    they start keep each worker's tokenizer single-threaded (one process per core) and keep
    `tokenizers` from warning about the fork. Elsewhere they are spawned and rebuild the
    encoder from its spec, and so they are where this process runs other threads already (a notebook, a Ray driver, a test runner): a fork copies their locks
    held, and a worker that blocks on one never ends, not even on the pool's SIGTERM."""
    global _forking
    if sys.platform == "linux" and threading.active_count() == 1:
        with _one_thread_tokenizers():
            _forking = True
            try:
                yield multiprocessing.get_context("fork"), encoder
            finally:
                _forking = False
        return
    with _without_main(), _one_thread_tokenizers():
        yield multiprocessing.get_context("spawn"), encoder.spec


@contextmanager
def _one_thread_tokenizers() -> Iterator[None]:
    """The environment of a worker's tokenizers (`ONE_THREAD`) while workers start: one
    process per core, each engine on one thread. Restored after."""
    saved = {k: os.environ.get(k) for k in ONE_THREAD}
    os.environ.update(ONE_THREAD)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _without_main() -> Iterator[None]:
    """Spawn workers that do not import this process's `__main__`: the `packer` script would
    import the whole CLI into each (typer, rich: a second of start-up apiece) and install its
    signal handlers there. The workers need only `packer.tokenize.worker`."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main and k in main.__dict__}
    for key in saved:
        setattr(main, key, None) if key == "__spec__" else delattr(main, key)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(main, key, value)
