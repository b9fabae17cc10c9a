"""Read a packer output for verification: the manifest and each shard as flat numpy arrays.

Shards are read through a memory map, one record batch at a time: every list column is kept as
Arrow's own `offsets` + `values` of that batch (no copy), so the numba checks run over whole
batches without per-row Python objects and verifying a large output needs little memory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.errors import UsageError
from packer.own_outputs import MANIFEST
from packer.planning.overlength import POLICIES
from packer.write.shard_file import SCHEMA


@dataclass
class ShardArrays:
    """One record batch of a shard; list column X is `X[X_off[r]:X_off[r + 1]]` for row r.

    Rows are numbered from 0 within the batch; `first_row + r` is the row in the shard file.
    """

    name: str
    rows: int
    ids_off: np.ndarray
    ids: np.ndarray
    lab_off: np.ndarray
    labels: np.ndarray
    pos_off: np.ndarray
    pos: np.ndarray
    cu_off: np.ndarray
    cu: np.ndarray
    si_off: np.ndarray
    sample_index: np.ndarray
    so_off: np.ndarray
    sample_offset: np.ndarray
    num_loss: np.ndarray
    first_row: int = 0

    def shard_row(self, r: int) -> int:
        """The row's number in its shard file, as messages give it."""
        return self.first_row + r

    def row_slice(self, r: int) -> slice:
        return slice(int(self.ids_off[r]), int(self.ids_off[r + 1]))

    def row(self, r: int) -> dict:
        """Row r as numpy arrays (views), for the per-row checks and messages."""
        t = self.row_slice(r)
        return {
            "input_ids": self.ids[t],
            "labels": self.labels[int(self.lab_off[r]) : int(self.lab_off[r + 1])],
            "position_ids": self.pos[int(self.pos_off[r]) : int(self.pos_off[r + 1])],
            "cu_seqlens": self.cu[int(self.cu_off[r]) : int(self.cu_off[r + 1])],
            "sample_index": self.sample_index[int(self.si_off[r]) : int(self.si_off[r + 1])],
            "sample_offset": self.sample_offset[int(self.so_off[r]) : int(self.so_off[r + 1])],
            "num_loss_tokens": int(self.num_loss[r]),
        }


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


class OutputVersion:
    """One version of an output directory, held open so that every read comes from it.

    `pack --overwrite` swaps a whole new directory into place and deletes the old one
    (`packer.write.commit`): a reader that opens the manifest, then the shards, by the output's
    path can get the old manifest with the new shards. `path` reads through the open directory
    instead (/proc/self/fd/N on Linux; elsewhere the output's path), and `changed()` says whether
    the output's path still names this directory and this manifest. The open directory also
    keeps its inode number from being reused by a later output.
    """

    def __init__(self, output_dir: str | Path):
        self.shown = Path(output_dir)
        self.fd = -1
        for attempt in range(3):
            self._open()
            try:
                self.manifest_bytes = (self.path / MANIFEST).read_bytes()
                break
            except OSError as exc:
                moved = self._moved()
                self.close()
                if moved and attempt < 2:  # replaced, its old version deleted: open the new one
                    continue
                if isinstance(exc, (FileNotFoundError, IsADirectoryError)):
                    raise UsageError(
                        "no manifest.json: not a packer output", where=str(output_dir)
                    ) from None
                raise UsageError(
                    f"cannot read manifest.json: {exc.strerror or exc}", where=str(output_dir)
                ) from None
        try:
            self.manifest = parse_manifest(self.manifest_bytes, self.shown / MANIFEST)
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        if not self.shown.is_dir():
            raise UsageError("not a directory", where=str(self.shown))
        try:
            self.fd = os.open(self.shown, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError as exc:
            raise UsageError(f"cannot open: {exc.strerror or exc}", where=str(self.shown)) from None
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)
        proc = Path(f"/proc/self/fd/{self.fd}")
        try:
            self.path = proc if os.path.samestat(os.stat(proc), st) else self.shown
        except OSError:
            self.path = self.shown

    def _moved(self) -> bool:
        """Whether the output's path names another directory now (or nothing)."""
        try:
            st = os.stat(self.shown)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.identity

    def changed(self) -> bool:
        """Whether the output's path now names another directory, or another manifest."""
        if self._moved():
            return True
        try:
            return (self.shown / MANIFEST).read_bytes() != self.manifest_bytes
        except OSError:
            return True

    def shown_path(self, text: str) -> str:
        """`text` with the paths read through the open directory given as the user's."""
        if self.path == self.shown:
            return text
        return text.replace(f"{self.path}{os.sep}", f"{self.shown}{os.sep}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> OutputVersion:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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


def _list_parts(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    offsets = column.offsets.to_numpy(zero_copy_only=False)
    values = column.values.to_numpy(zero_copy_only=False)
    return offsets, values


def schema_problem(schema: pa.Schema) -> str | None:
    """What keeps this schema from the packed-shard contract, or None."""
    for field in SCHEMA:
        if field.name not in schema.names:
            return f"no '{field.name}' column"
        got = schema.field(field.name).type
        if got != field.type:
            return f"column '{field.name}' has type {got}, expected {field.type}"
    return None


def read_shard(path: Path) -> list[ShardArrays]:
    """The record batches of one Arrow IPC stream shard, as zero-copy arrays of the mapped file.

    Raises ValueError with a one-line reason. A shard without batches gives one empty batch.
    """
    source = pa.memory_map(str(path))
    try:
        reader = pa.ipc.open_stream(source)
        batches = list(reader)
    except pa.ArrowInvalid as exc:
        raise ValueError(f"not an Arrow IPC stream ({exc})") from None
    if not batches:
        return [arrays_from_table(reader.schema.empty_table(), path.name)]
    out, first = [], 0
    for batch in batches:
        out.append(arrays_from_table(pa.Table.from_batches([batch]), path.name, first))
        first += batch.num_rows
    return out


def arrays_from_table(table: pa.Table, name: str, first_row: int = 0) -> ShardArrays:
    """The flat arrays of a shard table (zero-copy when it is one batch); raises ValueError
    when it breaks the schema."""
    problem = schema_problem(table.schema)
    if problem:
        raise ValueError(problem)
    # one chunk is used as it is: combine_chunks would copy even a single chunk
    cols = {
        c: col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        for c, col in zip(table.column_names, table.columns)
    }
    if table.num_rows == 0:
        cols = {c: pa.array([], SCHEMA.field(c).type) for c in SCHEMA.names}
    for column in SCHEMA.names:
        if cols[column].null_count:
            raise ValueError(f"column '{column}' holds nulls")
    ids_off, ids = _list_parts(cols["input_ids"])
    lab_off, labels = _list_parts(cols["labels"])
    pos_off, pos = _list_parts(cols["position_ids"])
    cu_off, cu = _list_parts(cols["cu_seqlens"])
    si_off, sample_index = _list_parts(cols["sample_index"])
    so_off, sample_offset = _list_parts(cols["sample_offset"])
    num_loss = cols["num_loss_tokens"].to_numpy(zero_copy_only=False)
    return ShardArrays(
        name,
        table.num_rows,
        ids_off,
        ids,
        lab_off,
        labels,
        pos_off,
        pos,
        cu_off,
        cu,
        si_off,
        sample_index,
        so_off,
        sample_offset,
        num_loss,
        first_row,
    )
