"""Proof, not trust: an engine is used for a tokenizer only where it gives the reference's ids
on the probe set (`packer.tokenize.probes`) and on the run's own texts.

Every probe is encoded by both engines with and without `add_special_tokens`; the first probe
whose ids differ (or on which one engine fails) makes the verdict "not equal" and is named in
it. The verdict on the probe set is cached under `PACKER_CACHE_DIR/engines/KEY.json` (the
directory of packer's other caches), KEY hashing what decides it: the backend's JSON (what both
engines load), the digest of the tokenizer's files, the versions of tokenizers and fastokens,
and `PROBES_VERSION`; a second run on the same tokenizer reads it instead of probing again, and
an edited tokenizer misses it. The caller's `extra_texts` (the first batch's renders) are
specific to the run: they are compared every time, never cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packer.contract.remote import cache_root
from packer.tokenize.probes import PROBES_VERSION, probe_texts

SHOWN = 60  # characters of a differing probe quoted in the verdict


@dataclass
class Proof:
    """The verdict: `difference` names the first differing probe (None where equal);
    `probes`: how many texts were compared; `cached`: whether the probe set's verdict came
    from the cache (the extra texts are compared either way)."""

    equal: bool
    probes: int
    difference: str | None = None
    seconds: float = 0.0
    cached: bool = False


def proof_dir() -> Path:
    return cache_root() / "engines"


def proof_key(backend_json: str, tokenizer_sha256: str | None, engine: str) -> str:
    parts = {
        "backend": hashlib.sha256(backend_json.encode("utf-8")).hexdigest(),
        "files": tokenizer_sha256,
        "engine": engine,
        "versions": [installed("tokenizers"), installed(engine)],
        "probes": PROBES_VERSION,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def proof_path(backend_json: str, tokenizer_sha256: str | None, engine: str) -> Path:
    """Where the verdict for this tokenizer and engine is kept; `resolve_engine` keeps an
    engine's refusal to load the tokenizer there too (fastokens takes a second or more to
    refuse a 65,000-token vocabulary)."""
    return proof_dir() / f"{proof_key(backend_json, tokenizer_sha256, engine)}.json"


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def prove_equal(
    reference,
    engine,
    backend,
    *,
    backend_json: str | None = None,
    tokenizer_sha256: str | None = None,
    extra_texts: list[str] = (),
    cache: bool = True,
    path: Path | None = None,
) -> Proof:
    """Whether `engine` gives `reference`'s ids for `backend`'s tokenizer (see the module).
    path: the verdict's `proof_path`, where the caller has it (a hash of the backend's JSON,
    ~17 ms for a 2 MB one)."""
    if cache and path is None:
        backend_json = backend.to_str() if backend_json is None else backend_json
        path = proof_path(backend_json, tokenizer_sha256, engine.name)
    proof = read_proof(path) if cache else None
    if proof is None:
        started = time.perf_counter()
        probes = probe_texts(backend)
        difference = first_difference(reference, engine, probes, "probe")
        proof = Proof(difference is None, len(probes), difference)
        proof.seconds = round(time.perf_counter() - started, 4)
        if cache:
            write_proof(path, proof)
    else:
        proof.cached = True
    if proof.equal and extra_texts:
        difference = first_difference(reference, engine, list(extra_texts), "text")
        proof.probes += len(extra_texts)
        proof.equal, proof.difference = difference is None, difference
    return proof


def first_difference(
    reference, engine, texts: list[str], noun: str, specials: tuple = (False, True)
) -> str | None:
    """Why `engine` is not `reference` on `texts` (`ENGINE gives other ids than tokenizers on
    NOUN N (repr, add_special_tokens=B): token K is X in tokenizers, Y in ENGINE`), or None.
    specials: the `add_special_tokens` values compared (a run's own texts: the one each is
    tokenized with). A text the reference cannot encode (a lone surrogate) is left out: the
    run reports it."""
    if not texts:
        return None
    for special in specials:
        numbered, expected = encodable(reference, texts, special)
        try:
            got = engine.encode_batch([t for _, t in numbered], add_special_tokens=special)
        except Exception as e:  # an engine that fails where the reference does not
            reason = str(e).strip().splitlines()
            return (
                f"{engine.name} fails on the {noun}s: {reason[0] if reason else type(e).__name__}"
            )
        if len(got) != len(expected):
            return f"{engine.name} gives {len(got)} encodings for {len(expected)} texts"
        for (n, text), want, have in zip(numbered, expected, got):
            if want != have:
                where = f"{noun} {n} ({shown(text)}, add_special_tokens={special})"
                return f"{engine.name} gives other ids than tokenizers on {where}: " + (
                    token_difference(want, have, engine.name)
                )
    return None


def encodable(reference, texts: list[str], special: bool):
    """((index, text) of the texts the reference encodes, their ids)."""
    numbered = list(enumerate(texts))
    try:
        return numbered, reference.encode_batch(texts, add_special_tokens=special)
    except Exception:
        kept, ids = [], []
        for n, text in numbered:
            try:
                ids.append(reference.encode_batch([text], add_special_tokens=special)[0])
            except Exception:
                continue
            kept.append((n, text))
        return kept, ids


def token_difference(want: list[int], have: list[int], name: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
    if at < len(want) and at < len(have):
        return f"token {at} is {want[at]} in tokenizers, {have[at]} in {name}"
    return f"{len(want)} tokens in tokenizers, {len(have)} in {name}"


def shown(text: str) -> str:
    quoted = repr(text)
    return quoted if len(quoted) <= SHOWN else quoted[: SHOWN - 3] + "..."


def read_proof(path: Path) -> Proof | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Proof(
            equal=bool(data["equal"]),
            probes=int(data["probes"]),
            difference=data["difference"],
            seconds=float(data["seconds"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: probe again


def write_proof(path: Path, proof: Proof) -> None:
    """Put in place by rename, so a reader sees a whole verdict or none; a cache that cannot
    be written costs the next run a probe, nothing else."""
    data = {k: v for k, v in asdict(proof).items() if k != "cached"}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".proof-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
