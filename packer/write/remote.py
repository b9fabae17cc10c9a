"""The commit of an output on object storage, where no directory can be renamed.

The run builds its output in a local temporary directory as every run does, then:

1. uploads every file under a run-unique name (`shard-00000.<run>.arrow`), each confirmed
   (the client's upload completed, then the object's size checked);
2. writes `manifest.json` last, listing those names, with a conditional write: if absent
   (`If-None-Match: *`) for a new output, if unchanged since the run started (`If-Match`) with
   `--overwrite`. Of two runs racing to one URL, one commits and the other is refused in one
   line and removes its files;
3. with `--overwrite`, deletes the previous run's files only after its manifest was replaced,
   together with the files of runs that died before committing.

Nothing a committed manifest lists is ever written again, and an exception or a kill before
step 2 leaves only files no manifest lists (readers ignore them; the next commit removes them).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from packer import storage
from packer.contract.names import MANIFEST
from packer.contract.remote import (
    is_run_file,
    listed_files,
    new_run_id,
    read_remote_manifest,
    run_file_name,
)
from packer.errors import UsageError, option
from packer.interrupts import commit_point
from packer.storage.progress import meter
from packer.storage.urls import redact
from packer.write.commit import stage_only


class RemoteOutput:
    """One run's output at a URL: checked before any work, committed by `commit`."""

    def __init__(self, text: str, overwrite: bool):
        self.url = storage.parse_url(text, option("output_dir", "--output"))
        self.shown = redact(str(self.url))
        self.store = storage.store_for(self.url)
        self.run = new_run_id()
        self.previous: dict | None = None
        self.version: str | None = None
        self.on_store: set[str] = set()  # files the run's tasks uploaded themselves (local names)
        self._check(overwrite)
        self.work = Path(tempfile.mkdtemp(prefix="packer-out-"))
        self.local = self.work / "output"
        stage_only(self.local)  # its local swap is not the commit point: the manifest's write is

    def _check(self, overwrite: bool) -> None:
        if self.url.protocol in ("s3", "gs") and self.store.entry(self.url.bucket) is None:
            raise UsageError("the bucket does not exist", where=self.shown)
        entry = self.store.entry(self.url.path) if self.url.path.strip("/") else None
        if entry is not None and not entry.is_dir:  # as a local output that is a file
            raise UsageError(
                "output path exists and is not a directory (an object)", where=self.shown
            )
        found = read_remote_manifest(self.url)
        if found is not None:
            if not overwrite:
                raise UsageError(
                    f"output exists; pass {option('overwrite=True', '--overwrite')} to replace it",
                    where=self.shown,
                )
            self.previous = found[0]
            self.version = self.store.version(self.url.child(MANIFEST).path)
            return
        foreign = [e for e in self.store.walk(self.url.path) if not is_run_file(_name(e.path))]
        if foreign:
            raise UsageError(
                "refusing to write into a prefix that holds objects and is not a packer output "
                "(no manifest.json)",
                where=self.shown,
            )

    def discard(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def commit(self) -> None:
        """Upload the run's files, then write the manifest last (conditionally)."""
        manifest = json.loads((self.local / MANIFEST).read_text(encoding="utf-8"))
        names = {n: run_file_name(n, self.run) for n in listed_files(manifest)}
        uploaded: list[str] = []
        committed = False
        try:
            for name, stored in names.items():
                if name in self.on_store:
                    continue
                path = self.url.child(stored).path
                source = self.local / name
                uploaded.append(path)
                self.store.upload(source, path, meter("upload", source.stat().st_size, stored))
            _rename_files(manifest, names)
            data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
            # the commit point: a signal before it leaves the previous output, after it the
            # run finishes (a library caller's own Ctrl-C handler gets it once it is done)
            with commit_point(self.shown):
                key = self.url.child(MANIFEST).path
                if self.version is None:
                    done = self.store.create(key, data)
                else:
                    done = self.store.replace(key, data, self.version)
                if not done:
                    raise UsageError(
                        "another run committed this output while this one was packing; "
                        "nothing of this run was kept",
                        where=self.shown,
                    )
                committed = True
        except BaseException:
            if not committed:  # after the commit, the uploaded files are the output
                self.store.delete(uploaded)
                self.delete_run()
            raise
        finally:
            self.discard()
        keep = set(names.values())
        stale = [
            e.path
            for e in self.store.walk(self.url.path)
            if is_run_file(_name(e.path))
            and _name(e.path) not in keep
            and e.path.rsplit("/", 1)[0] == self.url.path
        ]
        self.store.delete(stale)

    def delete_run(self) -> None:
        """Every file of this run on the store, except what a manifest committed meanwhile lists
        (a resumed run shares its id with the killed one, which may have committed after all)."""
        mark = f".{self.run}."
        try:
            found = read_remote_manifest(self.url)
        except Exception:  # noqa: BLE001 - cleaning up never hides the real error
            return
        keep = set(listed_files(found[0])) if found else set()
        mine = [
            e.path
            for e in self.store.walk(self.url.path)
            if mark in _name(e.path) and _name(e.path) not in keep
        ]
        self.store.delete(mine)


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _rename_files(manifest: dict, names: dict[str, str]) -> None:
    for shard in manifest["shards"]:
        shard["file"] = names[shard["file"]]
    for key in ("rejects", "split_labels"):
        entry = manifest.get(key)
        if isinstance(entry, dict) and entry.get("file") in names:
            entry["file"] = names[entry["file"]]


def upload_file(local: Path, text: str) -> None:
    """One whole file to URL `text` (a `pack_dataset` cache file): it exists there only once
    complete (a failed upload leaves no object), and its size is checked."""
    url = storage.parse_url(text, option("cache_file_name"))
    store = storage.store_for(url)
    store.upload(local, url.path, meter("upload", local.stat().st_size, redact(str(url))))
