"""The packer output an export reads: one version of it, every shard checked as it is read.

`pack --overwrite` swaps a new directory into place and deletes the old one, so a reader that
opens shards by path one at a time can mix two versions. `open_source` opens the directory,
reads its manifest and opens every shard the manifest lists before any row is read: open files
outlive the swap, so every byte comes from the version whose manifest the export names.

Each shard is hashed while its record batches are read (the export reads every byte anyway:
the hash is not a second pass) and its digest compared with the manifest's at the shard's end,
so a shard changed after packing fails the export, which commits only after every shard passed.
On object storage the output is copied locally first (its files carry the run's id, so a copy
is of one version); a copy cut short because the output was replaced is taken once more.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer import hashing
from packer.contract.manifest import no_manifest, parse_manifest
from packer.contract.names import MANIFEST
from packer.contract.remote import local_copy, read_remote_manifest
from packer.contract.shards import ShardArrays, arrays_from_table
from packer.errors import InputError, PackerError, UsageError
from packer.export.rows import RowBatch, row_batch, row_runs
from packer.storage import display, is_url, parse_url

CHANGED = (
    "the output changed while it was read (a pack --overwrite of it?); export it once nothing "
    "writes it"
)


@dataclass
class Source:
    """A committed packer output: its directory, manifest, and an open file per listed shard."""

    directory: Path
    manifest: dict
    manifest_bytes: bytes
    name: str = ""  # as the user gave it (a URL without its credentials), for the manifest
    files: dict[str, int] = field(default_factory=dict)  # shard name -> open descriptor
    copied: bool = False  # a local copy of an output on a store
    shards: list[str] = field(init=False)  # the shard files, in the manifest's order
    entries: dict[str, dict] = field(init=False)  # shard file -> its manifest entry

    def __post_init__(self) -> None:
        self.shards = [entry["file"] for entry in self.manifest["shards"]]
        self.entries = {entry["file"]: entry for entry in self.manifest["shards"]}

    @property
    def rows(self) -> int:
        """The rows the manifest records (its shards', else its statistics')."""
        if all("rows" in entry for entry in self.manifest["shards"]):
            return sum(int(entry["rows"]) for entry in self.manifest["shards"])
        return int(self.manifest.get("stats", {}).get("rows", 0))

    def reading(self, name: str) -> ShardReading:
        """Shard `name` read once, front to back, hashed as it goes."""
        entry, where = self.entries[name], str(self.directory / name)
        return ShardReading(self.files[name], entry, where, self.copied)

    def batches_of(self, name: str, max_tokens: int | None = None) -> Iterator[RowBatch]:
        """The rows of shard `name`, one record batch at a time, or in runs of consecutive rows
        of at most `max_tokens` tokens (a longer row alone) when a memory budget asks for it."""
        return self.reading(name).batches(max_tokens)

    def max_token_id(self) -> int:
        """The largest input id of the output (a pass over the shards' `input_ids` only; the
        export's own pass checks the shards' digests)."""
        top = 0
        for name in self.shards:
            for part in self.reading(name).arrays(hashed=False):
                if part.ids.size:
                    top = max(top, int(part.ids.max()))
        return top

    def close(self) -> None:
        for fd in self.files.values():
            os.close(fd)
        self.files = {}


class ShardReading:
    """One shard file, mapped from its open descriptor and read front to back: `arrays` hashes
    each record batch's bytes before yielding it and `check` compares the digest at the end."""

    def __init__(self, fd: int, entry: dict, where: str, copied: bool = False):
        self.where, self.entry = where, entry
        self.changed = "the shard changed after packing" + (
            " (or the local copy of it in the cache, PACKER_CACHE_DIR: remove that copy to "
            "fetch the shard again)"
            if copied
            else ""
        )
        self.size = os.fstat(fd).st_size
        if "bytes" in entry and self.size != int(entry["bytes"]):
            raise InputError(
                f"{self.size} bytes where manifest.json records {entry['bytes']}: "
                f"{self.changed}; nothing was written",
                where=where,
            )
        if self.size == 0:
            raise InputError("an empty file, not an Arrow IPC stream", where=where)
        self.buffer = pa.py_buffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
        self.recorded = hashing.recorded(entry)
        self.digest = hashing.new(self.recorded[0]) if self.recorded else None
        self.hashed = 0

    def _hash_to(self, end: int) -> None:
        if self.digest is not None and end > self.hashed:
            self.digest.update(memoryview(self.buffer)[self.hashed : end])
            self.hashed = end

    def check(self) -> None:
        """Raise InputError when the shard's bytes differ from the manifest's digest (the bytes
        not read yet are hashed first): called at its end, and on any failure while it was read,
        so a changed shard is named as that, not by what its change broke."""
        if self.digest is None:
            return
        self._hash_to(self.size)
        if self.digest.hexdigest() != self.recorded[1]:
            raise InputError(
                f"its {self.recorded[0]} differs from manifest.json: {self.changed}; "
                "nothing was written",
                where=self.where,
            )

    def arrays(self, hashed: bool = True) -> Iterator[ShardArrays]:
        """The shard's record batches as zero-copy arrays (one empty batch for a shard without
        any), each hashed before it is yielded; checked against the manifest at the end."""
        name = Path(self.where).name
        if not hashed:
            self.digest = None
        stream = pa.BufferReader(self.buffer)
        try:
            reader = pa.ipc.open_stream(stream)
            first = 0
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                self._hash_to(stream.tell())
                yield arrays_from_table(pa.Table.from_batches([batch]), name, first)
                first += batch.num_rows
            if first == 0:
                yield arrays_from_table(reader.schema.empty_table(), name)
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            self.check()
            raise InputError(f"not a readable shard ({exc})", where=self.where) from None
        self.check()

    def batches(self, max_tokens: int | None = None) -> Iterator[RowBatch]:
        """`arrays` as the exporters' row batches (runs of at most `max_tokens` tokens)."""
        try:
            for part in self.arrays():
                for lo, hi in row_runs(np.diff(part.ids_off.astype(np.int64)), max_tokens):
                    whole = (lo, hi) == (0, part.rows)
                    yield row_batch(part if whole else part.rows_slice(lo, hi))
        except PackerError:
            self.check()
            raise


