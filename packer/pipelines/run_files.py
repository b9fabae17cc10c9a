"""Where a block run's files live while it runs: the hidden temporary output on a file system
(`LocalRun`), or the output's own prefix on object storage (`StoreRun`).

A task writes its files into a private local directory (`scratch`), then `publish`es them:
renamed into the temporary output, or uploaded under the run's names beside the output
(`shard-b00012-000.<run>.arrow`, the spill file `tail-b00012.<run>.arrow`), each upload
confirmed. Only then is its completion record written (`save`): to a private name renamed into
place, or as one PUT, so that a record is whole or absent and always describes files that are
there. The driver reads the records back (`kept`) to keep what a killed run finished.

On a store the records live beside the output because a cluster's driver may die with its
node: a rerun from any machine finds them there. Every one of those names is a run file
(`packer.contract.remote.is_run_file`): readers ignore it, an input listing skips it, and the
next commit to the output deletes it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packer import storage
from packer.contract.names import BLOCK_WORK
from packer.contract.remote import is_run_file, listed_files, run_file_name
from packer.pipelines import resume
from packer.storage.options import carried, carry_in

WORK = BLOCK_WORK  # inside a local temporary output: spill files, records, task directories
RUN = "run.json"
READERS = 16  # records read at once from a store


def spill_name(block: int, width: int) -> str:
    return f"tail-b{block:0{width}d}.arrow"


def record_name(task: str) -> str:
    """A task's record as a file name on a store (`done-b00012.json`, then the run's id)."""
    return f"done-{task}.json"


@dataclass
class LocalRun:
    """The run's temporary output on a file system every task sees (`packer.write.commit`)."""

    tmp: str
    settings: dict = field(default_factory=carried, repr=False)  # for inputs read in place

    def enter(self) -> None:
        """Called first in every task: the driver's store settings, for the remote inputs a
        task reads and the files it uploads."""
        carry_in(self.settings)

    def scratch(self, name: str) -> Path:
        """A task's private directory for the files it writes, before `publish`.

        `WORK` is made by the driver: a task of a dead driver whose output was adopted by a
        resumed run (a rename) fails here instead of recreating the old path."""
        work = Path(self.tmp) / WORK / f"work-{name}-{os.urandom(4).hex()}"
        work.mkdir()
        return work

    def publish(self, work: Path) -> None:
        """Rename a task's finished files into place (a retry writes the same bytes)."""
        for entry in sorted(work.iterdir()):
            dest = Path(self.tmp) / (WORK if entry.name.startswith("tail-") else "")
            os.replace(entry, dest / entry.name)
        work.rmdir()

    def spill(self, name: str, into: Path) -> Path:
        """A block's spill file, readable here (`into`: where a copy would go)."""
        return Path(self.tmp) / WORK / name

    def save(self, task: str, files: list[dict], result: dict) -> None:
        resume.save_task(Path(self.tmp), task, files, result)

    def start(self, key: dict) -> None:
        resume.start_run(Path(self.tmp), key)

    def kept(self, tasks: list[str]) -> dict[str, dict]:
        """The sound records among `tasks` (files there with their recorded sizes)."""
        tmp = Path(self.tmp)
        found = {}
        for task in tasks:
            record = resume.load_task(tmp, task, {"tail-": tmp / WORK})
            if record is not None:
                found[task] = record
        return found


