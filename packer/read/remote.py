"""Remote INPUTs: URLs, directories (prefixes) and globs listed on the store, then staged.

Listing follows the local rules: a prefix is walked recursively, a glob matches as `glob.glob`
with `recursive=True` does, files are sorted by URL, packer's own outputs (prefixes holding a
`manifest.json`, and the run files of an output that never committed) are skipped inside
prefixes and globs and refused when named. Each file is then copied to a local staging
directory (removed when the process exits), which every reader reads as a local file; the copy
is registered under its URL, so manifests and messages name the URL.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from packer import storage
from packer.contract.manifest import incomplete_output
from packer.contract.names import MANIFEST
from packer.contract.outputs import PackedInputError, refuse, repack_hint
from packer.contract.remote import has_run_file, is_run_file
from packer.errors import InputError
from packer.storage.progress import meter
from packer.storage.urls import Url, redact

_GLOB_CHARS = set("*?[")
_stage: list[Path] = []


def stage_dir() -> Path:
    """This process's staging directory (under `PACKER_STAGE_DIR` or the temp directory)."""
    if not _stage:
        root = os.environ.get("PACKER_STAGE_DIR") or None
        if root:
            Path(root).mkdir(parents=True, exist_ok=True)
        _stage.append(Path(tempfile.mkdtemp(prefix="packer-stage-", dir=root)))
        atexit.register(shutil.rmtree, _stage[0], True)
    return _stage[0]


def glob_pattern(pattern: str) -> re.Pattern:
    """A regex matching store paths as `glob.glob(pattern, recursive=True)` matches files."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def expand_url(
    text: str,
    skip: str | None,
    skipped: list | None,
    detect: Callable[[Path], tuple],
    stage: bool = True,
) -> list:
    """The staged local copies of every data file URL `text` names (sorted by URL);
    `detect` is the format detection that raises for a name packer cannot read. With
    `stage=False`, the URLs themselves (strings), for tasks that read them from the store."""

    def is_data(name: str) -> bool:
        try:
            detect(Path(name))
        except InputError:
            return False
        return True

    url = storage.parse_url(text, "INPUT")
    store = storage.store_for(url)
    shown = redact(text)
    if _GLOB_CHARS & set(url.path):
        first = min(url.path.index(c) for c in _GLOB_CHARS if c in url.path)
        base = url.path[:first].rsplit("/", 1)[0]
        regex = glob_pattern(url.path)
        entries = [e for e in store.walk(base) if regex.match(e.path)]
        found = _keep(store, entries, base, skip, skipped, is_data, named=None)
        if entries and not found:
            raise PackedInputError(
                f"every match is inside a packer output ({repack_hint()})", where=shown
            )
        if not found:
            raise InputError("no object matches this pattern", where=shown)
    else:
        entry = store.entry(url.path)
        if entry is None:
            raise store_missing(store, url, shown)
        if entry.is_dir:
            if store.entry(url.child(MANIFEST).path) is not None:
                raise refuse(shown)
            entries = store.walk(url.path)
            if any(has_run_file(url, e.path) for e in entries):
                raise incomplete_output(shown)  # a run's files, never samples
            found = _keep(store, entries, url.path, skip, skipped, is_data, url.path)
            if not found:
                raise InputError("prefix holds no .jsonl, .parquet or .arrow files", where=shown)
        else:
            parent = url.path.rsplit("/", 1)[0]
            if store.entry(f"{parent}/{MANIFEST}") is not None:
                raise refuse(shown, "a shard of one")
            try:
                detect(Path(url.name))
            except InputError as exc:
                raise InputError(exc.problem, where=shown) from None
            found = [entry]
    if not stage:
        return [_unstaged(url.with_path(e.path)) for e in found]
    return [_staged(store, url.with_path(e.path), e.size) for e in found]


def _unstaged(url: Url) -> str:
    """A remote input read in place: its URL, registered so that the path the readers make of
    it (`Path("s3://b/k")` is `s3:/b/k`) is named by the URL in messages and the manifest."""
    text = redact(str(url))
    storage.names.register(Path(text), text)
    return text


def store_missing(store, url: Url, shown: str) -> InputError:
    """'no such object' or, when the bucket itself is missing, 'the bucket does not exist'."""
    if url.protocol in ("s3", "gs") and store.entry(url.bucket) is None:
        return InputError("the bucket does not exist", where=shown)
    return InputError("no such object or prefix", where=shown)


def _keep(store, entries, base: str, skip, skipped, is_data, named) -> list:
    """Data files among `entries`, leaving out packer outputs (noted in `skipped`), the
    output being written, run files of uncommitted outputs and hidden names."""
    outputs = {e.path.rsplit("/", 1)[0] for e in entries if e.path.endswith("/" + MANIFEST)}
    if skip:
        outputs.add(skip.rstrip("/"))
    keep = []
    for e in entries:
        parents = [str(p) for p in PurePosixPath(e.path).parents]
        inside = [p for p in parents if p in outputs]
        name = e.path.rsplit("/", 1)[-1]
        if inside:
            _note(store, inside[-1], skip, skipped)
            continue
        if is_run_file(name):
            _note(store, e.path.rsplit("/", 1)[0], skip, skipped)
            continue
        if name.startswith(".") or not is_data(name):
            continue
        keep.append(e)
    return keep


def _note(store, path: str, skip, skipped) -> None:
    text = redact(f"{store.protocol}://{path}")
    if skipped is not None and path != (skip or "").rstrip("/") and text not in skipped:
        skipped.append(text)


def _staged(store, url: Url, size: int) -> Path:
    """A local copy of `url`, under a directory of its own (the file name kept for its format)."""
    directory = Path(tempfile.mkdtemp(dir=stage_dir()))
    local = directory / url.name
    store.download(url.path, local, meter("download", size, redact(str(url))))
    storage.names.register(local, redact(str(url)))
    return local
