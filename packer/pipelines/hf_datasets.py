"""The 🤗 `datasets` adapter of `pack_dataset`: the one module of packer that imports `datasets`.

A `Dataset`'s Arrow table (in its row order), an `IterableDataset`'s rows as Arrow tables,
where a file-backed Dataset's packed rows go (the choice `Dataset.map` makes), and the packed
rows back as a `Dataset`, memory-mapped when they were written to a cache file. `datasets` is
imported only when a Dataset comes in.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from packer import hashing
from packer.config import PackConfig
from packer.contract.names import MANIFEST
from packer.errors import InputError
from packer.read.objects import check_columns
from packer.version import __version__

CACHE_PREFIX = "cache-packer-"  # datasets' `cleanup_cache_files` removes `cache-*.arrow`


def is_dataset(data, name: str) -> bool:
    """Whether `data` is a `datasets.<name>` (`Dataset`, `IterableDataset`)."""
    module = sys.modules.get("datasets")  # no Dataset can exist before datasets is imported
    return module is not None and isinstance(data, getattr(module, name))


def dataset_table(ds, input_column: str, labels_column: str | None) -> pa.Table:
    """The Arrow table behind a `datasets.Dataset`, in its row order (select/shuffle honoured)."""
    return rows_table(ds, check_columns(ds.data.table, input_column, labels_column))


def rows_table(ds, table: pa.Table | None = None) -> pa.Table:
    """`table` (all of the Dataset's columns by default) in the Dataset's row order."""
    table = ds.data.table if table is None else table
    if ds._indices is not None:
        table = table.take(ds._indices.column(0))
    return table


def arrow_batches(ds, batch_size: int) -> Iterator[pa.Table]:
    """The rows of a `datasets.IterableDataset` as Arrow tables of `batch_size` rows. A row
    that Arrow cannot hold (a string with a lone surrogate, from Python) is named."""
    done = 0
    try:
        for table in ds.with_format("arrow").iter(batch_size=batch_size):
            done += table.num_rows
            yield table
    except UnicodeEncodeError:
        raise unencodable_row(ds, done, batch_size) from None


def unencodable_row(ds, first: int, count: int) -> InputError:
    """The error naming the first of rows `first`.. that holds a lone surrogate (the batch that
    Arrow refused, read again as Python rows)."""
    from packer.tokenize.files import lone_surrogate

    for i, row in enumerate(ds.skip(first).take(count)):
        problem = lone_surrogate(row)
        if problem:
            return InputError(problem, where=f"row {first + i}")
    last = first + count - 1
    return InputError("a string holds a lone surrogate: not text", where=f"rows {first}-{last}")


def fingerprint(source, cfg: PackConfig, encoder: str | None = None) -> str:
    """The result's fingerprint: from the input's and the options, and the encoder's when raw
    rows were tokenized (datasets would otherwise hash every byte of an in-memory table)."""
    digest = hashing.new("xxh3_128")
    key = {"input": source._fingerprint, "config": cfg.to_dict(), "packer": __version__}
    if encoder is not None:
        key["encoder"] = encoder
    digest.update(json.dumps(key, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def cache_path(
    ds, cfg: PackConfig, keep_in_memory: bool, cache_file_name, encoder: str | None = None
) -> Path | None:
    """Where the packed rows of `ds` are written, or None to pack them in memory: the choice
    `Dataset.map` makes for its result."""
    if cache_file_name is not None:
        return Path(os.fspath(cache_file_name)).absolute()
    if keep_in_memory or not ds.cache_files:
        return None
    import datasets

    name = f"{CACHE_PREFIX}{fingerprint(ds, cfg, encoder)}.arrow"
    if datasets.is_caching_enabled():
        return Path(ds.cache_files[0]["filename"]).absolute().parent / name
    from datasets.fingerprint import get_temporary_cache_files_directory

    return Path(get_temporary_cache_files_directory()) / name


def to_dataset(table: pa.Table | Path, source, cfg: PackConfig, encoder: str | None = None):
    """A `datasets.Dataset` over the packed table (no copy) or the cache file it was written to
    (memory-mapped, as `Dataset.from_file` maps it), with the fingerprint of `fingerprint`."""
    import datasets

    if isinstance(table, Path):
        table = _mapped_table(table)
    return datasets.Dataset(table, fingerprint=fingerprint(source, cfg, encoder))


def mixed_dataset(table: pa.Table, key, cfg: PackConfig, split: str | None = None):
    """An in-memory `datasets.Dataset` over a mixture's packed table (no copy), fingerprinted
    from its sources' fingerprints, weights and the options (`key`, JSON-able)."""
    import datasets

    digest = hashing.new("xxh3_128")
    whole = {"mixture": key, "split": split, "config": cfg.to_dict(), "packer": __version__}
    digest.update(json.dumps(whole, sort_keys=True).encode())
    return datasets.Dataset(table, fingerprint=digest.hexdigest()[:16])


def mixed_dataset_dict(tables: dict[str, pa.Table], key, cfg: PackConfig):
    """A `datasets.DatasetDict` of `mixed_dataset`s, one per split name."""
    import datasets

    return datasets.DatasetDict({k: mixed_dataset(t, key, cfg, k) for k, t in tables.items()})


def _mapped_table(path: Path):
    """The cache file as a `MemoryMappedTable` (what `Dataset.from_file` returns), opened
    without reading its body.

    `from_file` maps it with `pyarrow.memory_map`, which advises the kernel to read every
    record batch it opens (MADV_WILLNEED): 3.2 of 4.9 GiB read back from disk, 3-4.5 s, right
    after writing it. A plain `mmap` faults pages in only when a row is read. Opening reads
    each batch's header: written around the page cache, none is cached, and each fault's
    read-around would pull megabytes of body with it (4.5 s for 5 GiB); under MADV_RANDOM a
    fault reads its page alone (0.05 s), and the advice is lifted again for the rows' reads.
    Pickled (for `map` workers), the table reopens by path as `from_file` does.
    """
    from datasets.table import MemoryMappedTable

    with open(path, "rb") as fh:
        region = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):
        region.madvise(mmap.MADV_RANDOM)
    table = pa.ipc.open_stream(pa.py_buffer(region)).read_all()  # the buffer holds `region`
    if hasattr(mmap, "MADV_NORMAL"):
        region.madvise(mmap.MADV_NORMAL)
    return MemoryMappedTable(table, str(path))


def output_dataset(directory: Path):
    """The shards of a packer output as one memory-mapped `datasets.Dataset`, in manifest order
    (`packer.torch.load_hf_dataset`)."""
    import datasets

    with open(directory / MANIFEST, encoding="utf-8") as fh:
        shards = json.load(fh)["shards"]
    parts = [datasets.Dataset.from_file(str(directory / s["file"])) for s in shards]
    return datasets.concatenate_datasets(parts) if len(parts) != 1 else parts[0]
