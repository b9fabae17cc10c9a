"""Assemble: read and validate every input file and join them into one `Samples`.

Files are read in the given, sorted order (`packer.read.files`), each by its format's reader
(`packer.read.formats`) and checked by `packer.read.validate`. Skipped rows still consume a
global sample index, so `sample_index` in the output always points at the sample's position in
the input (file order, then row order). `packer.read.cache` is the same read for inputs larger
than the memory budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from packer.arguments import DEFAULT_INPUT, DEFAULT_LABELS
from packer.errors import InputError
from packer.read.columns import check_files, sample_columns
from packer.read.files import detect_format, expand_inputs, fingerprint
from packer.read.formats import READERS
from packer.read.samples import Rejects, Samples, SourceFile, as_chunks
from packer.read.validate import validate


def read_file(
    path: Path,
    input_column: str = DEFAULT_INPUT,
    labels_column: str | None = DEFAULT_LABELS,
    first_index: int = 0,
    on_error: str = "error",
    rejects: Rejects | None = None,
    chunked: bool = False,
) -> tuple[SourceFile, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Read and validate one file: (source, tokens int32, lengths, labels int32 | None, kept).

    `kept` is None when every row is valid, else the rows (0-based, within the file) that were
    kept; with `on_error="error"` the first bad row raises `InputError` instead.
    """
    fmt, _ = detect_format(path)
    columns = [input_column] + ([labels_column] if labels_column else [])
    raw = READERS[fmt](path, columns)
    src = new_source(path, fmt, raw.table.num_rows, first_index, raw.lines)
    tokens, lengths, lab, kept, has_labels = validate(
        raw, src, 0, input_column, labels_column, on_error, rejects, chunked
    )
    src.has_labels = has_labels
    return src, tokens, lengths, lab, kept


def new_source(
    path: Path, fmt: str, num_samples: int, first_index: int, lines: np.ndarray | None = None
) -> SourceFile:
    return SourceFile(
        path=path,
        format=fmt,
        num_samples=num_samples,
        first_index=first_index,
        size=path.stat().st_size,
        fingerprint=fingerprint(path),
        has_labels=False,
        _lines=lines,
    )


def read_samples(
    inputs: Iterable[str | Path],
    input_column: str = DEFAULT_INPUT,
    labels_column: str | None = DEFAULT_LABELS,
    require_labels: bool = False,
    progress: Callable[[Path], None] | None = None,
    on_error: str = "error",
    chunked: bool = False,
) -> Samples:
    """Read and validate every input file into one `Samples` (files in the given, sorted order).

    chunked: keep valid int32 values in the input's Arrow chunks instead of one flat copy
    (`Samples.token_chunks`; `tokens`/`labels` are None); `pack` reads this way.

    on_error: "error" raises `InputError` at the first bad sample; "skip" leaves bad samples out
    and lists them in `Samples.rejects` (their global indices stay reserved, see `Samples.index`).
    """
    if on_error not in ("error", "skip"):
        raise ValueError(f"on_error must be 'error' or 'skip', got {on_error!r}")
    paths = expand_inputs(inputs)
    check_files(paths, sample_columns(input_column, labels_column))
    sources: list[SourceFile] = []
    ids_parts, len_parts, lab_parts, index_parts = [], [], [], []
    rejects = Rejects() if on_error == "skip" else None
    first = 0
    for path in paths:
        src, ids, lengths, labels, kept = read_file(
            path, input_column, labels_column, first, on_error, rejects, chunked
        )
        check_schema(src, sources, labels_column, require_labels)
        sources.append(src)
        ids_parts.append(ids)
        len_parts.append(lengths)
        lab_parts.append(labels)
        index_parts.append(first + kept if kept is not None else (first, first + src.num_samples))
        first += src.num_samples
        if progress:
            progress(path)
    offsets, index = assemble_offsets(len_parts, index_parts, first, rejects)
    if chunked:
        return chunked_samples(ids_parts, lab_parts, offsets, sources, index, rejects)
    tokens = np.concatenate(ids_parts) if len(ids_parts) > 1 else ids_parts[0]
    labels = None
    if sources[0].has_labels:
        labels = np.concatenate(lab_parts) if len(lab_parts) > 1 else lab_parts[0]
    return Samples(
        tokens=tokens, offsets=offsets, labels=labels, sources=sources, index=index, rejects=rejects
    )


def check_schema(
    src: SourceFile, sources: list[SourceFile], labels_column: str | None, require_labels: bool
) -> None:
    """Every file must agree with the first on having labels (and have them when required)."""
    if sources and src.has_labels != sources[0].has_labels:
        with_, without = (src, sources[0]) if src.has_labels else (sources[0], src)
        raise InputError(
            f"mixed schemas: {with_.path} has a '{labels_column}' column and "
            f"{without.path} does not"
        )
    if require_labels and not src.has_labels:
        raise InputError(f"no '{labels_column}' column", where=str(src.path))


def chunked_samples(ids_parts, lab_parts, offsets, sources, index, rejects) -> Samples:
    tok, lab = [], [] if sources[0].has_labels else None
    starts = [0]
    for ids, labels in zip(ids_parts, lab_parts):
        pieces = ids if isinstance(ids, list) else [ids]
        lpieces = (labels if isinstance(labels, list) else [labels]) if lab is not None else None
        for k, piece in enumerate(pieces):
            if piece.size == 0:
                continue
            tok.append(piece)
            if lab is not None:
                lab.append(lpieces[k])
            starts.append(starts[-1] + piece.size)
    return Samples(
        tokens=None,
        offsets=offsets,
        labels=None,
        sources=sources,
        index=index,
        rejects=rejects,
        token_chunks=as_chunks(tok),
        label_chunks=as_chunks(lab) if lab is not None else None,
        chunk_starts=np.asarray(starts, np.int64),
    )


def counts_text(rejects: Rejects | None) -> str:
    if not rejects:
        return ""
    return ", ".join(f"{k}: {v}" for k, v in sorted(rejects.counts.items()))


def assemble_offsets(len_parts, index_parts, num_read: int, rejects):
    """Offsets of the kept samples and, when some were skipped, their global indices.

    index_parts: per part, the global indices kept, or (first, end) when all were kept.

    Raises when the inputs hold no sample, or when every sample was rejected.
    """
    kept_total = sum(len(x) for x in len_parts)
    if num_read == 0:
        raise InputError("the dataset is empty: the inputs hold no samples")
    if kept_total == 0:
        raise InputError(
            f"the dataset is empty: all {num_read} samples were rejected ({counts_text(rejects)})"
        )
    offsets = np.zeros(kept_total + 1, np.int64)
    np.cumsum(np.concatenate(len_parts), out=offsets[1:])
    index = None
    if kept_total != num_read:
        # a (first, end) pair stands for a run of samples that were all kept
        index = np.concatenate(
            [np.arange(*p, dtype=np.int64) if isinstance(p, tuple) else p for p in index_parts]
        ).astype(np.int64, copy=False)
    return offsets, index
