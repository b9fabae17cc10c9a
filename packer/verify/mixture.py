"""The mixture check: what every source gave the output, recomputed from the rows.

A mixture's output repeats some samples and leaves others out by design, so the provenance
check's "every sample once" does not apply; instead every segment names its source
(`sample_source`), and the tokens and samples of each source, counted from the rows, must be
exactly what the manifest's `mixture` says. A source used at most once (subsampled, or whole
once) must hold no (sample, offset) twice; every segment's sample must lie in its source's
index range.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.contract.schema import SOURCE_COLUMN
from packer.verify.result import CheckResult, Failure
from packer.verify.row_checks import RowStatus

_COLUMNS = (SOURCE_COLUMN, "sample_index", "sample_offset", "cu_seqlens")


def mixture_counts(statuses: list[RowStatus]) -> dict:
    """The provenance figures of a mixture's rows: samples (first pieces, repeats counted)
    and segments, as `check_provenance` reports them for other outputs."""
    samples = segments = 0
    for st in statuses:
        n = st.shard.sample_index.size
        samples += int((np.asarray(st.shard.sample_offset[:n]) == 0).sum())
        segments += n
    return {"samples": samples, "segments": segments}


def _flat(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(row offsets, values) of a list column of one record batch."""
    offsets = np.asarray(column.offsets, np.int64)
    values = np.asarray(column.values.to_numpy(zero_copy_only=False))
    return offsets - offsets[0], values[offsets[0] : offsets[-1]]


def _segments(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per segment of a batch: (source, sample_index, sample_offset, length in real tokens)."""
    si_off, index = _flat(batch.column("sample_index"))
    _, source = _flat(batch.column(SOURCE_COLUMN))
    _, offset = _flat(batch.column("sample_offset"))
    cu_off, cu = _flat(batch.column("cu_seqlens"))
    per_row = np.diff(si_off)
    first = np.repeat(cu_off[:-1], per_row) + (
        np.arange(index.size) - np.repeat(si_off[:-1], per_row)
    )
    length = cu[first + 1].astype(np.int64) - cu[first]
    return source.astype(np.int64), index.astype(np.int64), offset.astype(np.int64), length


def check_mixture(out: Path, manifest: dict, result: CheckResult) -> None:
    """Every source's tokens and samples, counted from the rows, against the manifest."""
    sources = manifest["mixture"]["sources"]
    n = len(sources)
    first = np.array([s["first_index"] for s in sources], np.int64)
    end = first + np.array([s["input_samples"] for s in sources], np.int64)
    once = np.array([_used_once(s) for s in sources], bool)
    tokens, samples = np.zeros(n, np.int64), np.zeros(n, np.int64)
    seen: list[np.ndarray] = []
    for entry in manifest["shards"]:
        with pa.memory_map(str(out / entry["file"])) as source:
            reader = pa.ipc.open_stream(source)
            if SOURCE_COLUMN not in reader.schema.names:
                result.fail(
                    Failure(
                        f"{entry['file']}: no {SOURCE_COLUMN} column, but the manifest "
                        "describes a mixture",
                        shard=entry["file"],
                    )
                )
                return
            for batch in reader:
                src, index, offset, length = _segments(batch.select(list(_COLUMNS)))
                bad = (src < 0) | (src >= n)
                if not bad.any():
                    bad = (index < first[src]) | (index >= end[src])
                if bad.any():
                    k = int(np.flatnonzero(bad)[0])
                    result.fail(
                        Failure(
                            f"{entry['file']}: sample {index[k]} names source {src[k]}, "
                            f"which does not hold it ({n} sources)",
                            shard=entry["file"],
                            sample=int(index[k]),
                        )
                    )
                    return
                tokens += np.bincount(src, weights=length, minlength=n).astype(np.int64)
                samples += np.bincount(src[offset == 0], minlength=n)
                pick = once[src]
                seen.append(np.stack([index[pick], offset[pick]], 1))
    _compare(sources, tokens, samples, result)
    _check_once(seen, result)
    result.details.update(
        {"sources": n, "tokens": int(tokens.sum()), "samples": int(samples.sum())}
    )


def _used_once(source: dict) -> bool:
    """Whether no sample of the source may be packed twice: subsampled, or used whole once
    (one epoch and then a subset of the rest repeats some)."""
    if "available" not in source:
        return source["epochs"] == 0
    return source["epochs"] <= 1 and source["samples"] <= source["available"]


def _compare(sources: list[dict], tokens: np.ndarray, samples: np.ndarray, result) -> None:
    """Each source's counts and share, as the rows hold them, against the manifest's."""
    total = int(tokens.sum())
    for i, s in enumerate(sources):
        name = s["path"] if isinstance(s["path"], str) else ", ".join(s["path"])
        for what, got in (("tokens", int(tokens[i])), ("samples", int(samples[i]))):
            if int(s[what]) != got:
                result.fail(
                    Failure(
                        f"mixture source {i} ({name}): the rows hold {got:,} {what} but the "
                        f"manifest says {int(s[what]):,}"
                    )
                )
        share = int(tokens[i]) / total if total else 0.0
        if abs(float(s["share"]) - share) > 1e-6:
            result.fail(
                Failure(
                    f"mixture source {i} ({name}): its share of the rows' tokens is "
                    f"{share:.6f} but the manifest says {s['share']}"
                )
            )


def _check_once(seen: list[np.ndarray], result: CheckResult) -> None:
    """No (sample, offset) twice among the sources used at most once."""
    pairs = np.concatenate(seen) if seen else np.zeros((0, 2), np.int64)
    if pairs.shape[0] < 2:
        return
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    sorted_ = pairs[order]
    twice = np.flatnonzero((np.diff(sorted_, axis=0) == 0).all(axis=1))
    if twice.size:
        index, offset = sorted_[twice[0]]
        result.fail(
            Failure(
                f"sample {index} at offset {offset} appears twice, but its source is not "
                f"repeated ({twice.size} such pieces)",
                sample=int(index),
                sample_offset=int(offset),
            )
        )
