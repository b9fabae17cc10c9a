"""What a staged local copy stands for: messages and manifests name the URL, not the copy.

Remote inputs are copied to a local staging directory before they are read; every place that
prints or records an input's path asks `display` for it, so a run over `s3://b/x.parquet`
records that URL in its manifest and names it in its errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from os import fspath

from packer.errors import PackerError

_STAGED: dict[str, str] = {}


def register(local, url: str) -> None:
    _STAGED[fspath(local)] = url


def forget(local) -> None:
    _STAGED.pop(fspath(local), None)


def display(path) -> str:
    """The URL a staged copy stands for, or the path itself."""
    text = fspath(path) if not isinstance(path, str) else path
    return _STAGED.get(text, text)


def displayed(text: str) -> str:
    """`text` with every staged path in it replaced by its URL (for error messages)."""
    for local in sorted(_STAGED, key=len, reverse=True):
        if local in text:
            text = text.replace(local, _STAGED[local])
    return text


@contextmanager
def named_errors() -> Iterator[None]:
    """A `PackerError` raised inside names the URLs of staged copies, not the copies."""
    try:
        yield
    except PackerError as exc:
        if exc.where is not None:
            exc.where = displayed(exc.where)
        exc.problem = displayed(exc.problem)
        exc.args = (f"{exc.where}: {exc.problem}" if exc.where else exc.problem,)
        raise
