"""The cache-file writer: the packed rows as one Arrow IPC stream at a given path, written as
`Dataset.map` writes its cache files, and never seen partial.

The record batches are gathered into a few reused buffers and written by `write_shards` around
the page cache (`write.direct`). Writing 5 GiB into memory never touched before costs a page
fault per page (0.3-2 GiB/s on the development VM), and so does the page cache; reused buffers
that the device reads directly do not.
"""

from __future__ import annotations

import contextlib
import glob
import os
import uuid
from pathlib import Path

from packer.config import PackConfig
from packer.contract.names import TMP_MARK
from packer.errors import OutputError
from packer.interrupts import deferred_signals
from packer.planning.overlength import Segments
from packer.planning.strategies import Plan
from packer.read.samples import Samples
from packer.storage.local import pid_alive
from packer.write.commit import fsync_dir, os_reason
from packer.write.seq_lengths import SCHEMA_WITH_LENGTHS, packed_batch
from packer.write.shards import ShardFiles, write_shards

SYNC_BYTES = 256 << 20  # a cache file is flushed and leaves the page cache every 256 MiB


def _remove_stale(path: Path) -> None:
    """Remove the temporary files of earlier writes of `path` whose process has died."""
    prefix = f".{path.name}{TMP_MARK}"
    with contextlib.suppress(OSError):
        for entry in path.parent.glob(glob.escape(prefix) + "*"):
            pid = entry.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                entry.unlink(missing_ok=True)


def write_cache_file(
    samples: Samples, segs: Segments, pl: Plan, cfg: PackConfig, workers: int, path: Path
) -> tuple[int, int]:
    """Write the packed rows to `path` as one Arrow IPC stream; (loss tokens, tokens with
    padding).

    The record batches are those of the in-memory result, gathered into reused buffers and
    written by `write_shards` under a hidden temporary name beside `path`, around the page cache
    (or, where the file system refuses that, flushed and dropped from it as they go), and
    renamed to `path` once complete: `path` is never a partial file, and a failure leaves
    nothing. An existing `path` is replaced.
    """
    _remove_stale(path)
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    files = ShardFiles(
        schema=SCHEMA_WITH_LENGTHS,
        batch=packed_batch,
        one_file=True,
        sync_bytes=SYNC_BYTES,
        hashed=False,
        direct=True,
    )
    try:
        (entry,) = write_shards(
            samples,
            segs,
            pl,
            cfg,
            path.parent,
            workers=workers,
            names=lambda _: tmp.name,
            files=files,
        )
        with deferred_signals():
            os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OutputError(
                f"cannot write the packed dataset: {os_reason(exc)}; nothing was written",
                where=str(path),
            ) from None
        raise
    return entry["loss_tokens"], entry["tokens"]
