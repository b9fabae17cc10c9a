"""Read a packer output back into its samples, to pack them again with other options.

This changes L, the strategy or the padding without the original files. Every packed row keeps
what is needed to undo it: `cu_seqlens` gives each segment, `sample_index` and `sample_offset`
say which source sample and where in it. Pieces of a split sample are joined back in order,
stored padding is dropped, and `sample_index` keeps pointing at the original inputs, so the
re-packed output is byte-identical to packing the originals with the same options and
`packer verify --input ORIGINAL` still checks it.

A packed row labels the first token of every segment -100, so the label at the start of every
piece after the first of a split sample is not in the rows: without a labels column it is the
token itself; with one, the output keeps it in `split_labels.jsonl`. An output without that
file (written before packer kept it) is refused rather than re-packed with other labels.

Nothing read is trusted: every listed shard must have its recorded size, digest (one read of
the file), rows, tokens and segments, and the shards must hold every sample the manifest says
was packed, the rest accounted for as dropped or rejected; otherwise one line names the file
and what differs, and nothing is written. What the packed input left out is carried on in
`repacked_from.absent` (see `absent_samples`), so `verify` can account for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from packer import hashing
from packer.contract.manifest import (
    check_format_version,
    has_leftovers,
    incomplete_output,
    packer_manifest,
)
from packer.contract.names import MANIFEST, SPLIT_LABELS
from packer.contract.outputs import PackedInputError, is_incomplete_output, is_packer_output
from packer.contract.remote import local_copy
from packer.contract.shards import read_shard
from packer.errors import InputError, option
from packer.planning.multiple import config_multiple
from packer.read.samples import Samples, SourceFile
from packer.storage import display, is_url


@dataclass
class RepackedSource(SourceFile):
    """An original input known only through a packer output's manifest: it may be gone."""

    packed: Path | None = None

    def locate(self, row: int) -> str:
        return f"{self.path}: sample {self.first_index + row} (re-packed from {self.packed})"


def check_repack_inputs(inputs: list[str | Path]) -> Path:
    """The one packer output that `--repack` reads; anything else is refused in one line."""
    paths = [local_copy(p) if is_url(p) else Path(str(p)) for p in inputs]
    for path in paths:
        if is_incomplete_output(path):
            raise incomplete_output(display(path))
        if not path.is_dir() or not is_packer_output(path):
            raise PackedInputError(
                f"{option('repack=True', '--repack')} reads packer outputs only, and this is "
                "not one (original files "
                "and a packed output would number their samples twice: pack the originals "
                "on their own, or re-pack the output on its own)",
                where=display(path),
            )
    if len(paths) != 1:
        raise PackedInputError(
            f"{option('repack=True', '--repack')} takes one packer output, got {len(paths)} "
            "(each numbers its samples "
            "from 0 against its own original inputs)"
        )
    return paths[0]


