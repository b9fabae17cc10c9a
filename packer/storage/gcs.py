"""pyarrow's GCS file system, its retries bounded as every store's are.

The GCS client's retry policy is a time, not a count; left unset it retries one request for 15
minutes (a `gs://` URL without a reachable endpoint hung that long). `PACKER_STORAGE_RETRY_SECONDS`
bounds it, as `PACKER_STORAGE_ATTEMPTS` bounds S3's attempts.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pyarrow.fs as pafs

from packer.errors import UsageError

KEYS = ("project_id", "endpoint_override", "scheme", "anonymous")


def retry_seconds() -> int:
    """How long the client may retry one request (`PACKER_STORAGE_RETRY_SECONDS`, default 15)."""
    try:
        return max(1, int(os.environ.get("PACKER_STORAGE_RETRY_SECONDS", "15")))
    except ValueError:
        return 15


def gcs_file_system(options: dict[str, str]) -> pafs.FileSystem:
    """The file system for `gs://` with these `--storage-option`s; AttributeError when pyarrow
    was built without GCS (the caller falls back to fsspec's gcsfs)."""
    fs_class = pafs.GcsFileSystem
    unknown = set(options) - set(KEYS)
    if unknown:
        raise UsageError(
            f"unknown storage option(s) for gs://: {', '.join(sorted(unknown))} (known: "
            f"{', '.join(KEYS)})"
        )
    kwargs = {k: options[k] for k in ("project_id", "endpoint_override", "scheme") if k in options}
    return fs_class(
        anonymous=options.get("anonymous") == "true",
        retry_time_limit=timedelta(seconds=retry_seconds()),
        **kwargs,
    )
