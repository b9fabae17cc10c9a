"""One reader of `manifest.json`, for everything that reads a packer output.

`read_manifest` checks the fields that verify, repack and inspect rely on and fails in one line
that names the file; `packer_manifest` is the lenient test the readers use to recognise an output
among their inputs (a manifest that is broken still marks its directory as packer's).
"""

from __future__ import annotations

import json
from pathlib import Path

from packer.contract.names import MANIFEST, POLICIES
from packer.errors import UsageError


def read_manifest(output_dir: Path) -> dict:
    path = Path(output_dir) / MANIFEST
    if not Path(output_dir).is_dir():
        raise UsageError("not a directory", where=str(output_dir))
    if not path.is_file():
        raise UsageError("no manifest.json: not a packer output", where=str(output_dir))
    return parse_manifest(path.read_bytes(), path)


def parse_manifest(data: bytes, path: Path) -> dict:
    """The manifest in `data` (read from `path`, which messages name), its fields checked."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"manifest.json is not valid JSON ({exc})", where=str(path)) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise UsageError("manifest.json has no 'shards' list", where=str(path))
    _check_fields(manifest, path)
    return manifest


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