def _split_labels(directory: Path, manifest: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(sorted keys sample << 31 | offset, labels) from the output's split_labels.jsonl."""
    entry = manifest.get("split_labels")
    if not entry:
        return None
    path = directory / entry["file"]
    recorded = hashing.recorded(entry)
    try:
        if recorded is not None and hashing.file_digest(path, recorded[0]) != recorded[1]:
            raise InputError("does not match its hash in manifest.json", where=str(path))
        table = pa_json.read_json(str(path))
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read: {exc}", where=str(path)) from None
    sample = table.column("sample_index").to_numpy().astype(np.int64)
    offset = table.column("sample_offset").to_numpy().astype(np.int64)
    key = sample * (1 << 31) + offset
    order = np.argsort(key, kind="stable")
    return key[order], table.column("label").to_numpy().astype(np.int32)[order]


@dataclass
class _Pieces:
    """Every piece of every sample in a packer output, and the token arrays they lie in."""

    sample: np.ndarray  # the sample each piece belongs to
    offset: np.ndarray  # where the piece starts within its sample
    length: np.ndarray
    tok: np.ndarray  # where the piece starts in the concatenated shard tokens
    ids: list[np.ndarray]
    labels: list[np.ndarray]

    def sort(self) -> None:
        order = np.lexsort((self.offset, self.sample))
        self.sample, self.offset = self.sample[order], self.offset[order]
        self.length, self.tok = self.length[order], self.tok[order]


def _read_pieces(directory: Path, manifest: dict) -> _Pieces:
    """The pieces of each listed shard, each shard checked against the manifest first."""
    ids_parts, lab_parts = [], []
    seg_sample, seg_offset, seg_len, seg_tok = [], [], [], []
    base = 0
    for shard in manifest["shards"]:
        path = directory / shard["file"]
        _check_shard_file(path, shard)
        try:
            batches = read_shard(path)
        except (ValueError, OSError) as exc:
            raise InputError(f"cannot read packed shard: {exc}", where=str(path)) from None
        _check_shard_counts(path, shard, batches)
        for b in batches:
            n_seg = np.diff(b.si_off)
            row = np.repeat(np.arange(b.rows), n_seg)
            j = np.arange(int(n_seg.sum())) - np.repeat(b.si_off[:-1], n_seg)
            at = b.cu_off[:-1][row] + j
            start = b.cu[at].astype(np.int64)
            seg_len.append(b.cu[at + 1].astype(np.int64) - start)
            seg_tok.append(base + b.ids_off[:-1][row] + start)
            seg_sample.append(b.sample_index[b.si_off[0] : b.si_off[-1]])
            seg_offset.append(b.sample_offset[b.so_off[0] : b.so_off[-1]].astype(np.int64))
            ids_parts.append(b.ids)
            lab_parts.append(b.labels)
            base += b.ids.size
    if not seg_len or sum(a.size for a in seg_len) == 0:
        raise InputError("the packer output holds no samples", where=str(directory))
    return _Pieces(
        np.concatenate(seg_sample),
        np.concatenate(seg_offset),
        np.concatenate(seg_len),
        np.concatenate(seg_tok),
        ids_parts,
        lab_parts,
    )


def _first_pieces(directory: Path, p: _Pieces) -> np.ndarray:
    """Which (sorted) pieces start their sample; refuses a missing, repeated or overlapping one."""
    first = np.ones(p.sample.size, bool)
    first[1:] = p.sample[1:] != p.sample[:-1]
    expected = np.zeros(p.sample.size, np.int64)  # where each piece must start in its sample
    expected[1:] = p.offset[:-1] + p.length[:-1]
    expected[first] = 0
    bad = np.flatnonzero(p.offset != expected)
    if bad.size:
        i = int(bad[0])
        raise _refuse(
            directory,
            f"sample {int(p.sample[i])} has a piece at offset {int(p.offset[i])} where "
            f"{int(expected[i])} was expected (a missing, repeated or overlapping piece)",
        )
    return first


def _restore_split_labels(
    directory: Path, manifest: dict, p: _Pieces, first: np.ndarray, starts, labels
) -> None:
    """Put back the source labels that split points overwrote with -100 (split_labels.jsonl)."""
    pieces = ~first  # pieces after the first: their first label was overwritten with -100
    if not pieces.any():
        return
    split = _split_labels(directory, manifest)
    key = p.sample[pieces] * (1 << 31) + p.offset[pieces]
    at = np.searchsorted(split[0], key) if split is not None else None
    if at is None or (at >= split[0].size).any() or (split[0][at] != key).any():
        n_lost = int(pieces.sum())
        n_split = int(np.unique(p.sample[pieces]).size)
        raise PackedInputError(
            f"{n_split} sample(s) were split when this output was packed, and the "
            f"labels at their {n_lost} split point(s) are not recorded (no complete "
            f"{SPLIT_LABELS}: an output of packer before it kept them); re-packing "
            "would change those labels: pack the original inputs instead",
            where=str(directory),
        )
    labels[starts[pieces]] = split[1][at]


def _origin(directory: Path, manifest: dict, kept: int, num_input: int, absent) -> dict:
    """What the new manifest's `repacked_from` records about the output read."""
    algorithm = manifest.get("config", {}).get("hash", hashing.DEFAULT)
    return {
        "path": display(directory),
        "manifest": {
            "algorithm": algorithm,
            "hash": hashing.file_digest(directory / MANIFEST, algorithm),
        },
        "config": manifest.get("config"),
        "samples": kept,
        "samples_absent": int(num_input - kept),
        "absent": absent,
    }


def read_packed(directory: Path) -> tuple[Samples, dict]:
    """The samples held by a packer output, and what the new manifest records about it."""
    manifest = packer_manifest(directory)
    if manifest is None:
        if has_leftovers(directory):
            raise incomplete_output(str(directory))
        raise PackedInputError("not a packer output (no manifest.json)", where=str(directory))
    check_format_version(manifest, directory / MANIFEST)
    if config_multiple(manifest.get("config", {})) > 1:
        raise PackedInputError(
            "a CP output (cp_size above 1 or sequence_parallel): its segments carry CP padding, so "
            f"{option('repack=True', '--repack')} does not read it; pack the original inputs "
            "again instead",
            where=str(directory),
        )
    if manifest.get("config", {}).get("pairs"):
        raise PackedInputError(
            "a pairs output (pack --pairs): a repack would pack each side as a separate sample "
            f"and could split a pair across rows, so {option('repack=True', '--repack')} does not "
            "read it; pack the pair files again with --pairs instead",
            where=str(directory),
        )
    if manifest.get("mixture") is not None:
        raise PackedInputError(
            "a mixture's or a validation split's output (pack --mix or --validation-split): its "
            "samples are repeated or left out by design, so "
            f"{option('repack=True', '--repack')} does not read it; pack the sources again "
            "with --mix instead",
            where=str(directory),
        )
    has_labels = any(inp.get("has_labels") for inp in manifest.get("inputs", []))
    p = _read_pieces(directory, manifest)
    p.sort()
    first = _first_pieces(directory, p)

    ends = np.cumsum(p.length)
    starts = ends - p.length
    gather = np.repeat(p.tok - starts, p.length) + np.arange(int(ends[-1]))
    all_ids = np.concatenate(p.ids) if len(p.ids) > 1 else p.ids[0]
    tokens = np.ascontiguousarray(all_ids[gather], dtype=np.int32)
    labels = None
    if has_labels:
        all_lab = np.concatenate(p.labels) if len(p.labels) > 1 else p.labels[0]
        labels = np.ascontiguousarray(all_lab[gather], dtype=np.int32)
        _restore_split_labels(directory, manifest, p, first, starts, labels)
    del gather

    kept = p.sample[first]
    sample_ends = np.append(ends[np.flatnonzero(first)[1:] - 1], ends[-1])
    offsets = np.zeros(kept.size + 1, np.int64)
    offsets[1:] = sample_ends
    sources = [RepackedSource.from_manifest(inp, packed=directory) for inp in manifest["inputs"]]
    num_input = sum(s.num_samples for s in sources)
    absent = absent_samples(manifest)
    _check_accounting(directory, manifest, num_input, int(kept.size), absent)
    index = None if kept.size == num_input and kept[-1] == num_input - 1 else kept
    samples = Samples(tokens=tokens, offsets=offsets, labels=labels, sources=sources, index=index)
    return samples, _origin(directory, manifest, int(kept.size), num_input, absent)


def _refuse(path: Path, what: str) -> InputError:
    """A packer output that is not what its manifest says: bad data (exit 1), not bad options."""
    return InputError(
        f"{what}: run `packer verify` on it; {option('repack=True', '--repack')} reads only "
        "an output that passes",
        where=str(path),
    )


def _check_shard_file(path: Path, entry: dict) -> None:
    """The shard the manifest lists, with its recorded size and digest (one read of it)."""
    if not path.is_file():
        raise _refuse(path, "listed in manifest.json but missing")
    size = path.stat().st_size
    if "bytes" in entry and size != int(entry["bytes"]):
        raise _refuse(path, f"{size} bytes where manifest.json records {entry['bytes']}")
    recorded = hashing.recorded(entry)
    if recorded is None:
        raise _refuse(path, "manifest.json records no digest for this shard")
    if hashing.file_digest(path, recorded[0]) != recorded[1]:
        raise _refuse(path, f"its {recorded[0]} differs from manifest.json (changed after packing)")


def _check_shard_counts(path: Path, entry: dict, batches) -> None:
    """Rows, tokens and segments as the manifest records them for this shard."""
    found = {
        "rows": sum(b.rows for b in batches),
        "tokens": sum(int(b.ids_off[-1] - b.ids_off[0]) if b.rows else 0 for b in batches),
        "segments": sum(int(b.sample_index.size) for b in batches),
    }
    for key, value in found.items():
        if key in entry and int(entry[key]) != value:
            raise _refuse(path, f"holds {value} {key} where manifest.json records {entry[key]}")


def absent_samples(manifest: dict) -> dict:
    """Samples of the original inputs that an output leaves out, by why: `dropped` (over-length,
    `--overlength drop`), `rejected` (`--on-error skip`), counted through every earlier repack,
    and `truncated` (kept, shortened). `dropped_over`/`truncated_to`: the smallest L under which
    a pack of the chain dropped/truncated (what `verify --input` allows a sample to lose)."""
    stats, cfg = manifest.get("stats", {}), manifest.get("config", {})
    prior = manifest.get("repacked_from", {}).get("absent", {})
    absent = {
        key: int(prior.get(key, 0)) + int(stats.get(key, 0))
        for key in ("dropped", "rejected", "truncated")
    }
    for key, mode in (("dropped_over", "drop"), ("truncated_to", "truncate")):
        limits = [prior[key]] if prior.get(key) is not None else []
        if cfg.get("overlength") == mode and stats.get(key.split("_")[0], 0):
            limits.append(int(cfg["max_len"]))
        absent[key] = min(limits) if limits else None
    return absent


def _check_accounting(
    directory: Path, manifest: dict, num_input: int, found: int, absent: dict
) -> None:
    """The shards hold every sample the manifest says was packed, and its stats add up."""
    stats = manifest.get("stats", {})
    where = directory / MANIFEST
    if int(stats.get("samples_in", num_input)) != num_input:
        raise _refuse(
            where,
            f"stats say {stats['samples_in']} samples in but its inputs hold {num_input}",
        )
    packed = int(stats.get("samples_packed", -1))
    if packed != found:
        raise _refuse(
            where,
            f"records {packed} samples packed but its shards hold {found} "
            f"({abs(packed - found)} {'missing' if found < packed else 'more'})",
        )
    left_out = absent["dropped"] + absent["rejected"]
    if num_input - found != left_out:
        raise _refuse(
            where,
            f"{num_input - found} of its {num_input} samples are in no shard but it accounts "
            f"for {left_out} (dropped {absent['dropped']}, rejected {absent['rejected']})",
        )