def open_source(directory: str | Path) -> Source:
    """The output in `directory` (a path, or a URL: then a local copy of the files its
    manifest lists), with its manifest and every shard it lists open (one line if it is not
    an output, or changed while it was opened)."""
    name = str(directory)
    copied = is_url(name)
    if copied:
        directory = _copied(name)
        name = display(name)
    source = _opened(Path(directory), name)
    source.copied = copied
    if source.manifest["config"].get("pairs"):
        source.close()
        raise UsageError(
            "a pairs output (pack --pairs) holds preference pairs, which these formats would "
            "train as separate samples; train it with packer.torch (docs/pairs.md)",
            where=name,
        )
    return source


def _copied(text: str) -> Path:
    """The local copy of the output at URL `text`; taken again once if the output was replaced
    while it was copied (its old files deleted under the copy)."""
    url = parse_url(text)
    for _ in range(2):
        before = read_remote_manifest(url)
        try:
            return local_copy(text)
        except (PackerError, OSError):
            if read_remote_manifest(url) == before:
                raise
    raise InputError(CHANGED, where=display(text))


def _opened(directory: Path, name: str) -> Source:
    """`directory`'s manifest and shards, all opened through one open directory: a swap of
    the output while they are opened is noticed and the new version opened instead."""
    for _ in range(3):
        if not directory.is_dir():
            raise no_manifest(directory)
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        files: dict[str, int] = {}
        try:
            data = _read_at(dir_fd, directory, MANIFEST)
            if data is None:
                if _moved(directory, dir_fd):
                    continue
                raise no_manifest(directory)
            manifest = parse_manifest(data, directory / MANIFEST)
            _allow_open_files(len(manifest["shards"]), name or str(directory))
            for entry in manifest["shards"]:
                files[entry["file"]] = _open_at(dir_fd, directory, entry["file"])
            return Source(directory, manifest, data, name, files)
        except FileNotFoundError as exc:
            for fd in files.values():
                os.close(fd)
            if _moved(directory, dir_fd):
                continue
            raise InputError(
                "a shard the manifest lists is missing", where=str(directory / exc.filename)
            ) from None
        except BaseException:
            for fd in files.values():
                os.close(fd)
            raise
        finally:
            os.close(dir_fd)
    raise InputError(CHANGED, where=name or str(directory))


def _allow_open_files(shards: int, where: str) -> None:
    """Raise the soft open-file limit (up to the hard one) so that every shard can be held open
    with room to spare; one line when the hard limit is too low."""
    try:
        import resource
    except ImportError:  # not POSIX: opened as far as the system allows
        return
    need = shards + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise InputError(
            f"the output has {shards} shards and export holds every one open while it reads "
            f"(one version of the output), but the open-file limit is {hard}: raise it "
            "(ulimit -n) or repack with fewer, larger shards",
            where=where,
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _open_at(dir_fd: int, directory: Path, name: str) -> int:
    if "/" in name or name in ("", ".", ".."):
        raise UsageError(f"manifest.json lists a file outside the output: {name!r}")
    try:
        if os.open in os.supports_dir_fd:
            return os.open(name, os.O_RDONLY, dir_fd=dir_fd)
        return os.open(directory / name, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(2, "missing", name) from None


def _read_at(dir_fd: int, directory: Path, name: str) -> bytes | None:
    try:
        fd = _open_at(dir_fd, directory, name)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _moved(directory: Path, dir_fd: int) -> bool:
    """Whether `directory` names another directory now (or nothing) than the one open."""
    try:
        st = os.stat(directory)
    except OSError:
        return True
    here = os.fstat(dir_fd)
    return (st.st_dev, st.st_ino) != (here.st_dev, here.st_ino)
