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

from packer import hashing
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


def unsound(directory: Path, manifest: dict) -> str | None:
    """Why a tokenized output cannot be used as its `tokenized.json` describes it, in words (a
    listed shard missing or with other bytes than its recorded hash, a shard it does not list);
    None when every listed shard is there with its hash. A tokenize cache entry is checked so
    as it is read: xxh3 of memory-mapped shards, 25 to 55 ms per 100 MB in the page cache
    here (`scripts/bench_trust_checks.py`)."""
    listed = manifest.get("shards")
    if not isinstance(listed, list):
        return f"its {TOKENIZED} lists no shards"
    names = set()
    for entry in listed:
        name = entry.get("file") if isinstance(entry, dict) else None
        recorded = hashing.recorded(entry) if isinstance(entry, dict) else None
        if not isinstance(name, str) or "/" in name or not name or recorded is None:
            return f"its {TOKENIZED} is malformed (a shard without a name or a hash)"
        try:
            digest = hashing.file_digest(Path(directory) / name, recorded[0])
        except OSError:
            return f"{name} is missing"
        if digest != recorded[1]:
            return f"{name} does not match the hash its {TOKENIZED} records"
        names.add(name)
    extra = sorted(p.name for p in Path(directory).glob("part-*.parquet") if p.name not in names)
    return f"{extra[0]} is not listed in its {TOKENIZED}" if extra else None


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


def finish(tmp: Path, output: Path, manifest: dict, overwrite: bool, entry: bool = False) -> bool:
    """Write `tokenized.json` last, flush, and rename the directory into place.

    A user's output is put only where nothing is (`overwrite` replaces one): a directory that
    appeared while the run ran (another run's output, a `mkdir`) is left as it is, `tmp` is
    removed and the run fails in one line. The directory is claimed by `mkdir`, which only one
    process can do, and `tmp` renamed over the claim. `entry`: the output is a tokenize cache
    entry (`packer.tokenize.cache`); False (and `tmp` removed) when another process completed a
    sound one meanwhile, whose bytes are this run's; an unsound one is replaced."""
    with open(tmp / TOKENIZED, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
        fh.write("\n")
    for item in tmp.iterdir():
        fd = os.open(item, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if entry and not overwrite and (output.exists() or output.is_symlink()):
        found = read_tokenized(output)  # None also for a link to nothing
        overwrite = found is None or unsound(output, found) is not None
    with commit_point(str(output)):
        if overwrite and (output.exists() or output.is_symlink()):
            old = output.parent / f".{output.name}{TMP_MARK}{os.getpid()}-old"
            os.rename(output, old)
            os.rename(tmp, output)
            if old.is_symlink() or not old.is_dir():  # a link goes, never what it points to
                old.unlink()
            else:
                shutil.rmtree(old, ignore_errors=True)
            return True
        try:
            output.mkdir()  # the claim: fails where anything is
            os.rename(tmp, output)  # over the claim, still empty
        except OSError:
            discard(tmp)
            found = read_tokenized(output) if entry else None
            if found is not None and unsound(output, found) is None:
                return False
            raise OutputError(
                "output directory appeared while tokenizing (another run's, or one made "
                "meanwhile); it is left as it is and nothing was written: pass "
                f"{option('overwrite=True', '--overwrite')} to replace it",
                where=str(output),
            ) from None
    return True
