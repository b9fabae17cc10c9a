"""Where a pack's samples were tokenized from, for its manifest (`tokenized_from`).

`packer pack RAW --tokenizer` packs a tokenize cache entry; while it runs, `raw_source` holds
the tokenizer, template and their hashes, and the raw inputs, and the manifest records them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_source: ContextVar[dict | None] = ContextVar("packer_tokenized_from", default=None)


def raw_source() -> dict | None:
    """The raw source of the pack under way, or None when it packs token ids as given."""
    return _source.get()


@contextmanager
def packing_raw(source: dict) -> Iterator[None]:
    token = _source.set(source)
    try:
        yield
    finally:
        _source.reset(token)