@dataclass
class StoreRun:
    """The run's files beside its output on a store, named with the run's id."""

    url: str  # the output's URL
    run: str  # the run's id (a resumed run keeps the killed run's)
    settings: dict = field(default_factory=carried, repr=False)  # the driver's store settings

    def enter(self) -> None:
        carry_in(self.settings)

    def _url(self):
        return storage.parse_url(self.url)

    def _path(self, name: str) -> str:
        return self._url().child(run_file_name(name, self.run)).path

    def _store(self):
        return storage.store_for(self._url())

    def scratch(self, name: str) -> Path:
        root = os.environ.get("PACKER_STAGE_DIR") or None
        if root:
            Path(root).mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"packer-{name}-", dir=root))

    def publish(self, work: Path) -> None:
        """Upload a task's files under the run's names (each confirmed), then drop the copy."""
        try:
            for entry in sorted(work.iterdir()):
                self._store().upload(entry, self._path(entry.name))
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def spill(self, name: str, into: Path) -> Path:
        local = into / name
        self._store().download(self._path(name), local)
        return local

    def save(self, task: str, files: list[dict], result: dict) -> None:
        record = {"task": task, "files": files, **result}
        self._store().put(
            self._path(record_name(task)), json.dumps(record, sort_keys=True).encode()
        )
        _fault_point(self)

    def start(self, key: dict) -> None:
        record = {**key, "started": time.time()}
        self._store().put(self._path(RUN), json.dumps(record, sort_keys=True).encode())

    def sizes(self) -> dict[str, int]:
        """Every file of this run on the store, by its name before the run's id: its size."""
        url, mark = self._url(), f".{self.run}."
        out = {}
        for entry in self._store().walk(url.path):
            directory, _, name = entry.path.rpartition("/")
            if directory == url.path and mark in name:
                out[name.replace(mark, ".", 1)] = entry.size
        return out

    def kept(self, tasks: list[str]) -> dict[str, dict]:
        sizes = self.sizes()
        wanted = [t for t in tasks if record_name(t) in sizes]
        store = self._store()
        with ThreadPoolExecutor(READERS) as pool:
            texts = list(pool.map(lambda t: store.read_bytes(self._path(record_name(t))), wanted))
        found = {}
        for task, data in zip(wanted, texts):
            record = _parse(data)
            if record is None or record.get("task") != task:
                continue
            files = record.get("files")
            if isinstance(files, list) and all(_intact(entry, sizes) for entry in files):
                found[task] = record
        return found


def _parse(data: bytes | None) -> dict | None:
    try:
        record = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _intact(entry, sizes: dict[str, int]) -> bool:
    try:
        return sizes.get(entry["name"]) == entry["bytes"]
    except (KeyError, TypeError):
        return False


def dead_store_runs(url, store, committed: dict | None) -> list[tuple[str, dict]]:
    """(run id, run record) of every run to `url` that left a run record, newest first; runs
    whose files the committed manifest lists are left out (they finished)."""
    listed = listed_files(committed) if committed else []
    found = []
    for entry in store.walk(url.path):
        directory, _, name = entry.path.rpartition("/")
        stem, _, rest = name.partition(".")
        run = rest.split(".", 1)[0]
        if directory != url.path or stem != "run" or name != run_file_name(RUN, run):
            continue
        if not is_run_file(name):
            continue
        if any(f".{run}." in f for f in listed):
            continue
        record = _parse(store.read_bytes(entry.path))
        if record is not None:
            found.append((run, record))
    return sorted(found, key=lambda item: -float(item[1].get("started") or 0))


def open_store(remote, key: dict, resume_run: bool) -> StoreRun:
    """The files of this run to the remote output `remote` (`packer.write.remote.RemoteOutput`):
    with `resume_run`, the newest killed run's, when its run record names the same inputs and
    configuration (one line naming what changed otherwise); else a new run's. The run's id
    becomes the output's, so the commit lists the names the tasks uploaded."""
    if resume_run:
        for run, record in dead_store_runs(remote.url, remote.store, remote.previous):
            what = resume.changed(record, key)
            if what:
                raise resume.refusal(what, remote.shown)
            remote.run = run
            break
    return StoreRun(str(remote.url), remote.run)


def _fault_point(run: StoreRun) -> None:
    """Fault injection for tests: with PACKER_FAULT_KILL_AT_RECORDS=N set, the process that
    writes the N-th completion record of the run kills itself (SIGKILL) right after it."""
    at = os.environ.get("PACKER_FAULT_KILL_AT_RECORDS")
    if at and sum(1 for name in run.sizes() if name.startswith("done-")) >= int(at):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
