"""`export`: a committed packer output rewritten in a trainer's own format, committed atomically.

The output is read shard by shard and record batch by record batch (about 1M tokens each), so
memory stays bounded whatever the output's size; the export is built in a hidden directory
beside DEST and renamed into place with `packer_export.json` (its own manifest, naming the
source manifest's sha256) written last, as `pack` commits: a failed or killed export leaves
nothing that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from packer.arguments import parse_size
from packer.errors import InputError, PackerError, UsageError, option
from packer.export import kernels, mds, megatron, megatron_bridge, trl
from packer.export.rows import label_mismatch, row_of_token
from packer.export.source import Source, open_source
from packer.hashing import file_digest
from packer.planning.multiple import config_multiple
from packer.read.cache import default_budget
from packer.storage import display, is_url
from packer.version import __version__
from packer.write.commit import building, commit, start

FORMATS = ("megatron-bridge", "megatron", "mds", "trl")
EXPORT_MANIFEST = "packer_export.json"
ACCEPTS = ("labels-from-ids",)  # what a user may accept that changes training
_WRITERS = {
    "megatron-bridge": megatron_bridge.BridgeWriter,
    "megatron": megatron.MegatronWriter,
    "mds": mds.MdsWriter,
    "trl": trl.TrlWriter,
}
_NOTES = {
    "megatron-bridge": megatron_bridge.NOTES,
    "megatron": megatron.NOTES,
    "mds": mds.NOTES,
    "trl": trl.NOTES,
}


@dataclass
class ExportResult:
    dest: Path
    format: str
    rows: int = 0
    samples: int = 0
    tokens: int = 0
    files: list[dict] = field(default_factory=list)
    notes: tuple[str, ...] = ()
    details: dict = field(default_factory=dict)
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()  # what the user may want to change; the export is complete

    def to_dict(self) -> dict:
        return {
            "output": str(self.dest),  # the --output directory, as pack names its own
            "format": self.format,
            "rows": self.rows,
            "samples": self.samples,
            "tokens": self.tokens,
            "files": self.files,
            "notes": list(self.notes),
            "details": self.details,
            "warnings": list(self.warnings),
            "seconds": round(self.seconds, 3),
        }


def export(
    output: str | Path,
    to: str,
    dest: str | Path,
    *,
    overwrite: bool = False,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    accept: tuple[str, ...] | list[str] = (),
    mds_size_limit: int = mds.DEFAULT_SIZE_LIMIT,
    memory_budget: int | str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExportResult:
    """Write the committed packer output in `output` to `dest` in format `to`.

    `to` is one of FORMATS. `vocab_size` picks Megatron's token dtype (default: the largest
    id + 1); `eos_id` is recorded for Megatron-Bridge, whose collator pads with it; `accept`
    lists the losses the user accepts (`labels-from-ids`: train on the next input id where a
    label differs from it, for Megatron-Bridge). `memory_budget` (bytes or a size such as
    "512MiB"; default min(8 GiB, half the available memory)) caps the working memory: record
    batches are taken in runs of rows that fit it. `progress(rows_done, rows_total)` is called
    after every batch, from the writing threads one at a time."""
    started = time.perf_counter()
    source, dest = _checked(output, to, dest, overwrite, vocab_size, eos_id, accept, mds_size_limit)
    try:
        result = _export(
            source,
            to,
            dest,
            overwrite,
            vocab_size,
            eos_id,
            accept,
            mds_size_limit,
            memory_budget,
            progress,
        )
    finally:
        source.close()
    result.seconds = time.perf_counter() - started
    return result


def _export(
    source, to, dest, overwrite, vocab_size, eos_id, accept, mds_size_limit, memory_budget, progress
) -> ExportResult:
    """The export of an opened source (see `export`)."""
    max_len = int(source.manifest["config"]["max_len"])
    max_tokens = batch_tokens(max_len, to, memory_budget, mds_size_limit)
    total_rows = int(source.manifest.get("stats", {}).get("rows", 0))
    config = source.manifest["config"]
    multiple = config_multiple(config)
    kernels.load()  # before anything is made: a signal cannot land inside the load
    tmp = start(dest)
    notes = _NOTES[to] if config.get("pad") else _unpadded(_NOTES[to])
    result = ExportResult(dest, to, notes=notes + _cp_notes(to, config))
    with building(tmp, dest):
        writer = _writer(to, tmp, source, vocab_size, mds_size_limit, eos_id)
        vocab = (getattr(writer, "vocab_size", None), vocab_size is not None)
        check = _checks(to, accept, multiple, eos_id, vocab)
        counts = _write_shards(writer, source, check, max_tokens, progress, total_rows)
        for rows, samples, tokens in counts:
            result.rows += rows
            result.samples += samples
            result.tokens += tokens
        result.details, result.warnings = writer.finish(), getattr(writer, "warnings", ())
        if eos_id is not None:
            result.details["eos_id"] = eos_id
        known = getattr(writer, "digests", {})  # hashed while written, not read back
        result.files = [
            {
                "file": p.name,
                "bytes": p.stat().st_size,
                "xxh3_128": known.get(p.name) or file_digest(p),
            }
            for p in sorted(tmp.iterdir())
        ]
        manifest = {
            "packer_version": __version__,
            "format": to,
            "source": {
                "path": source.name or str(source.directory),
                "manifest_sha256": hashlib.sha256(source.manifest_bytes).hexdigest(),
            },
            "rows": result.rows,
            "samples": result.samples,
            "tokens": result.tokens,
            "files": result.files,
            "notes": list(result.notes),
            "details": result.details,
            "accepted": sorted(accept),
        }
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        commit(tmp, dest, overwrite=overwrite)
    return result


def _checks(to: str, accept, multiple: int, eos_id, vocab: tuple) -> Callable:
    """What every batch must pass before the format takes it (raises a PackerError)."""

    def check(batch) -> None:
        if to == "megatron":
            _refuse_ids_outside(batch, *vocab)
        if to == "megatron-bridge" and "labels-from-ids" not in accept:
            _refuse_label_mismatch(batch)
        if to == "megatron-bridge" and multiple > 1:
            _refuse_loss_in_eos_tail(batch, eos_id)

    return check


def _write_shards(writer, source: Source, check, max_tokens: int, progress, total_rows: int):
    """Each source shard through `writer`, two at a time where its shards are separate files;
    the (rows, samples, tokens) of each shard, in shard order."""
    threads = max(1, min(THREADS, len(source.shards))) if writer.PARALLEL else 1
    lock, done = threading.Lock(), [0]

    def one_shard(number: int) -> tuple[int, int, int]:
        shard = writer.shard(number)
        rows = samples = tokens = 0
        reading = None
        try:
            reading = source.reading(source.shards[number])
            for batch in reading.batches(max_tokens):
                check(batch)
                shard.write(batch)
                rows += batch.rows
                samples += int(batch.seq_off[-1])
                tokens += int(batch.ids.size)
                if progress is not None:
                    with lock:
                        done[0] += batch.rows
                        progress(done[0], total_rows)
        except PackerError:  # a shard changed after packing is named as that
            if reading is not None:
                reading.check()
            raise
        finally:
            shard.close()
        return rows, samples, tokens

    numbers = range(len(source.shards))
    if threads == 1:
        return [one_shard(n) for n in numbers]
    with ThreadPoolExecutor(threads, thread_name_prefix="packer-export") as pool:
        try:  # in shard order: the first failing shard is the one a serial run names
            return list(pool.map(one_shard, numbers))
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def _checked(output, to, dest, overwrite, vocab_size, eos_id, accept, mds_size_limit):
    if to not in FORMATS:
        raise UsageError(f"{option('to', '--to')} must be one of {', '.join(FORMATS)}, got {to!r}")
    for what in accept:
        if what not in ACCEPTS:
            raise UsageError(
                f"{option('accept', '--accept')} takes {', '.join(ACCEPTS)}, got {what!r}"
            )
    for name, flag, value in (
        ("vocab_size", "--vocab-size", vocab_size),
        ("eos_id", "--eos-id", eos_id),
    ):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise UsageError(f"{option(name, flag)} must be a non-negative integer, got {value!r}")
    if mds_size_limit <= 0 or mds_size_limit >= 1 << 32:
        raise UsageError(
            f"{option('mds_size_limit', '--mds-size-limit')} must be between 1 byte and 4 GiB"
        )
    source = open_source(output)
    try:
        return _checked_with(source, to, dest, overwrite, eos_id)
    except BaseException:
        source.close()
        raise


def _checked_with(source: Source, to, dest, overwrite, eos_id):
    if (
        to == "megatron-bridge"
        and config_multiple(source.manifest["config"]) > 1
        and eos_id is None
    ):
        raise UsageError(
            f"{option('eos_id', '--eos-id')} is needed to export a --cp-size (or "
            "--sequence-parallel) output to "
            "Megatron-Bridge: its CP layout pads every sub-sequence with EOS and finds each "
            "sample's real end by it",
            where=source.name or str(source.directory),
        )
    if is_url(str(dest)):
        raise UsageError(
            f"{option('dest', '--output')} must be a local directory: exports are written "
            "locally (copy the committed directory to a store afterwards)",
            where=display(str(dest)),
        )
    dest = Path(dest)
    check_outside(dest, source.directory)
    check_destination(dest, overwrite)
    if source.rows == 0 and to in EMPTY_REFUSED:
        raise InputError(
            f"the output holds no rows (see its manifest's stats), and {EMPTY_REFUSED[to]}; "
            "nothing was written",
            where=source.name or str(source.directory),
        )
    return source, dest


# the formats whose own readers refuse an empty dataset (read in their sources, run here)
EMPTY_REFUSED = {
    "megatron": "Megatron-LM's IndexedDataset cannot map an empty .bin file",
    "mds": "streaming's StreamingDataset refuses a stream without samples",
    "megatron-bridge": "Megatron-Bridge's packed Parquet dataset refuses 0 rows",
}


def check_outside(dest: Path, output: Path, flag: str = "--output") -> None:
    """Refuse an export destination inside the packer output it exports (`flag`: how the
    command that takes it names it)."""
    resolved, src = Path(dest).resolve(), Path(output).resolve()
    if resolved == src or src in resolved.parents:
        raise UsageError(
            f"{option('dest', flag)} must be outside the packer output", where=str(dest)
        )


# shards of a format whose shards are separate files (TRL, Megatron-Bridge) written at once:
# Arrow and Parquet encoding release the GIL, so two threads keep both cores of a small machine
# busy; each takes half the memory budget
THREADS = 2
# the export's working memory per token in flight (one batch per writing thread), beyond the
# ~100 MiB that the interpreter and its libraries take: measured as peak RssAnon less that base
# (scripts/bench_export.py --memory-budget). Parquet's encoder is the hungriest: levels, pages,
# their compression and the allocator's cache.
BYTES_PER_TOKEN = {"megatron-bridge": 144, "megatron": 48, "mds": 64, "trl": 48}
PARQUET_WRITER = 24 << 20  # per thread: its buffers and row-group metadata, whatever the batch


def batch_tokens(max_len: int, to: str, memory_budget, mds_size_limit: int) -> int:
    """The most tokens one batch may hold under `memory_budget` (each writing thread has one
    in flight); refuses a budget below what one row per thread, plus the MDS shard held until
    it is cut, needs."""
    flag = option("memory_budget", "--memory-budget")
    budget = default_budget() if memory_budget is None else parse_size(memory_budget, flag)
    threads = THREADS if _WRITERS[to].PARALLEL else 1
    # the pending MDS shard; a Parquet writer's own buffers, whatever the batch
    fixed = mds_size_limit if to == "mds" else PARQUET_WRITER * threads * (to == "megatron-bridge")
    row_bytes = max_len * BYTES_PER_TOKEN[to] * threads
    if budget < fixed + row_bytes:
        need = -(-(fixed + row_bytes) // (1 << 20))
        held = f" (a row of {max_len} tokens and one {option('mds_size_limit', '--mds-size-limit')} shard)"
        rows = f" for a row of {max_len} tokens" + (
            f" in each of {threads} threads" if threads > 1 else ""
        )
        raise UsageError(
            f"{flag} {memory_budget} is below the {need} MiB this export needs"
            + (held if to == "mds" else rows)
        )
    return (budget - fixed) // (BYTES_PER_TOKEN[to] * threads)


def check_destination(dest: Path, overwrite: bool) -> None:
    """Refuse an export destination that cannot be (re)placed, before any work is done."""
    if dest.exists() or dest.is_symlink():
        if not dest.is_dir():
            raise UsageError("export destination exists and is not a directory", where=str(dest))
        if not overwrite:
            raise UsageError(
                f"export destination exists; pass {option('overwrite=True', '--overwrite')} "
                "to replace it",
                where=str(dest),
            )
        if not (dest / EXPORT_MANIFEST).is_file() and any(dest.iterdir()):
            raise UsageError(
                f"refusing to overwrite a non-empty directory that is not a packer export "
                f"(no {EXPORT_MANIFEST})",
                where=str(dest),
            )


def _unpadded(notes: tuple[str, ...]) -> tuple[str, ...]:
    """A note about --pad concerns padded outputs only."""
    return tuple(note for note in notes if "--pad" not in note)


def _cp_notes(to: str, config: dict) -> tuple[str, ...]:
    multiple = config_multiple(config)
    if multiple <= 1:
        return ()
    if to == "megatron-bridge":
        return (
            f"rows keep the CP layout: each sub-sequence padded with EOS as Bridge's "
            f"pad_seq_to_mult = {multiple} does (set it in packed_sequence_specs)",
        )
    cp_size = int(config.get("cp_size") or 1)
    flags = f"--cp-size {cp_size}" if cp_size > 1 else ""
    if config.get("sequence_parallel"):
        tp = f"--tp-size {int(config.get('tp_size') or 1)} --sequence-parallel"
        flags = f"{flags} {tp}".strip()
    return (
        f"the CP padding ({flags}) is not carried: every sample keeps its real "
        "tokens only, and the trainer pads for context parallelism itself",
    )


def _writer(to: str, tmp: Path, source: Source, vocab_size, mds_size_limit, eos_id=None):
    if to == "trl":
        fingerprint = hashlib.sha256(source.manifest_bytes).hexdigest()[:16]
        return trl.TrlWriter(tmp, len(source.shards), fingerprint)
    if to == "megatron":
        sized = vocab_size is not None
        return megatron.MegatronWriter(tmp, vocab_size or source.max_token_id() + 1, sized)
    if to == "mds":
        return mds.MdsWriter(tmp, mds_size_limit)
    multiple = config_multiple(source.manifest["config"])
    return megatron_bridge.BridgeWriter(
        tmp, int(source.manifest["config"]["max_len"]), multiple, eos_id
    )


def _refuse_loss_in_eos_tail(batch, eos_id: int) -> None:
    token = megatron_bridge.first_loss_after_eos_tail(batch, eos_id)
    if token is None:
        return
    row = batch.first_row + row_of_token(batch, token)
    raise UsageError(
        f"row {row}: a sample ends in --eos-id {eos_id} tokens that carry loss; Megatron-Bridge's "
        "CP collate counts a sample's real tokens up to its last non-EOS id, so it would drop "
        "that loss; nothing was written",
        where=batch.shard,
    )


def _refuse_ids_outside(batch, vocab_size: int, given: bool) -> None:
    """Megatron stores ids as its dtype for `vocab_size` (`given` by the user, else the largest
    id + 1): one outside 0..vocab_size-1 would wrap (100000 as uint16 is 34464) or index past
    the embedding."""
    ids = batch.ids
    if not ids.size or (int(ids.min()) >= 0 and int(ids.max()) < vocab_size):
        return
    token = int(np.argmax((ids < 0) | (ids >= vocab_size)))
    row = batch.first_row + row_of_token(batch, token)
    what = f" ({option('vocab_size', '--vocab-size')} {vocab_size})" if given else ""
    ident, dtype = int(ids[token]), megatron.optimal_dtype(vocab_size)
    stored = int(ids[token : token + 1].astype(dtype)[0])
    why = (
        f"as {dtype.name} it would be stored as {stored}"
        if stored != ident
        else "the model's embedding has no row for it"
    )
    raise InputError(
        f"row {row}: input id {ident} is outside the vocabulary 0..{vocab_size - 1}{what}: "
        f"{why}; nothing was written",
        where=batch.shard,
    )


def _refuse_label_mismatch(batch) -> None:
    token = label_mismatch(batch)
    if token is None:
        return
    row = batch.first_row + row_of_token(batch, token)
    label, ident = int(batch.labels[token]), int(batch.ids[token])
    accept = option('accept=["labels-from-ids"]', "--accept labels-from-ids")
    raise UsageError(
        f"row {row}: label {label} differs from its input id {ident}; Megatron-Bridge derives "
        f"targets from the input ids and keeps only a loss mask; pass "
        f"{accept} to train on the input ids there; nothing was written",
        where=batch.shard,
    )
