"""The tokenized output directory: built in a hidden sibling, complete only once renamed.

Its files: `part-FFFFF-BBBBBB.parquet` shards (input file F, batch B: named by input order,
never by worker, so `packer pack DIR` reads the samples in input order), `tokenized.json`
(written last: what was tokenized, with which tokenizer and template) and, with
`on_error="skip"`, `rejects.txt` (one `FILE:LINE: what` per record left out). The manifest is
not `manifest.json`, so `packer pack` reads this directory as plain Parquet input.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from packer.contract.names import TMP_MARK
from packer.errors import OutputError, UsageError, option
from packer.interrupts import begin_output, commit_point, deferred_signals
from packer.storage.local import pid_alive

TOKENIZED = "tokenized.json"
REJECTS_TEXT = "rejects.txt"
FORMAT = "packer-tokenized/1"


def shard_name(file_index: int, batch_index: int) -> str:
    return f"part-{file_index:05d}-{batch_index:06d}.parquet"


def read_tokenized(directory: Path) -> dict | None:
    """The `tokenized.json` of a complete tokenized output, or None."""
    try:
        data = json.loads((Path(directory) / TOKENIZED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def check_target(output: Path, overwrite: bool) -> None:
    """Refuse, before any work, an output that cannot be (re)placed."""
    if output.exists() or output.is_symlink():
        if not output.is_dir():
            raise UsageError("output path exists and is not a directory", where=str(output))
        if not overwrite:
            raise UsageError(
                f"output directory exists; pass {option('overwrite=True', '--overwrite')} to "
                "replace it",
                where=str(output),
            )
        if read_tokenized(output) is None and any(output.iterdir()):
            raise UsageError(
                f"refusing to overwrite a non-empty directory that is not a tokenized output "
                f"(no {TOKENIZED})",
                where=str(output),
            )


def start(output: Path) -> Path:
    """The hidden temporary directory beside `output` (a killed run's ones are removed)."""
    begin_output()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(output)
        tmp = output.parent / f".{output.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError as exc:
        raise OutputError(
            f"cannot create a temporary directory: {exc}", where=str(output)
        ) from None
    return tmp


def _remove_stale(output: Path) -> None:
    prefix = f".{output.name}{TMP_MARK}"
    for entry in output.parent.iterdir():
        if entry.name.startswith(prefix):
            pid = entry.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


def discard(tmp: Path) -> None:
    with deferred_signals():
        shutil.rmtree(tmp, ignore_errors=True)


def finish(tmp: Path, output: Path, manifest: dict, overwrite: bool) -> bool:
    """Write `tokenized.json` last, flush, and rename the directory into place. False (and
    `tmp` removed) when, without `overwrite`, an output appeared meanwhile: a cache entry that
    another process completed first."""
    with open(tmp / TOKENIZED, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
        fh.write("\n")
    for entry in tmp.iterdir():
        fd = os.open(entry, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    with commit_point(str(output)):
        if output.exists():
            if not overwrite:
                discard(tmp)
                return False
            old = output.parent / f".{output.name}{TMP_MARK}{os.getpid()}-old"
            os.rename(output, old)
            os.rename(tmp, output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, output)
    return True
