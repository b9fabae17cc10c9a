"""`--input` of a mixture: every source read with its own columns, as `pack` read it.

The files given are expanded in order and cut into the sources' runs by how many files the
manifest's `mixture.sources` lists for each; each run is read with its source's input and
labels columns, and the runs are joined as pack joins them: sample numbers run on from source
to source, and a source without labels has its input ids as labels (it trains every token).
One read of all the files with the run's columns would refuse such a mixture (mixed schemas).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from packer import arguments as A
from packer.errors import InputError, option
from packer.pipelines.mixture.read import join_samples
from packer.read.assemble import read_samples
from packer.read.files import expand_inputs
from packer.read.samples import Samples


def source_columns(manifest: dict) -> tuple[tuple[str, str | None], ...]:
    """(input column, labels column or None) of every source of the manifest's mixture."""
    cfg = manifest["config"]
    columns = []
    for source in manifest["mixture"]["sources"]:
        own = source.get("columns") or {}
        labels = own.get("labels_column", cfg["labels_column"])
        # labels are read where a file has them, as pack read them
        columns.append(
            (own.get("input_column", cfg["input_column"]), A.ColumnName(labels) if labels else None)
        )
    return tuple(columns)


def read_mixture_input(
    inputs: list, manifest: dict, on_file: Callable[[Path], None] | None = None
) -> Samples:
    """The `--input` files as one `Samples` numbered as the output is, bad samples counted
    (skipped), not raised."""
    paths = expand_inputs(inputs)
    sources = manifest["mixture"]["sources"]
    counts = _file_counts(manifest)
    if len(paths) != sum(counts):
        packed = "; ".join(
            f"source {i} ({_name(s)}): {n} file(s)" for i, (s, n) in enumerate(zip(sources, counts))
        )
        raise InputError(
            f"{option('inputs', '--input')} names {len(paths)} file(s) but the mixture was "
            f"packed from {sum(counts)}: {packed}"
        )
    parts, start = [], 0
    for (input_column, labels_column), n in zip(source_columns(manifest), counts):
        group = type(paths)(paths[start : start + n])
        start += n
        parts.append(
            read_samples(group, input_column, labels_column, on_error="skip", progress=on_file)
        )
    return _flat(join_samples(parts))


def _file_counts(manifest: dict) -> list[int]:
    """How many input files each source was read from: its `files`, or (a manifest without
    them) the manifest's inputs whose first sample lies in the source's index range."""
    sources = manifest["mixture"]["sources"]
    if all("files" in s for s in sources):
        return [len(s["files"]) for s in sources]
    firsts = np.array([int(e["first_index"]) for e in manifest["inputs"]], np.int64)
    return [
        int(((firsts >= s["first_index"]) & (firsts < s["first_index"] + s["input_samples"])).sum())
        for s in sources
    ]


def _name(source: dict) -> str:
    path = source["path"]
    return path if isinstance(path, str) else ", ".join(path)


def _flat(samples: Samples) -> Samples:
    """The flat form of joined samples: the source check reads `tokens` and `labels`."""
    if samples.token_chunks is None:
        return samples
    tokens = np.concatenate(
        [np.asarray(c) for c in samples.token_chunks] or [np.zeros(0, np.int32)]
    )
    labels = None
    if samples.label_chunks is not None:
        labels = np.concatenate([np.asarray(c) for c in samples.label_chunks] or [tokens[:0]])
    return replace(
        samples,
        tokens=tokens,
        labels=labels,
        token_chunks=None,
        label_chunks=None,
        chunk_starts=None,
    )
