"""Completion records of the block pipeline, and `--resume`, which keeps what a killed run
finished.

Every run of the block pipeline writes a run record (`run.json`: packer's version, the
configuration that shapes the output, every input's size and modification time) into its
temporary output before any task starts, and every block and tail task writes a completion
record (`b00012.json`, `t00003.json`) after its files are in place: the files it wrote, with
their sizes and hashes, and what it sent back to the driver. A record is written to a private
name and renamed into place, so a task killed while writing one leaves no record; on reading,
a record whose files are missing or of another size is not trusted, and that task runs again.

`--resume` adopts the temporary output of a dead run (`adopt`): when the run record names the
same inputs and configuration, the directory is renamed to this run's own name and every task
with a sound record is kept; otherwise the run is refused in one line naming what changed.
Without `--resume` a dead run's leftovers are removed, as `packer.write.commit` always did.

The file operations are the few small functions below (`write_record`, `file_entry`, `intact`,
`input_identity`) and those shared with a tokenize run's `--resume` (`packer.storage.run_records`),
the only places that touch storage.
"""

from __future__ import annotations

import os
from pathlib import Path

from packer import hashing, storage
from packer.config import PackConfig
from packer.contract.names import BLOCK_WORK, TMP_MARK
from packer.errors import UsageError, option
from packer.storage import names, run_records
from packer.storage.run_records import (
    changed_inputs,
    dead_runs,
    kill_at,
    read_record,
    take_over,
)
from packer.version import __version__
from packer.write import commit as output

RECORDS = "done"  # under the block pipeline's work directory
RUN = "run.json"


# --------------------------------------------------------------------------------------------
# Storage: the only functions that read or write files


def write_record(path: Path, record: dict) -> None:
    """Write a record whole or not at all (`packer.storage.run_records`)."""
    run_records.write_record(path, record)
    _fault_point(path.parent)


def file_entry(path: Path, algorithm: str) -> dict:
    """What a record says of one file it lists: its name, size and content hash."""
    return {
        "name": path.name,
        "bytes": path.stat().st_size,
        algorithm: hashing.file_digest(path, algorithm),
    }


