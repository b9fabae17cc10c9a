"""Object storage: `s3://`, `gs://`, `hf://`, `file://` and any fsspec URL as inputs and outputs.

A base layer (it imports `packer.errors` only): URLs (`urls`), the options given by hand
(`options`), one `Store` per bucket or file system, pyarrow's native S3 and GCS where pyarrow
has them and fsspec for the rest (`stores`), one-line errors and retries (`failures`), and the
names that staged local copies stand for (`names`). The commit of an output on a store and the
staging of inputs live in the layers that know what an output is (`packer.write.remote`,
`packer.read.remote`, `packer.contract.remote`).
"""

from __future__ import annotations

from packer.storage.names import display, displayed
from packer.storage.options import parse_pairs, set_options, storage_options
from packer.storage.stores import Store, store_for
from packer.storage.urls import Url, is_url, parse_url

__all__ = [
    "Store",
    "Url",
    "display",
    "displayed",
    "is_url",
    "parse_pairs",
    "parse_url",
    "set_options",
    "storage_options",
    "store_for",
]
