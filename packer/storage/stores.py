"""One `Store` per bucket or file system: the few operations packer needs, on any backend.

S3 and GCS go through pyarrow's native file systems (the fast path for reading Parquet and
Arrow); every other protocol through fsspec, wrapped as a pyarrow file system. Writes to S3 go
through boto3: its uploads abort on failure (a multipart upload that fails leaves no object),
and it can write the manifest only if it is absent (`If-None-Match: *`) or unchanged
(`If-Match: ETAG`), which is how two runs racing to one output cannot both commit.

Which client is missing is said in one line naming the extra that installs it, exit 2.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from packer.errors import InputError, UsageError
from packer.storage.failures import one_line, retrying
from packer.storage.gcs import gcs_file_system
from packer.storage.local import place_once, private_name
from packer.storage.options import ENV_PREFIXES as _ENV_PREFIXES
from packer.storage.options import storage_options
from packer.storage.urls import Url, redact

CHUNK = 8 << 20  # bytes per read or write while copying, and per multipart part
_lock = threading.Lock()
_stores: dict[tuple, Store] = {}


@dataclass
class Entry:
    path: str  # as the store names it (bucket/key)
    size: int
    is_dir: bool = False


_EXTRA_PACKAGES = {"s3": "boto3", "gcs": "gcsfs", "hf": "datasets"}  # pyproject.toml's extras


def missing_extra(protocol: str, extra: str) -> UsageError:
    # the package itself, not `packer-llm[extra]`: that resolves only once packer is on PyPI
    return UsageError(
        f"{protocol}:// URLs need packer's '{extra}' extra: "
        f"pip install {_EXTRA_PACKAGES.get(extra, extra)}"
    )


class Store:
    """A pyarrow file system, as packer reads and writes it."""

    protocol = "file"

    def __init__(self, fs: pafs.FileSystem, protocol: str):
        self.fs = fs
        self.protocol = protocol

    def where(self, path: str) -> str:
        return redact(f"{self.protocol}://{path}")

    # -- reading -------------------------------------------------------------------------
    def entry(self, path: str) -> Entry | None:
        """The file or directory at `path`, or None."""
        info = retrying(lambda: self.fs.get_file_info(path), self.where(path))
        if info.type == pafs.FileType.NotFound:
            return None
        return Entry(path, info.size or 0, info.type == pafs.FileType.Directory)

    def walk(self, path: str) -> list[Entry]:
        """Every file below `path`, sorted by path."""
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        infos = retrying(lambda: self.fs.get_file_info(selector), self.where(path))
        return sorted(
            (Entry(i.path, i.size or 0) for i in infos if i.type == pafs.FileType.File),
            key=lambda e: e.path,
        )

    def read_bytes(self, path: str) -> bytes | None:
        """The whole object, or None when it does not exist."""

        def read():
            try:
                with self.fs.open_input_stream(path, compression=None) as fh:
                    return fh.read()
            except FileNotFoundError:
                return None

        return retrying(read, self.where(path))

    def download(
        self,
        path: str,
        local: Path,
        on_bytes: Callable[[int], None] | None = None,
        digest: tuple[Callable[[], object], str] | None = None,
        exclusive: bool = False,
    ) -> None:
        """Copy `path` to `local` through a temporary name private to this process (so that
        processes racing to one `local` never write or rename each other's file).

        digest: (a new hash object, the hex digest the bytes must have), checked as they
        arrive; bytes that do not match never reach `local`. exclusive: the first copy placed
        at `local` wins and a later one is dropped (the caller reuses the winner's file,
        whose bytes were checked alike), so a file at `local` is never replaced under a reader.
        """
        part = private_name(local)
        got: list[str] = []

        def copy():
            hasher = digest[0]() if digest else None
            with self.fs.open_input_stream(path, compression=None) as src, open(part, "wb") as dst:
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
                    if hasher is not None:
                        hasher.update(chunk)
                    if on_bytes:
                        on_bytes(len(chunk))
            got[:] = [hasher.hexdigest()] if hasher is not None else []

        try:
            retrying(copy, self.where(path))
            if digest and got[0] != digest[1]:
                raise InputError(
                    "the object's bytes do not match the hash its manifest records (it changed "
                    "after the output was written); nothing of it was kept",
                    where=self.where(path),
                )
            if exclusive:
                place_once(part, local)
            else:
                os.replace(part, local)
        finally:
            part.unlink(missing_ok=True)

    # -- writing -------------------------------------------------------------------------
    def upload(self, local: Path, path: str, on_bytes: Callable[[int], None] | None = None):
        """Copy `local` to `path` and confirm its size; a failure leaves no object that a
        manifest lists (names are unique per run), and what was written is removed."""
        size = local.stat().st_size

        def copy():
            with (
                open(local, "rb") as src,
                self.fs.open_output_stream(path, compression=None) as dst,
            ):
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
                    if on_bytes:
                        on_bytes(len(chunk))

        try:
            retrying(copy, self.where(path), writing=True)
        except BaseException:
            self.delete([path])
            raise
        self._confirm(path, size)

    def _confirm(self, path: str, size: int) -> None:
        entry = self.entry(path)
        if entry is None or entry.size != size:
            got = "missing" if entry is None else f"{entry.size} bytes"
            raise one_line(
                OSError(f"upload not confirmed: {got}, expected {size} bytes"),
                self.where(path),
                writing=True,
            )

    def version(self, path: str) -> str | None:
        """A tag that changes whenever the object at `path` is replaced (None: absent)."""
        data = self.read_bytes(path)
        return None if data is None else str(hash(data))

    def etag(self, path: str) -> str | None:
        """The object's entity tag where the store gives one cheaply (S3), else None."""
        return None

    def create(self, path: str, data: bytes) -> bool:
        """Write `path` only if absent; False when it exists. Not atomic on a plain file
        system without conditional writes (checked, then written)."""
        if self.entry(path) is not None:
            return False
        self._write(path, data)
        return True

    def replace(self, path: str, data: bytes, version: str) -> bool:
        """Overwrite `path` only if it still is `version`; False when it changed."""
        if self.version(path) != version:
            return False
        self._write(path, data)
        return True

    def put(self, path: str, data: bytes) -> None:
        """Write a small object whole (a completion record): on S3 one PUT, which leaves the
        object whole or absent; elsewhere a torn write is possible and its reader checks it."""
        self._write(path, data)

    def _write(self, path: str, data: bytes) -> None:
        def write():
            with self.fs.open_output_stream(path, compression=None) as fh:
                fh.write(data)

        retrying(write, self.where(path), writing=True)

    def delete(self, paths: list[str]) -> None:
        """Remove `paths`, best effort (a failure to clean up never hides the real error)."""
        for path in paths:
            try:
                self.fs.delete_file(path)
            except Exception:  # noqa: BLE001, S112
                continue


class S3Store(Store):
    """pyarrow's S3 for reading and listing; boto3 for writes, conditional writes and deletes."""

    def __init__(self, fs: pafs.FileSystem, client):
        super().__init__(fs, "s3")
        self.client = client

    def _split(self, path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    def upload(self, local: Path, path: str, on_bytes: Callable[[int], None] | None = None):
        from boto3.s3.transfer import TransferConfig

        bucket, key = self._split(path)
        config = TransferConfig(multipart_threshold=CHUNK * 8, multipart_chunksize=CHUNK)

        def copy():
            self.client.upload_file(str(local), bucket, key, Config=config, Callback=on_bytes)

        # botocore retries each request (connection drops and 5xx included) with backoff;
        # a failed multipart upload is aborted by s3transfer, leaving no object
        retrying(copy, self.where(path), writing=True, attempts=1)
        self._confirm(path, local.stat().st_size)

    def version(self, path: str) -> str | None:
        bucket, key = self._split(path)

        def head():
            try:
                return self.client.head_object(Bucket=bucket, Key=key)["ETag"]
            except Exception as exc:
                if "404" in str(exc) or "Not Found" in str(exc):
                    return None
                raise

        return retrying(head, self.where(path))

    def etag(self, path: str) -> str | None:
        return self.version(path)

    def create(self, path: str, data: bytes) -> bool:
        return self._put(path, data, IfNoneMatch="*")

    def put(self, path: str, data: bytes) -> None:
        self._put(path, data)

    def replace(self, path: str, data: bytes, version: str) -> bool:
        return self._put(path, data, IfMatch=version)

    def _put(self, path: str, data: bytes, **condition) -> bool:
        bucket, key = self._split(path)

        def put():
            try:
                self.client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
                return True
            except Exception as exc:
                code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
                if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                    return False
                raise

        return retrying(put, self.where(path), writing=True)

    def delete(self, paths: list[str]) -> None:
        by_bucket: dict[str, list[str]] = {}
        for path in paths:
            bucket, key = self._split(path)
            by_bucket.setdefault(bucket, []).append(key)
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), 1000):
                objects = [{"Key": k} for k in keys[i : i + 1000]]
                try:
                    self.client.delete_objects(Bucket=bucket, Delete={"Objects": objects})
                except Exception:  # noqa: BLE001, S112
                    continue


