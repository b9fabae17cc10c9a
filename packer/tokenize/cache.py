"""The tokenize cache: `packer pack RAW --tokenizer` tokenizes once and packs from the cache.

An entry is a complete `packer tokenize` output under `PACKER_CACHE_DIR/tokenized/KEY` (the
directory packer keeps its remote copies in; the system temp directory by default). KEY hashes
what decides the shards' bytes: every input file's content (xxh3 of its bytes, so a renamed or
touched file still hits and an edited one misses), the encoder's fingerprint (tokenizer files,
template text, options, library versions), the raw column names, the error policy and the
shard layout. A second pack of the same raw data at another L, strategy or CP size reads the
entry instead of tokenizing again. Entries are put in place by rename, so a reader sees a
complete entry or none; two runs that race both tokenize and the second keeps the first's.

An entry is used only when every shard its `tokenized.json` lists is there with its recorded
hash and no other shard is (checked as the entry is read: 25 to 55 ms per 100 MB of shards
in the page cache, `scripts/bench_trust_checks.py`); otherwise, and where `tokenized.json` is missing or unreadable, the entry
is tokenized again and replaced, and `result.rebuilt` says why.
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
from packer.tokenize.output import FORMAT, TOKENIZED, read_tokenized, unsound
from packer.tokenize.run import TokenizeResult, describe_inputs, tokenize_entry


def cache_dir() -> Path:
    return cache_root() / "tokenized"


def local_tokenizer_key(
    tokenizer, chat_template=None, train_on: str = "assistant", allow_empty_mask: bool = False
) -> str | None:
    """What identifies an encoder of a local tokenizer directory without building it (no
    transformers import, no tokenizer load: a second or two of every cached run): its files'
    bytes, the template file's, the options, the encoding's and the libraries' versions. None
    for a hub name, whose files are only known once loaded."""
    from importlib.metadata import PackageNotFoundError, version

    from packer.tokenize.encode import ENCODING_VERSION
    from packer.tokenize.loading import files_digest

    directory = Path(str(tokenizer)).expanduser()
    if not directory.is_dir():
        return None
    try:
        template = None if chat_template is None else Path(chat_template).read_bytes()
        libraries = [version("tokenizers"), version("transformers")]
    except (OSError, PackageNotFoundError):
        return None  # the encoder's construction reports it
    parts = {
        "encoding": ENCODING_VERSION,
        "tokenizer": files_digest(directory),
        "template": None if template is None else hashlib.sha256(template).hexdigest(),
        "train_on": train_on,
        "allow_empty_mask": bool(allow_empty_mask),
        "libraries": libraries,
    }
    return "local:" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_key(files, encoder_key: str, columns, on_error: str) -> str:
    digest = hashlib.sha256()
    parts = {
        "format": FORMAT,
        "batch": [BATCH_ROWS, BATCH_BYTES],
        "encoder": encoder_key,
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
    encoder_key: str | None = None,
    resume: bool = False,
    runner=None,
) -> TokenizeResult:
    """The cache entry for these raw inputs and this encoder, tokenized now if missing.

    encoder: an `Encoder`, or a function that builds one, called only when the entry is
    missing; then `encoder_key` (`local_tokenizer_key`) must identify it. `result.output` is the
    entry's directory (Parquet input for `packer pack`); `result.reused` says whether it was
    there already. skip: the output being written (left out of inputs). resume: a killed run's
    finished batches of this entry are kept; runner: the batches run on an engine (both as
    `tokenize` takes them)."""
    from packer.tokenize.records import RawColumns

    columns = columns if columns is not None else RawColumns()
    files = raw_inputs(list(inputs), skip=skip)
    if encoder_key is None:
        encoder = encoder() if callable(encoder) else encoder
        encoder_key = encoder.fingerprint
    entry = cache_dir() / cache_key(files, encoder_key, columns, on_error)
    manifest = read_tokenized(entry)
    problem = unsound(entry, manifest) if manifest is not None else None
    if manifest is not None and problem is None:
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
            inputs=describe_inputs(files),  # the user's files, whatever the entry was made from
        )
    if manifest is None and (entry.exists() or entry.is_symlink()):
        problem = f"its {TOKENIZED} is missing or unreadable"
    result = tokenize_entry(
        files,
        entry,
        encoder() if callable(encoder) else encoder,
        columns,
        workers=workers,
        memory_budget=memory_budget,
        on_error=on_error,
        progress=progress,
        resume=resume,
        runner=runner,
    )
    result.rebuilt = problem
    return result


def describe_source(result: TokenizeResult) -> dict:
    """What a packed output's manifest records of the raw data it was tokenized from: the raw
    files this pack was given (an entry found by content may have been made from a copy of
    them under another name, which its own `tokenized.json` names)."""
    manifest = result.manifest
    return {
        "cache": result.output,
        "encoder": manifest.get("encoder"),
        "inputs": result.inputs or manifest.get("inputs"),
        "stats": manifest.get("stats"),
    }
