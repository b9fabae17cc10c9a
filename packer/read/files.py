"""Input files: what the INPUT arguments name, the format of each, and a cheap fingerprint.

`expand_inputs` is the first step of every read: plain files, directories and globs become one
sorted list of data files, and packer's own outputs are left out or refused (`packer.contract.outputs`).
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from packer.contract.manifest import incomplete_output
from packer.contract.outputs import (
    PackedInputError,
    has_contract_schema,
    is_incomplete_output,
    is_packer_output,
    is_work_dir,
    refuse,
    repack_hint,
)
from packer.errors import InputError, UsageError
from packer.read.remote import expand_url
from packer.storage import display, is_url, parse_url

_SUFFIXES = {
    ".jsonl": ("jsonl", None),
    ".ndjson": ("jsonl", None),
    ".jsonl.gz": ("jsonl", "gzip"),
    ".ndjson.gz": ("jsonl", "gzip"),
    ".jsonl.zst": ("jsonl", "zstd"),
    ".ndjson.zst": ("jsonl", "zstd"),
    ".parquet": ("parquet", None),
    ".arrow": ("arrow", None),
    ".feather": ("arrow", None),
    ".ipc": ("arrow", None),
}
_GLOB_CHARS = set("*?[")


class NamedTwice(UsageError, InputError):
    """A file the INPUT arguments name twice (itself twice, or itself and a directory or glob
    that holds it): a usage error (exit 2), and an `InputError` for a caller that catches it."""

    def __init__(self, where: str):
        super().__init__("the same file is named twice in the inputs", where=where)


def detect_format(path: Path) -> tuple[str, str | None]:
    """(format, compression) from the file name; raises for names packer cannot read."""
    name = path.name.lower()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return _SUFFIXES[suffix]
    known = ", ".join(sorted(_SUFFIXES))
    raise InputError(f"unknown file type (expected one of {known})", where=str(path))


def _is_data_file(path: Path) -> bool:
    try:
        detect_format(path)
    except InputError:
        return False
    return not path.name.startswith(".")


class InputFiles(list):
    """Input files already expanded and checked: expanding them again returns them as they are."""


def expand_inputs(
    inputs: Iterable[str | Path],
    skip: Path | str | None = None,
    skipped: list[Path] | None = None,
    stage: bool = True,
) -> InputFiles:
    """Files named by the inputs: plain files, directories (recursive) and globs, each sorted.

    Packer's own outputs are never inputs: directories and globs leave out `skip` (the output
    being written), the hidden work directories of runs, and every directory holding a packer
    manifest (listed in `skipped`). A packer output, or a file with the packed-row columns,
    named as an INPUT is refused (`PackedInputError`): its rows are already packed.

    URLs (`s3://bucket/prefix/`, globs too) are listed on their store by the same rules and
    staged locally (`packer.read.remote`); `file://` URLs are plain paths. With `stage=False`
    (block runs, whose tasks read their blocks from the store) they stay URLs (strings).
    """
    if isinstance(inputs, InputFiles):
        return inputs
    remote_skip = None
    if isinstance(skip, str) and is_url(skip):
        remote_skip, skip = parse_url(skip).path, None
    excluded = _Excluded(Path(skip) if skip is not None else None)
    files: list[Path] = []
    for item in inputs:
        text = str(item)
        if is_url(text):
            url = parse_url(text, "INPUT")
            if url.protocol != "file":
                files.extend(expand_url(text, remote_skip, skipped, detect_format, stage))
                continue
            text = url.path
        path = Path(text)
        if path.is_dir():
            if is_packer_output(path):
                raise refuse(path)
            if is_incomplete_output(path):
                raise incomplete_output(text)
            found = excluded.walk(path, skipped)
            if not found:
                raise InputError("directory holds no .jsonl, .parquet or .arrow files", where=text)
            files.extend(found)
        elif _GLOB_CHARS & set(text) and not path.exists():
            matches = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
            found = [p for p in matches if not excluded.holds(p, skipped)]
            if matches and not found:
                raise PackedInputError(
                    f"every match is inside a packer output ({repack_hint()})", where=text
                )
            if not found:
                raise InputError("no file matches this pattern", where=text)
            files.extend(found)
        elif path.is_file():
            detect_format(path)
            if is_packer_output(path.parent):
                raise refuse(path, "a shard of one")
            if is_incomplete_output(path.parent):
                raise incomplete_output(str(path.parent))
            files.append(path)
        elif path.exists():
            raise InputError("not a regular file", where=text)
        elif is_incomplete_output(path):  # a run to it has not committed yet
            raise incomplete_output(text)
        else:
            raise InputError("no such file or directory", where=text)
    if not files:
        raise InputError("no input files given")
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = _identity(f)
        if key in seen:
            raise NamedTwice(display(f))
        seen.add(key)
        if has_contract_schema(f, detect_format(Path(f))[0]):
            raise refuse(
                display(f), "it has the packed-row columns cu_seqlens, position_ids, sample_index"
            )
        unique.append(f)
    return InputFiles(unique)


def check_local_inputs(inputs: Iterable[str | Path]) -> None:
    """Refuse a local input that does not exist (or a glob matching nothing), as
    `expand_inputs` would: a cheap first check, so that a missing input is reported before
    anything about the output."""
    if isinstance(inputs, InputFiles):
        return
    for item in inputs:
        text = str(item)
        if is_url(text):
            continue
        path = Path(text)
        if path.exists() or is_incomplete_output(path):
            continue
        if _GLOB_CHARS & set(text):
            if not glob.glob(text, recursive=True):
                raise InputError("no file matches this pattern", where=text)
            continue
        raise InputError("no such file or directory", where=text)


def _identity(f: Path | str):
    """What names one input once: a URL (read in place, or the URL of a staged copy), else the
    resolved path."""
    if isinstance(f, str):
        return f
    return display(f) if display(f) != str(f) else f.resolve()


class _Excluded:
    """Which directories an expansion leaves out; answers are cached per directory."""

    def __init__(self, skip: Path | None):
        self.skip = skip.resolve() if skip is not None else None
        self.cache: dict[Path, bool] = {}

    def __call__(self, directory: Path) -> bool:
        hit = self.cache.get(directory)
        if hit is None:
            hit = (
                is_work_dir(directory)
                or (self.skip is not None and directory.resolve() == self.skip)
                or is_packer_output(directory)
            )
            if not hit and is_incomplete_output(directory):
                raise incomplete_output(str(directory))  # neither skipped nor read: refused
            self.cache[directory] = hit
        return hit

    def _note(self, directory: Path, skipped: list[Path] | None) -> None:
        if skipped is not None and not is_work_dir(directory) and directory not in skipped:
            skipped.append(directory)

    def walk(self, top: Path, skipped: list[Path] | None) -> list[Path]:
        found = []
        for root, dirs, names in os.walk(top):
            base = Path(root)
            keep = []
            for d in sorted(dirs):
                if self(base / d):
                    self._note(base / d, skipped)
                else:
                    keep.append(d)
            dirs[:] = keep
            found.extend(p for p in (base / n for n in names) if p.is_file() and _is_data_file(p))
        return sorted(found)

    def holds(self, path: Path, skipped: list[Path] | None) -> bool:
        for parent in path.parents:
            if parent != Path(".") and self(parent):
                self._note(parent, skipped)
                return True
        return False


def fingerprint(path: Path | str) -> str:
    """A cheap content fingerprint: sha256 over the size and up to three 1 MiB blocks.

    Hashing whole multi-GB inputs would cost more than packing them; the sampled blocks catch
    truncated, regenerated or swapped files, which is what a manifest reader needs to notice.
    A URL (a remote input read by the block tasks) is read with three ranged GETs: the same
    bytes, the same fingerprint as a local copy.
    """
    block = 1 << 20
    if isinstance(path, str) and is_url(path):
        from packer.storage.files import open_random

        with open_random(path) as fh:
            size = fh.size()
            digest = hashlib.sha256(str(size).encode())
            for start in sorted({0, max(0, size // 2 - block // 2), max(0, size - block)}):
                digest.update(fh.read_at(min(block, size - start), start))
        return "sha256-sampled:" + digest.hexdigest()
    size = path.stat().st_size if isinstance(path, Path) else os.stat(path).st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        for start in sorted({0, max(0, size // 2 - block // 2), max(0, size - block)}):
            fh.seek(start)
            digest.update(fh.read(block))
    return "sha256-sampled:" + digest.hexdigest()
