"""URLs: which arguments name object storage, and how a URL is printed (never with secrets)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packer.errors import UsageError

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://(.*)$", re.S)


def is_url(value) -> bool:
    """Whether `value` is a string with a scheme (`s3://b/k`); a plain path is not."""
    return isinstance(value, str) and _URL.match(value) is not None and len(value.split(":")[0]) > 1


@dataclass(frozen=True)
class Url:
    """`protocol://path`: `path` is what the file system takes (`bucket/key` for S3 and GCS)."""

    protocol: str
    path: str

    def __str__(self) -> str:
        return f"{self.protocol}://{self.path}"

    @property
    def bucket(self) -> str:
        return self.path.split("/", 1)[0]

    @property
    def key(self) -> str:
        return self.path.split("/", 1)[1] if "/" in self.path else ""

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def child(self, name: str) -> Url:
        return Url(self.protocol, f"{self.path.rstrip('/')}/{name}")

    def with_path(self, path: str) -> Url:
        return Url(self.protocol, path)


def parse_url(text: str, what: str = "URL") -> Url:
    """A URL from the command line or a caller; credentials inside it are refused unseen, and
    so are '.' and '..' segments in a store's key. `what` names the argument in messages."""
    match = _URL.match(text)
    if not match:
        raise UsageError(f"not a URL: {redact(text)!r}", where=what)
    protocol, rest = match.group(1).lower(), match.group(2)
    authority = rest.split("/", 1)[0]
    if "@" in authority:
        raise UsageError(
            "credentials inside a URL are not accepted (use the environment, the store's "
            "config files or --storage-option)",
            where=redact(text),
        )
    if protocol == "file":
        rest = "/" + rest.lstrip("/")
    else:
        rest = rest.rstrip("/") if rest.count("/") or rest else rest
    if protocol in ("s3", "s3a", "gs", "gcs") and not rest.split("/", 1)[0]:
        raise UsageError("the URL names no bucket", where=redact(text))
    if protocol != "file" and any(part in (".", "..") for part in rest.split("/")):
        # a store's key is a name, not a path: pyarrow's readers resolve '..' and writers keep
        # it, so one URL would read one object and write another
        named = redact(text) if what == "URL" else f"{what} {redact(text)}"
        raise UsageError(
            "'.' and '..' are not allowed in an object-store URL (a key is a name, not a "
            "path); write the key without them",
            where=named,
        )
    return Url("s3" if protocol == "s3a" else "gs" if protocol == "gcs" else protocol, rest)


def redact(text: str) -> str:
    """`text` without user information or a query string: what messages may show of a URL."""
    match = _URL.match(text)
    if not match:
        return text
    protocol, rest = match.groups()
    head, _, tail = rest.partition("/")
    head = head.rsplit("@", 1)[-1]
    rest = f"{head}/{tail}" if tail or rest.endswith("/") else head
    return f"{protocol}://{rest.split('?', 1)[0]}"
