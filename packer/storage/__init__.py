"""Object storage: `s3://`, `gs://`, `hf://`, `file://` and any fsspec URL as inputs and outputs.

A base layer (it imports `packer.errors` only): URLs (`urls`), the options given by hand
(`options`), one `Store` per bucket or file system, pyarrow's native S3 and GCS where pyarrow
has them (`gcs`: its retries bounded) and fsspec for the rest (`stores`), one-line errors and
retries (`failures`), local files that several processes share (`local`), and the names that
staged local copies stand for (`names`). The commit of an output on a store and the
staging of inputs live in the layers that know what an output is (`packer.write.remote`,
`packer.read.remote`, `packer.contract.remote`).
"""

from __future__ import annotations

import importlib

# name -> module; loaded on first use, so that `packer.storage.names` (which the CLI imports
# for its messages) does not load pyarrow's file systems
_WHERE = {
    "Store": "stores",
    "store_for": "stores",
    "Url": "urls",
    "is_url": "urls",
    "parse_url": "urls",
    "display": "names",
    "displayed": "names",
    "parse_pairs": "options",
    "set_options": "options",
    "storage_options": "options",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"packer.storage.{_WHERE[name]}"), name)
    if name in ("names", "options", "stores", "urls", "failures", "progress", "files"):
        return importlib.import_module(f"packer.storage.{name}")
    raise AttributeError(f"module 'packer.storage' has no attribute {name!r}")
