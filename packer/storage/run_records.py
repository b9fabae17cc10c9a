"""Run records on local storage: what `--resume` of the block pipeline (`packer.pipelines.resume`)
and of a tokenize run (`packer.tokenize.resume`) both need from the file system.

A record is a small JSON object written whole or not at all (a private name, flushed, then
renamed), so a process killed while writing one leaves no record. A run that died leaves its
hidden temporary output `.NAME<mark><pid>-<random>` behind; `dead_runs` finds those whose
process is gone. `input_change` and `changed_inputs` say how two runs' inputs differ, for the
one line that refuses a resume; `kill_at` is the tests' way to kill a run at a chosen record.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

from packer.errors import OutputError
from packer.storage.local import pid_alive


def write_record(path: Path, record: dict) -> None:
    """Write a record whole or not at all: a private name, flushed, then renamed into place."""
    part = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.part"
    with open(part, "w", encoding="utf-8") as fh:
        json.dump(record, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(part, path)


def read_record(path: Path) -> dict | None:
    """A record, or None when it is missing or unreadable (never half a record)."""
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def dead_runs(out: Path, mark: str, run_record: str) -> list[Path]:
    """The temporary outputs of runs to `out` (named `.{out.name}{mark}{pid}-...`) whose
    process is gone, newest first by the modification time of their run record (the path
    `run_record` inside each; one without it sorts last)."""
    prefix = f".{out.name}{mark}"
    try:
        entries = list(out.parent.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        pid_text = entry.name[len(prefix) :].split("-", 1)[0]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            found.append(entry)

    def started(path: Path) -> float:
        try:
            return (path / run_record).stat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=started, reverse=True)


def take_over(dead: Path, out: Path, mark: str) -> Path | None:
    """Rename a killed run's directory to this process's own temporary name beside `out`, so
    that no other resuming run takes it too; None when another run took it first."""
    mine = out.parent / f".{out.name}{mark}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(dead, mine)
    except FileNotFoundError:
        return None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        reason = f"{reason} [{exc.filename}]" if exc.filename else reason
        raise OutputError(
            f"cannot take over the killed run's files: {reason}", where=str(out)
        ) from None
    return mine


def input_change(old: list, new: list[dict]) -> tuple[str, dict, dict] | None:
    """The first difference between a killed run's inputs and this run's, or None:
    (what, before, now) with what one of "added", "gone" (before is the old entry), "size",
    "etag", "modified" (its modification time or content fingerprint), "order".

    Inputs are matched by `resolved` (what the name refers to), else by `path`, so that two
    spellings of one file are one input."""
    old_inputs = {_same(i): i for i in old if isinstance(i, dict)}
    new_inputs = {_same(i): i for i in new}
    for same, now in new_inputs.items():
        if same not in old_inputs:
            return "added", {}, now
    for same, before in old_inputs.items():
        if same not in new_inputs:
            return "gone", before, {}
    for same, now in new_inputs.items():
        before = old_inputs[same]
        if before.get("size") != now["size"]:
            return "size", before, now
        if before.get("etag") != now.get("etag"):
            return "etag", before, now
        if before.get("mtime_ns") != now["mtime_ns"] or before.get("fingerprint") != now.get(
            "fingerprint"
        ):
            return "modified", before, now
    if list(old_inputs) != list(new_inputs):
        return "order", {}, {}
    return None


def changed_inputs(old: list, new: list[dict]) -> str | None:
    """How this run's inputs differ from a killed run's, in words (`the input X was added`,
    `... changed (size 10 -> 12)`); None when alike."""
    difference = input_change(old, new)
    if difference is None:
        return None
    what, before, now = difference
    if what == "added":
        return f"the input {now['path']} was added"
    if what == "gone":
        return f"the input {before.get('path')} is gone"
    if what == "order":
        return "the inputs are in another order"
    path = now["path"]
    if what == "size":
        return f"the input {path} changed (size {before.get('size')} -> {now['size']})"
    if what == "etag":
        return f"the input {path} changed (ETag {before.get('etag')} -> {now.get('etag')})"
    return f"the input {path} changed (modified)"


def _same(entry: dict):
    """What identifies an input across spellings (records written before `resolved`: the path)."""
    return entry.get("resolved") or entry.get("path")


def kill_at(variable: str, count: Callable[[], int]) -> None:
    """Fault injection for tests: with the environment variable `variable` set to N, this
    process kills itself (SIGKILL) once `count()` (records written so far) reaches N."""
    at = os.environ.get(variable)
    if at and count() >= int(at):
        os.kill(os.getpid(), signal.SIGKILL)
