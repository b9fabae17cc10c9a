"""The tokenize cache: `packer pack RAW --tokenizer` tokenizes once and packs from the cache.

An entry is a complete `packer tokenize` output under `PACKER_CACHE_DIR/tokenized/KEY` (the
directory packer keeps its remote copies in; the system temp directory by default). KEY hashes
what decides the shards' bytes: every input file's content (xxh3 of its bytes, so a renamed or
touched file still hits and an edited one misses), the encoder's fingerprint (tokenizer files,
template text, options, library versions), the raw column names, the error policy and the
shard layout. A second pack of the same raw data at another L, strategy or CP size reads the
entry instead of tokenizing again. Entries are put in place by rename, so a reader sees a
complete entry or none; two runs that race both tokenize and the second keeps the first's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from packer import hashing
from packer.contract.remote import cache_root
from packer.tokenize.files import BATCH_BYTES, BATCH_ROWS, raw_inputs
from packer.tokenize.output import FORMAT, read_tokenized
from packer.tokenize.run import TokenizeResult, tokenize


def cache_dir() -> Path:
    return cache_root() / "tokenized"


def cache_key(files, encoder, columns, on_error: str) -> str:
    digest = hashlib.sha256()
    parts = {
        "format": FORMAT,
        "batch": [BATCH_ROWS, BATCH_BYTES],
        "encoder": encoder.fingerprint,
        "columns": asdict(columns),
        "on_error": on_error,
        "inputs": [[f.fmt, f.compression, hashing.file_digest(f.path)] for f in files],
    }
    digest.update(json.dumps(parts, sort_keys=True).encode())
    return digest.hexdigest()[:32]


def tokenized_input(
    inputs: Iterable[str | Path],
    encoder,
    columns=None,
    *,
    workers: int | None = None,
    memory_budget: int | str | None = None,
    on_error: str = "error",
    progress=None,
    skip: Path | str | None = None,
) -> TokenizeResult:
    """The cache entry for these raw inputs and this encoder, tokenized now if missing.

    `result.output` is the entry's directory (Parquet input for `packer pack`); `result.reused`
    says whether it was there already. skip: the output being written (left out of inputs)."""
    from packer.tokenize.records import RawColumns

    columns = columns if columns is not None else RawColumns()
    files = raw_inputs(list(inputs), skip=skip)
    entry = cache_dir() / cache_key(files, encoder, columns, on_error)
    manifest = read_tokenized(entry)
    if manifest is not None:
        stats = manifest.get("stats", {})
        return TokenizeResult(
            output=str(entry),
            manifest=manifest,
            lines=stats.get("lines", 0),
            samples=stats.get("samples", 0),
            tokens=stats.get("tokens", 0),
            trained=stats.get("trained_tokens", 0),
            rejected=stats.get("rejected", 0),
            reused=True,
        )
    return tokenize(
        files,
        entry,
        encoder,
        columns,
        workers=workers,
        memory_budget=memory_budget,
        on_error=on_error,
        progress=progress,
    )


def describe_source(result: TokenizeResult) -> dict:
    """What a packed output's manifest records of the raw data it was tokenized from."""
    manifest = result.manifest
    return {
        "cache": result.output,
        "encoder": manifest.get("encoder"),
        "inputs": manifest.get("inputs"),
        "stats": manifest.get("stats"),
    }
