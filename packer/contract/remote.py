"""A packer output on object storage: its run-unique file names, and a local copy to read.

On a store there is no directory rename, so the output is complete exactly when its
`manifest.json` exists; the manifest lists the run's files, each named with the run's id
(`shard-00000.0123456789ab.arrow`), so no later run ever rewrites bytes that a committed
manifest lists. Readers trust the manifest only: files it does not list are ignored, and a
prefix without a manifest is an incomplete output.

`local_copy` downloads the files a manifest lists into a local cache shared by the processes
of one machine (each file checked against the manifest's hash as it arrives, the manifest
last), so verify, inspect, repack and `PackedDataset` read it with the same code as a local
output.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from packer import hashing, storage
from packer.contract.manifest import incomplete_output, parse_manifest
from packer.contract.names import MANIFEST
from packer.errors import InputError, UsageError
from packer.storage.local import held_lock, private_name, remove_dead_parts
from packer.storage.progress import meter
from packer.storage.urls import Url, redact

_RUN = re.compile(r"^[^.]+\.[0-9a-f]{12}\.")


def new_run_id() -> str:
    return os.urandom(6).hex()


def run_file_name(name: str, run: str) -> str:
    """`shard-00000.arrow` of run `run` as it is stored: `shard-00000.<run>.arrow`."""
    stem, dot, rest = name.partition(".")
    return f"{stem}.{run}.{rest}" if dot else f"{name}.{run}"


def is_run_file(name: str) -> bool:
    """Whether a file name is one of a run's files on a store (listed by a manifest or not)."""
    return _RUN.match(name) is not None


def listed_files(manifest: dict) -> list[str]:
    """Every file a manifest lists: the shards, then rejects and split labels when present."""
    names = [s["file"] for s in manifest["shards"]]
    for key in ("rejects", "split_labels"):
        entry = manifest.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("file"), str):
            names.append(entry["file"])
    return names


def read_remote_manifest(url: Url) -> tuple[dict, bytes] | None:
    """(manifest, its bytes) of the output at `url`, or None when there is no manifest."""
    store = storage.store_for(url)
    data = store.read_bytes(url.child(MANIFEST).path)
    if data is None:
        return None
    return parse_manifest(data, Path(str(url.child(MANIFEST)))), data


def incomplete(url: Url) -> InputError:
    """The one line for a prefix without a manifest: a run's files there (a run that did not
    finish, or is still running: `incomplete_output`), other objects only, or nothing."""
    store = storage.store_for(url)
    entries = store.walk(url.path)
    if any(has_run_file(url, e.path) for e in entries):
        return incomplete_output(redact(str(url)))
    if entries:
        return InputError("no manifest.json: not a packer output", where=redact(str(url)))
    return InputError(
        "no packer output here (no manifest.json, no objects)", where=redact(str(url))
    )


def has_run_file(url: Url, path: str) -> bool:
    """Whether the object at `path` is a run's file of the output at `url` (directly in it)."""
    directory, _, name = path.rpartition("/")
    return directory == url.path.rstrip("/") and is_run_file(name)


def cache_root() -> Path:
    return Path(os.environ.get("PACKER_CACHE_DIR") or Path(tempfile.gettempdir()) / "packer-cache")


CACHE_VERSION = "2"  # copies made before downloads were checked against the hashes: not reused


def local_copy(text: str, check_store: bool = False) -> Path:
    """A local directory holding the output at URL `text` as its manifest lists it.

    The copy is kept under `PACKER_CACHE_DIR` (default: the system's temp directory) in a
    directory named by the URL and the manifest's hash, and reused while the manifest is the
    same. Any number of processes may ask for the same copy at once: one downloads while the
    others wait (`held_lock`), each file is checked against the manifest's hash as it arrives
    and placed under its name only when it matches, and the manifest is placed last, so a copy
    cut short is completed by the next reader and a file at its name is never replaced.

    check_store (`verify`): every listed object is read from the store again, its size and
    hash checked against the manifest, also where the copy holds it already: what is proved
    is what the store holds, not what it held when the copy was made (a full download).
    """
    url = storage.parse_url(text)
    if url.protocol == "file":
        return Path(url.path)
    found = read_remote_manifest(url)
    if found is None:
        raise incomplete(url)
    manifest, data = found
    key = hashlib.sha256(f"{CACHE_VERSION}\0{url}\0".encode() + data).hexdigest()[:20]
    local = cache_root() / key
    storage.names.register(local, str(url))
    if _copied(local, data) and not check_store:
        return local
    local.mkdir(parents=True, exist_ok=True)
    with held_lock(local / ".lock"):
        if check_store:
            _fetch_listed(url, manifest, local, again=True)
        if not _copied(local, data):  # another process may have finished it meanwhile
            remove_dead_parts(local)
            _fetch_listed(url, manifest, local)
            part = private_name(local / MANIFEST)
            try:
                part.write_bytes(data)
                os.replace(part, local / MANIFEST)
            finally:
                part.unlink(missing_ok=True)
    return local


def _copied(local: Path, data: bytes) -> bool:
    try:
        return (local / MANIFEST).read_bytes() == data
    except OSError:
        return False


def _listed_entries(manifest: dict) -> dict[str, dict]:
    """Each listed file's manifest entry (its size and hash), by name."""
    entries = {s["file"]: s for s in manifest["shards"] if isinstance(s, dict)}
    for key in ("rejects", "split_labels"):
        entry = manifest.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("file"), str):
            entries[entry["file"]] = entry
    return entries


def _fetch_listed(url: Url, manifest: dict, local: Path, again: bool = False) -> None:
    """Download every file the manifest lists that the copy lacks, each checked on arrival;
    `again`: every file, its size on the store and its bytes checked against the manifest (a
    file the copy holds already stays: the bytes were the same)."""
    store = storage.store_for(url)
    entries = _listed_entries(manifest)
    for name in listed_files(manifest):
        if "/" in name or name in ("", ".", ".."):
            raise UsageError(
                f"manifest.json lists a file outside the output: {name!r}", where=redact(str(url))
            )
        entry = store.entry(url.child(name).path)
        if entry is None:
            raise InputError(
                f"{name}: listed in the manifest but missing on the store", where=redact(str(url))
            )
        recorded_size = entries.get(name, {}).get("bytes")
        if isinstance(recorded_size, int) and recorded_size != entry.size:
            raise InputError(
                f"the object holds {entry.size:,} bytes but its manifest records "
                f"{recorded_size:,} (it changed after the output was written)",
                where=redact(str(url.child(name))),
            )
        target = local / name
        if not again and target.is_file() and target.stat().st_size == entry.size:
            continue  # placed by an earlier reader after its hash matched
        recorded = hashing.recorded(entries.get(name, {}))
        digest = None
        if recorded and recorded[0] in hashing.ALGORITHMS:
            digest = (hashing.ALGORITHMS[recorded[0]], recorded[1])
        store.download(
            url.child(name).path,
            target,
            meter("download", entry.size, name),
            digest=digest,
            exclusive=True,
        )
