"""`resume`: a tokenize run killed part way keeps the batches it finished.

A run writes its run record (`.done/run.json`: packer's version, the encoder's fingerprint,
the raw columns, the error policy, the batch layout and every input's path, size and
modification time) into its temporary output before the first batch, and the driver writes a
completion record per batch (`.done/part-FFFFF-BBBBBB.json`) once the batch's shard is written:
its counts, its rejects, the shard's size and hash, and the hash of the input rows it covers
(`packer.tokenize.files.batch_digest`). Records are written to a private name
and renamed, so a killed run leaves whole records or none.

With `resume`, the newest temporary output of a dead run to the same output is adopted when its
run record equals this run's (refused in one line naming what changed otherwise): renamed to
this run's name, every batch whose record and shard are sound and whose input rows still hash
as recorded is kept, and the others are tokenized again: size and modification time alone
would keep the stale tokens of a file edited in place with its time put back. The kept shards are the bytes the killed run wrote, and a batch's bytes do not
depend on the run, so the output is an uninterrupted run's. `.done` is removed before the
output is placed.

The same layout as the block pipeline's `--resume` (`packer.pipelines.resume`), for the unit
a tokenize run has: the batch; the two share their record files (`packer.storage.run_records`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict
from pathlib import Path

from packer import hashing
from packer.contract.names import TMP_MARK
from packer.errors import UsageError, option
from packer.interrupts import begin_output
from packer.storage.run_records import (
    dead_runs,
    input_change,
    kill_at,
    read_record,
    take_over,
    write_record,
)
from packer.tokenize import output as out_dir
from packer.tokenize.worker import BatchDone

RECORDS = ".done"
RUN = "run.json"


def run_key(files, encoder_fingerprint: str, columns, on_error: str, layout: list) -> dict:
    """What a resumed run must share with the killed one."""
    from packer.version import __version__

    inputs = []
    for f in files:
        st = os.stat(f.path)
        inputs.append(
            {"path": os.path.realpath(f.path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        )
    return {
        "packer": __version__,
        "format": out_dir.FORMAT,
        "encoder": encoder_fingerprint,
        "columns": asdict(columns),
        "on_error": on_error,
        "batch": layout,
        "inputs": inputs,
    }


def open_run(target: Path, key: dict, resume: bool) -> tuple[Path, int]:
    """(the temporary output of this run, how many batch records it holds): a dead run's,
    adopted with `resume` when its run record is `key`'s, else a fresh one. The run record is
    written before any batch."""
    adopted = None
    if resume:
        begin_output()
        target.parent.mkdir(parents=True, exist_ok=True)
        adopted = _adopt(target, key)
    tmp = adopted if adopted is not None else out_dir.start(target)
    if adopted is not None:
        out_dir._remove_stale(target)  # other dead runs' leftovers
    records = tmp / RECORDS
    records.mkdir(exist_ok=True)
    write_record(records / RUN, key)
    kept = sum(1 for p in records.glob("part-*.json"))
    return tmp, kept


def _adopt(target: Path, key: dict) -> Path | None:
    for dead in dead_runs(target, TMP_MARK, f"{RECORDS}/{RUN}"):
        old = read_record(dead / RECORDS / RUN)
        if old is None:
            continue
        what = _changed(old, key)
        if what:
            raise UsageError(
                f"cannot resume: {what} since the killed run; rerun without "
                f"{option('resume=True', '--resume')} to tokenize from the start",
                where=str(target),
            )
        mine = take_over(dead, target, TMP_MARK)
        if mine is not None:
            return mine
    return None


def _changed(old: dict, new: dict) -> str | None:
    """What differs between two run records, in words; None when alike."""
    words = {
        "packer": "packer's version changed",
        "format": "packer's version changed",
        "encoder": f"the tokenizer, template or {option('train_on', '--train-on')} changed",
        "columns": f"{option('columns', '--column')} changed",
        "on_error": f"{option('on_error')} changed",
        "batch": "the batch size changed",
    }
    for field, what in words.items():
        if old.get(field) != new[field]:
            return what
    old_inputs = old.get("inputs") or []
    if [i.get("path") for i in old_inputs] != [i["path"] for i in new["inputs"]]:
        return "the inputs changed"
    difference = input_change(old_inputs, new["inputs"])  # the same inputs in the same order
    return None if difference is None else f"the input {difference[2]['path']} changed"


def kept_batch(tmp: Path, shard: str) -> BatchDone | None:
    """The batch's result from its record, when the record and its shard are sound."""
    record = read_record(tmp / RECORDS / shard.replace(".parquet", ".json"))
    if record is None:
        return None
    try:
        done = BatchDone(**record["done"])
        entry = record["shard"]
        if entry is not None:
            path = tmp / entry["name"]
            if path.stat().st_size != entry["bytes"]:
                return None
            if hashing.file_digest(path) != entry[hashing.DEFAULT]:
                return None
    except (KeyError, TypeError, OSError):
        return None
    return done


def save_batch(tmp: Path, done: BatchDone, driver: bool = True) -> None:
    """A finished batch's record, after its shard is written: by the driver, or by the engine
    task that wrote the shard (`driver=False`), so that a driver killed while tasks run keeps
    every batch finished by then."""
    from packer.tokenize.output import shard_name

    entry = None
    if done.shard is not None:
        path = tmp / done.shard
        entry = {
            "name": done.shard,
            "bytes": path.stat().st_size,
            hashing.DEFAULT: hashing.file_digest(path),
        }
    name = shard_name(done.file_index, done.batch_index).replace(".parquet", ".json")
    write_record(tmp / RECORDS / name, {"done": asdict(done), "shard": entry})
    if driver:
        fault_point(tmp)


def drop_records(tmp: Path) -> None:
    """The records are the run's, not the output's: removed before it is placed."""
    shutil.rmtree(tmp / RECORDS, ignore_errors=True)


def fault_point(tmp: Path) -> None:
    """Fault injection for tests: with PACKER_FAULT_KILL_AT_TOKENIZED=N set, the driver kills
    itself (SIGKILL) once N batch records are written, as it takes a finished batch."""
    kill_at(
        "PACKER_FAULT_KILL_AT_TOKENIZED",
        lambda: sum(1 for _ in (tmp / RECORDS).glob("part-*.json")),
    )
