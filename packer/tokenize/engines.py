"""Tokenizer engines: what turns texts into ids, behind one small interface.

- `hf`: the 🤗 `tokenizers` backend of the loaded tokenizer, called as packer calls it;
  the reference.
- `fastokens`: the Rust BPE encoder of the `fastokens` package (the `fastokens` extra), built
  from the same backend's JSON (`to_str`), so it sees every added token transformers added. It
  gives ids only: no offsets, no `char_to_token` (`packer.tokenize.boundaries` finds token
  boundaries without them), and it loads BPE models only, with some normalizers and
  pre-tokenizers missing (NFKC, Metaspace, Whitespace...).

An engine's `encode_batch(texts, add_special_tokens=...)` gives each text's ids exactly as the
`hf` engine does: with `add_special_tokens` the post-processor's tokens (BOS...) are added, as
for plain texts and completions; without, none are, as for chat renders. `resolve_engine`
picks the engine of a run: fastokens only where it loads this tokenizer and is proven to give
HF's ids on it (`packer.tokenize.proof`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import chain

import numpy as np

from packer.errors import EXIT_FAILURE, UsageError, option

ENGINES = ("auto", "hf", "fastokens")
# `auto` builds fastokens only for an input of at least this many bytes per vocabulary entry:
# its build costs about 30 us an entry (2-7 s for Llama 3's 128,256 on 2 cores), which is what
# hf takes to encode some 36 bytes of text an entry (150,000-560,000 tokens a second, about 4
# bytes a token), so that below it hf finishes first (docs/engines.md)
AUTO_BYTES_PER_ENTRY = 32
BUILT_KEPT = 2  # fastokens encoders kept built per process (the last tokenizers used)


def worth_building(backend, input_bytes: int | None) -> bool:
    """Whether `auto` tries fastokens for an input of `input_bytes` (None: not known, it does):
    only where its build is repaid by what it saves on the input."""
    if input_bytes is None:
        return True
    return input_bytes >= AUTO_BYTES_PER_ENTRY * backend.get_vocab_size(with_added_tokens=True)


class EngineError(UsageError):
    """A tokenizer engine that cannot be used for this tokenizer (exit 2); the message names
    the option, `reason` says why without it (what `auto`'s fallback line quotes)."""

    def __init__(self, message: str, *, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


class NotProven(EngineError):
    """fastokens loads the tokenizer but gives other ids than `hf` on a probe or on the run's
    own texts: a failed check (exit 1), not a usage error."""

    exit_code = EXIT_FAILURE


def refused(reason: str) -> EngineError:
    """fastokens cannot be used: not installed, or it cannot load the tokenizer (exit 2)."""
    return EngineError(f"{option('tokenizer_engine')} fastokens: {reason}", reason=reason)


def not_proven(reason: str) -> NotProven:
    return NotProven(f"{option('tokenizer_engine')} fastokens: {reason}", reason=reason)


class HFEngine:
    """The reference: the `tokenizers.Tokenizer` backend, called as packer calls it, with its
    padding and truncation off (a `tokenizer.json` may turn them on: then every text of a
    batch would be padded to the longest, or cut): a text's ids are all of its tokens."""

    name = "hf"

    def __init__(self, backend):
        if backend.padding is not None or backend.truncation is not None:
            backend = backend.__class__.from_str(backend.to_str())  # the caller's stays as is
            backend.no_padding()
            backend.no_truncation()
        self.backend = backend

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
        encoded = self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [e.ids for e in encoded]

    def encode_flat(self, texts: list[str], *, add_special_tokens: bool):
        """(values int32, offsets int64): text i's ids are values[offsets[i]:offsets[i+1]]."""
        return flatten(self.encode_batch(texts, add_special_tokens=add_special_tokens))


class FastokensEngine:
    """fastokens' `Tokenizer`, built from the HF backend's JSON, padding and truncation off
    as the reference's."""

    name = "fastokens"

    def __init__(self, native):
        native.no_padding()
        native.no_truncation()
        self.native = native

    @classmethod
    def from_backend(cls, backend) -> FastokensEngine:
        """Raises `EngineError` where fastokens is missing or cannot load this tokenizer."""
        return cls.from_json(backend.to_str())

    @classmethod
    def from_json(cls, text: str) -> FastokensEngine:
        try:
            import fastokens  # noqa: F401
        except ImportError:
            raise refused("fastokens is not installed (pip install fastokens==0.3.5)") from None
        try:
            native = _built(text)
        except Exception as e:  # ValueError: "unsupported normalizer type: NFKC", ...
            lines = str(e).strip().splitlines()
            why = lines[0] if lines else type(e).__name__
            raise refused(f"fastokens cannot load this tokenizer: {why}") from None
        return cls(native)

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
        encoded = self.native.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [e.ids for e in encoded]

    def encode_flat(self, texts: list[str], *, add_special_tokens: bool):
        """(values int32, offsets int64), from one flat buffer: no Python list per text."""
        ids, offsets = self.native.encode_batch_flat(texts, add_special_tokens=add_special_tokens)
        values = np.frombuffer(ids, np.uint32).astype(np.int32)
        return values, np.frombuffer(offsets, np.uint64).astype(np.int64)


@lru_cache(maxsize=BUILT_KEPT)
def _built(text: str):
    """fastokens' encoder for a backend's JSON, built once per process: a build costs about
    30 us a vocabulary entry, and a process that tokenizes again with the same tokenizer (a
    notebook's second `pack_dataset`, a pack after a tokenize) reuses it. Only encoders are
    kept: a JSON it cannot load raises each time (the proof's cache keeps that verdict)."""
    import fastokens

    return fastokens.Tokenizer.from_json_str(text)


def flatten(ids: list[list[int]]):
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum([len(i) for i in ids], out=offsets[1:])
    values = np.fromiter(chain.from_iterable(ids), np.int32, int(offsets[-1]))
    return values, offsets


@dataclass
class Resolved:
    """The engine a run uses, and why (`reason`: one line, None where nothing was refused):
    `auto` that fell back to `hf` says what stopped fastokens."""

    engine: HFEngine | FastokensEngine
    requested: str
    reason: str | None = None

    @property
    def name(self) -> str:
        return self.engine.name


def resolve_engine(
    requested: str,
    backend,
    *,
    tokenizer_sha256: str | None = None,
    extra_texts: list[str] = (),
    cache: bool = True,
    input_bytes: int | None = None,
) -> Resolved:
    """The engine for `backend` (a `tokenizers.Tokenizer`: `load_tokenizer(...).backend_tokenizer`).

    `hf`: the reference, always. `fastokens`: fastokens, or `EngineError` (one line) where it is
    not installed, cannot load the tokenizer or gives other ids than `hf` on the probes.
    `auto`: fastokens where it is installed and proven equal, else `hf` with the reason.
    extra_texts: the run's own texts (the first batch's renders), compared too, every time;
    tokenizer_sha256: the digest of the tokenizer's files, part of the proof's cache key;
    cache: read and write the proof's cache (`packer.tokenize.proof`); input_bytes: the size of
    the run's input, where known: `auto` takes `hf` without building fastokens, and without a
    fallback line, for an input too small to repay the build (`worth_building`)."""
    from packer.tokenize.proof import Proof, proof_path, prove_equal, read_proof, write_proof

    if requested not in ENGINES:
        raise EngineError(
            f"{option('tokenizer_engine')} must be one of {', '.join(ENGINES)}, got {requested!r}"
        )
    reference = HFEngine(backend)
    if requested == "hf" or (requested == "auto" and not worth_building(backend, input_bytes)):
        return Resolved(reference, requested)
    text = backend.to_str()
    path = proof_path(text, tokenizer_sha256, FastokensEngine.name) if cache else None
    try:
        known = read_proof(path) if cache else None
        if known is not None and not known.equal:  # fastokens refused it before: not built again
            loads = not known.difference.startswith("fastokens cannot load")
            raise (not_proven if loads else refused)(known.difference)
        try:
            fast = FastokensEngine.from_json(text)
        except EngineError as e:
            if cache and e.reason.startswith("fastokens cannot load"):
                write_proof(path, Proof(False, 0, e.reason))
            raise
        proof = prove_equal(
            reference,
            fast,
            backend,
            extra_texts=list(extra_texts),
            cache=cache,
            path=path,
        )
        if not proof.equal:
            raise not_proven(proof.difference)
    except EngineError as e:
        if requested == "fastokens":
            raise
        return Resolved(reference, requested, e.reason)
    return Resolved(fast, requested)


def fallback_line(resolved: Resolved) -> str | None:
    """The line a run prints where `auto` fell back to `hf`, or None."""
    if resolved.reason is None:
        return None
    return (
        f"{option('tokenizer_engine')} auto: tokenizing with hf, not fastokens ({resolved.reason})"
    )