def attempts() -> int:
    """Attempts per request (`PACKER_STORAGE_ATTEMPTS`, default 5), for the S3 clients."""
    try:
        return max(1, int(os.environ.get("PACKER_STORAGE_ATTEMPTS", "5")))
    except ValueError:
        return 5


def forget_stores() -> None:
    with _lock:
        _stores.clear()


def store_for(url: Url) -> Store:
    """The store that serves `url` (one per protocol, options and environment, reused)."""
    options = storage_options()
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)))
    key = (url.protocol, tuple(sorted(options.items())), env)
    with _lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = _open(url.protocol, options)
    return store


def _open(protocol: str, options: dict[str, str]) -> Store:
    if protocol == "s3":
        return _s3(options)
    if protocol == "file":
        return Store(pafs.LocalFileSystem(), "file")
    if protocol == "gs":
        try:
            return Store(gcs_file_system(options), "gs")
        except (ImportError, AttributeError):
            pass  # a pyarrow without GCS: fsspec's gcsfs below
    return _fsspec(protocol, options)


def _fsspec(protocol: str, options: dict[str, str]) -> Store:
    try:
        import fsspec
    except ImportError:
        raise missing_extra(protocol, _EXTRA.get(protocol, "s3")) from None
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise UsageError(
            f"unknown URL scheme '{protocol}://' (packer reads s3://, gs://, hf://, file:// "
            "and the protocols fsspec knows)"
        ) from None
    except ImportError:
        raise missing_extra(protocol, _EXTRA.get(protocol, protocol)) from None
    try:
        fs = cls(**options)
    except TypeError as exc:
        raise UsageError(f"{protocol}:// does not take these storage options ({exc})") from None
    return Store(pafs.PyFileSystem(pafs.FSSpecHandler(fs)), protocol)


