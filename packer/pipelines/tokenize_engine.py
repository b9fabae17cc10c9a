"""Tokenizing on an engine: `packer pack RAW --tokenizer --engine ray` runs each batch of raw
rows as a task (`packer.engines`), as the block pipeline runs its blocks.

The driver reads the raw files and cuts the batches exactly as a local run does
(`packer.tokenize.files`); each task builds the encoder once per worker process from its spec
(one tokenizer per process: a shared one stops scaling) and writes its batch's shard into the
run's temporary directory, which must be on storage every node sees, as `--engine ray`'s output
is. The shards are named by input file and batch, so they are the local run's bytes; each task
writes its batch's completion record after the shard, and those are what `--resume` keeps.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

from packer.engines import open_engine
from packer.tokenize.forking import ONE_THREAD
from packer.tokenize.resume import save_batch
from packer.tokenize.run import WORKER_BYTES
from packer.tokenize.worker import BatchDone, setup, tokenize_batch

_ready: dict = {}  # this worker process's encoder key: (fingerprint, columns, on_error)


def tokenize_task(
    spec: dict, columns, on_error: str, batch, directory: str, records: bool
) -> BatchDone:
    """One batch, on a worker process (its encoder built at the first batch it gets); with
    `records`, its completion record is written here, once the shard is, so that a driver
    lost while tasks run keeps every batch finished by then."""
    key = (spec["fingerprint"], columns, on_error)
    if _ready.get("key") != key:
        for name, value in ONE_THREAD.items():  # one core per task, as a local worker's
            os.environ.setdefault(name, value)
        setup(spec, columns, on_error)
        _ready["key"] = key
    done = tokenize_batch(batch, directory)
    if records:
        save_batch(Path(directory), done, driver=False)
    return done


class EngineRunner:
    """`tokenize`'s runner on the engine `name`, opened at its first batches (a tokenize cache
    hit starts no Ray) and closed by `close`."""

    def __init__(self, name: str, address: str | None, workers: int):
        self.name, self.address, self.workers = name, address, workers
        self.stack = ExitStack()
        self.engine = None

    def __call__(
        self, encoder, columns, on_error: str, batches: list, directory: str, records: bool
    ) -> list:
        if self.engine is None:
            self.engine = self.stack.enter_context(
                open_engine(self.name, self.address, self.workers)
            )
        spec = encoder.spec
        calls = [(spec, columns, on_error, batch, directory, records) for batch in batches]
        return self.engine.map(tokenize_task, calls, memory=WORKER_BYTES)

    def close(self) -> None:
        self.engine = None
        self.stack.close()
