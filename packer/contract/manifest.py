"""One reader of `manifest.json`, for everything that reads a packer output.

`read_manifest` checks the fields that verify, repack and inspect rely on and fails in one line
that names the file; `packer_manifest` is the lenient test the readers use to recognise an output
among their inputs (a manifest that is broken still marks its directory as packer's).

The manifest is the commit: a directory without one is never read. `no_manifest` says which of
two things it is, in one line every reader shares: a run's leftovers (`has_leftovers`: an output
that is incomplete, killed or still being written, as `packer.contract.remote.incomplete` says of
a store's prefix) or no packer output at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from packer.contract.names import BLOCK_WORK, MANIFEST, POLICIES, SHARD_PREFIX, TMP_MARK, WORK_MARKS
from packer.errors import InputError, PackerError, UsageError, option


def read_manifest(output_dir: Path) -> dict:
    path = Path(output_dir) / MANIFEST
    if not path.is_file():
        raise no_manifest(Path(output_dir))
    return parse_manifest(path.read_bytes(), path)


def incomplete_output(where: str) -> InputError:
    """The one line for an output a run has begun and not committed, locally as on a store."""
    return InputError(
        "incomplete packer output: no manifest.json (a run that did not finish, or is still "
        f"running; resume it with {option('resume=True', '--resume')}, or rerun it)",
        where=where,
    )


def has_leftovers(directory: Path) -> bool:
    """Whether `directory`, which has no manifest, holds a run's files: it is a run's hidden
    temporary output, or it holds shards or a block run's work directory; or, missing or
    empty, a run to it has its hidden temporary output beside it (killed, or still writing).

    Only a missing or empty directory has its parent listed: an inputs expansion asks this of
    every directory it walks."""
    name = directory.name
    if name.startswith(".") and any(mark in name for mark in WORK_MARKS):
        return directory.is_dir()
    try:
        with os.scandir(directory) as entries:
            names = sorted(entry.name for entry in entries)
    except OSError:
        names = []
    if names:
        if BLOCK_WORK in names:
            return True
        shards = [n for n in names if n.startswith(SHARD_PREFIX) and n.endswith(".arrow")]
        return bool(shards) and _is_shard(directory / shards[0])
    absolute = Path(os.path.abspath(directory))  # `.` has a name, and a parent to look in
    beside = f".{absolute.name}{TMP_MARK}"
    try:
        with os.scandir(absolute.parent) as entries:
            return any(entry.name.startswith(beside) for entry in entries)
    except OSError:
        return False


def _is_shard(path: Path) -> bool:
    """Whether a file named like a shard has the packed-row columns (a user's own data may be
    called `shard-00000.arrow` too); its schema only is read."""
    import pyarrow as pa

    from packer.contract.schema import PACKED_MARKERS

    try:
        with pa.memory_map(str(path)) as source:  # a shard is an IPC stream
            return set(pa.ipc.open_stream(source).schema.names) >= PACKED_MARKERS
    except (pa.ArrowInvalid, OSError):
        return False


def no_manifest(directory: Path) -> PackerError:
    """Why a reader cannot read `directory`, which has no manifest.json, in one line."""
    if has_leftovers(directory):
        return incomplete_output(str(directory))
    if not directory.exists():
        return UsageError("no such directory", where=str(directory))
    if not directory.is_dir():
        return UsageError("not a directory", where=str(directory))
    return UsageError("no manifest.json: not a packer output", where=str(directory))


def parse_manifest(data: bytes, path: Path) -> dict:
    """The manifest in `data` (read from `path`, which messages name), its fields checked."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"manifest.json is not valid JSON ({exc})", where=str(path)) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise UsageError("manifest.json has no 'shards' list", where=str(path))
    check_format_version(manifest, path)
    _check_fields(manifest, path)
    return manifest


# The output formats this packer reads (`format_version`; none recorded is format 1): 1 writes
# rows in the plan's order, 2 in `config.row_order` (docs/format.md). Only the row order
# differs, so every reader reads both; a newer format is refused rather than misread.
FORMAT_VERSIONS = (1, 2)


def check_format_version(manifest: dict, path: Path) -> None:
    """A manifest of a format this packer reads (refused in one line otherwise)."""
    version = manifest.get("format_version", 1)
    if version in FORMAT_VERSIONS and not isinstance(version, bool):
        return
    if isinstance(version, int) and not isinstance(version, bool) and version > 0:
        raise UsageError(
            f"manifest.json has format_version {version}; this packer reads formats "
            f"{', '.join(map(str, FORMAT_VERSIONS))}: upgrade packer to read it",
            where=str(path),
        )
    raise UsageError(
        f"manifest.json format_version must be a positive integer, got {version!r}",
        where=str(path),
    )


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# The manifest fields the checks read: (section, key, test, what a valid value is). Refusing a
# manifest without them beats checking against a made-up default (every row "over L = 0").
_FIELDS = (
    ("config", "max_len", lambda v: _count(v) and v > 0, "a positive integer"),
    ("config", "pad", lambda v: isinstance(v, bool), "true or false"),
    ("config", "pad_id", _count, "a non-negative integer"),
    ("config", "overlength", lambda v: v in POLICIES, " or ".join(POLICIES)),
    ("config", "input_column", lambda v: isinstance(v, str) and v != "", "a column name"),
    ("config", "labels_column", lambda v: v is None or isinstance(v, str), "a column name or null"),
    ("stats", "samples_in", _count, "a non-negative integer"),
    ("stats", "dropped", _count, "a non-negative integer"),
)


def _check_fields(manifest: dict, path: Path) -> None:
    for section in ("config", "stats"):
        if not isinstance(manifest.get(section), dict):
            raise UsageError(f"manifest.json has no '{section}' object", where=str(path))
    for section, key, valid, what in _FIELDS:
        if key not in manifest[section]:
            raise UsageError(f"manifest.json has no {section}.{key}", where=str(path))
        value = manifest[section][key]
        if not valid(value):
            raise UsageError(
                f"manifest.json {section}.{key} must be {what}, got {value!r}", where=str(path)
            )
    for i, entry in enumerate(manifest["shards"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise UsageError(f"manifest.json shards[{i}] has no 'file' name", where=str(path))


def packer_manifest(directory: Path) -> dict | None:
    """The packer manifest of `directory`, or None when it holds none (never raises)."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and "packer_version" in data and "shards" in data:
        return data
    return None