def intact(base: Path, files: list[dict]) -> bool:
    """Whether every listed file is in `base` with its recorded size and hash.

    A file changed after its record was written (a disk fault, a hand edit: the same size,
    other bytes) is not the file the record describes, so its task runs again. Hashing the
    kept files reads each once (xxh3_128 by default, at memory speed; docs/scale.md has the
    cost measured on a resumed run)."""
    for entry in files:
        try:
            path = base / entry["name"]
            if path.stat().st_size != entry["bytes"]:
                return False
            recorded = hashing.recorded(entry)
            if recorded and hashing.file_digest(path, recorded[0]) != recorded[1]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def input_identity(path: str, size: int) -> dict:
    """What says an input is unchanged: its name, size and modification time. A remote input
    (or its staged copy, `packer.read.remote`) is named by its URL; its ETag (S3), size and the
    sampled fingerprint of its content stand for it. `resolved` is what the name refers to
    (the absolute path with links resolved, or the URL): a resume compares inputs by it, so
    `data/x.jsonl` and `/abs/data/x.jsonl` are one input."""
    shown = names.display(path)
    if storage.is_url(shown):
        url = storage.parse_url(shown)
        etag = storage.store_for(url).etag(url.path)
        return {"path": shown, "resolved": shown, "size": size, "mtime_ns": None, "etag": etag}
    st = os.stat(path)
    resolved = os.path.realpath(path)
    return {"path": path, "resolved": resolved, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# --------------------------------------------------------------------------------------------
# Records of a run

_WORK = BLOCK_WORK


def records_dir(tmp: Path) -> Path:
    return tmp / _WORK / RECORDS


def run_key(cfg: PackConfig, scans, mixture: dict | None = None) -> dict:
    """What a resumed run must share with the killed one: packer, configuration, inputs;
    `mixture`'s entries (the sources and weights, the size, the split) count as configuration."""
    return {
        "packer": __version__,
        "config": {**cfg.to_dict(), **(mixture or {})},
        "inputs": [
            {**input_identity(scan.path, scan.size), "fingerprint": scan.fingerprint}
            for scan in scans
        ],
    }


def start_run(tmp: Path, key: dict) -> None:
    """The run record and the records' directory, before any task starts (an adopted run's
    record is written again, alike)."""
    records_dir(tmp).mkdir(parents=True, exist_ok=True)
    write_record(tmp / _WORK / RUN, key)


def save_task(tmp: Path, name: str, files: list[dict], result: dict) -> None:
    """A task's completion record, after its files are in place."""
    write_record(records_dir(tmp) / f"{name}.json", {"task": name, "files": files, **result})


def load_task(tmp: Path, name: str, bases: dict[str, Path]) -> dict | None:
    """A task's record if it and every file it lists are sound, else None (the task reruns).

    bases: the directory of each listed file by name prefix (spill files live under the work
    directory, shards in the output)."""
    record = read_record(records_dir(tmp) / f"{name}.json")
    if record is None or record.get("task") != name or not isinstance(record.get("files"), list):
        return None
    for entry in record["files"]:
        name_ = entry.get("name", "") if isinstance(entry, dict) else ""
        base = next((d for prefix, d in bases.items() if name_.startswith(prefix)), tmp)
        if not intact(base, [entry]):
            return None
    return record


# --------------------------------------------------------------------------------------------
# Adopting a dead run


def open_work(out: Path, key: dict, resume: bool) -> Path:
    """The temporary output of this run: a dead run's, adopted, or a fresh one.

    With `resume`, the newest dead run to `out` that left a run record is checked against
    `key` (one line naming what changed when it differs) and renamed to this run's own name;
    other leftovers are removed. Without it, or when nothing was left, a fresh directory."""
    adopted = None
    if resume:
        for dead in dead_runs(out, TMP_MARK, f"{_WORK}/{RUN}"):
            old = read_record(dead / _WORK / RUN)
            if old is None:
                continue
            what = changed(old, key)
            if what:
                raise refusal(what, str(out))
            adopted = take_over(dead, out, TMP_MARK)
            if adopted is not None:
                break
    if adopted is None:
        return output.start(out)
    output.remove_stale(out)
    return adopted


def refusal(what: str, where: str) -> UsageError:
    """The one line refusing a resume: what changed since the killed run."""
    return UsageError(
        f"cannot resume: {what} since the killed run; rerun without "
        f"{option('resume=True', '--resume')} to pack from the start",
        where=where,
    )


def changed(old: dict, new: dict) -> str | None:
    """What differs between the killed run's key and this one's, in words; None when alike."""
    if old.get("packer") != new["packer"]:
        return f"packer changed ({old.get('packer')} -> {new['packer']})"
    what = changed_inputs(old.get("inputs", []), new["inputs"])
    if what is not None:
        return what
    old_cfg, new_cfg = old.get("config", {}), new["config"]
    for name in sorted(set(old_cfg) | set(new_cfg)):
        if old_cfg.get(name) != new_cfg.get(name):
            return (
                f"{option(name)} changed ({_shown(old_cfg.get(name))} -> "
                f"{_shown(new_cfg.get(name))})"
            )
    return None


def _shown(value) -> str:
    return "not set" if value is None else str(value)


def _fault_point(records: Path) -> None:
    """Fault injection for tests: with PACKER_FAULT_KILL_AT_RECORDS=N set, the process that
    writes the N-th completion record kills itself (SIGKILL) right after it."""
    if records.name == RECORDS:  # counted only when the variable is set
        written = lambda: sum(1 for p in records.iterdir() if p.suffix == ".json")  # noqa: E731
        kill_at("PACKER_FAULT_KILL_AT_RECORDS", written)