_EXTRA = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "hf": "hf"}

# --storage-option names for S3, in boto3's spelling, and pyarrow's name for each
_S3_KEYS = {
    "endpoint_url": "endpoint_override",
    "region_name": "region",
    "aws_access_key_id": "access_key",
    "aws_secret_access_key": "secret_key",
    "aws_session_token": "session_token",
}


def _s3(options: dict[str, str]) -> S3Store:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise missing_extra("s3", "s3") from None
    unknown = set(options) - set(_S3_KEYS) - {"anonymous"}
    if unknown:
        raise UsageError(
            f"unknown storage option(s) for s3://: {', '.join(sorted(unknown))} (known: "
            f"{', '.join(sorted(_S3_KEYS))}, anonymous)"
        )
    endpoint = (
        options.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    region = (
        options.get("region_name")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    kwargs: dict = {}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
    if region:
        kwargs["region"] = region
    for name in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token"):
        if name in options:
            kwargs[_S3_KEYS[name]] = options[name]
    if options.get("anonymous") == "true":
        kwargs["anonymous"] = True
    fs = pafs.S3FileSystem(
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts()),
        connect_timeout=5,
        request_timeout=60,
        **kwargs,
    )
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint or None,
        region_name=region or None,
        aws_access_key_id=options.get("aws_access_key_id"),
        aws_secret_access_key=options.get("aws_secret_access_key"),
        aws_session_token=options.get("aws_session_token"),
        config=Config(
            retries={"max_attempts": attempts(), "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
            signature_version=None if options.get("anonymous") != "true" else _unsigned(),
        ),
    )
    return S3Store(fs, client)


def _unsigned():
    from botocore import UNSIGNED

    return UNSIGNED
