"""The manifest and its sidecar files: what a run writes besides the shards, last.

`build_manifest` records the config, the inputs (path, fingerprint, samples), the shards with
their digests and the stats; `rejects.jsonl` (with `--on-error skip`) lists every sample left
out, and `split_labels.jsonl` the source labels that split points overwrite with -100, so that
`--repack` can put them back. `packer.write.commit.finish` writes the manifest and commits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packer import hashing
from packer.config import PackConfig
from packer.contract.names import REJECTS, SPLIT_LABELS
from packer.contract.schema import SCHEMA
from packer.read.samples import Samples
from packer.storage import display
from packer.tokenize.source import raw_source
from packer.version import __version__

# 2: rows in `config.row_order` (a seeded shuffle by default); 1: in the plan's order, with no
# row_order recorded. Readers accept both (`packer.contract.manifest.FORMAT_VERSIONS`).
FORMAT_VERSION = 2


def build_manifest(
    cfg: PackConfig,
    samples: Samples,
    stats: dict,
    shards: list[dict],
    rejects: dict | None = None,
    repacked_from: dict | None = None,
    split_labels: dict | None = None,
) -> dict:
    manifest = {
        "packer_version": __version__,
        "format_version": FORMAT_VERSION,
        "config": cfg.to_dict(),
        "columns": {f.name: str(f.type) for f in SCHEMA},
        "inputs": [
            {
                "path": display(s.path),
                "format": s.format,
                "bytes": s.size,
                "fingerprint": s.fingerprint,
                "samples": s.num_samples,
                "first_index": s.first_index,
                "has_labels": s.has_labels,
                "rejected": s.rejected,
            }
            for s in samples.sources
        ],
        "shards": shards,
        "rejects": rejects,
        "stats": stats,
    }
    if repacked_from is not None:
        manifest["repacked_from"] = repacked_from
    if raw_source() is not None:  # `pack RAW --tokenizer`: the tokenizer and template used
        manifest["tokenized_from"] = raw_source()
    if split_labels is not None:
        manifest["split_labels"] = split_labels
    return manifest


def write_rejects(samples: Samples, tmp: Path, algorithm: str) -> dict:
    """rejects.jsonl: file, line (JSONL) or row (Parquet/Arrow), sample_index, reason, message."""
    path = tmp / REJECTS
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(samples.rejects.jsonl_lines() if samples.rejects else ())
    return {
        "file": REJECTS,
        "count": samples.num_rejected,
        "bytes": path.stat().st_size,
        algorithm: hashing.file_digest(path, algorithm),
    }


def split_points(samples: Samples, segs) -> np.ndarray | None:
    """(sample_index, sample_offset, source label) of every split point after a sample's first
    piece, int64 [k, 3] in sample order; None when there are none or no labels column.

    A packed row labels the first token of every segment -100, so a split point loses the
    source's label there; `split_labels.jsonl` keeps it and `--repack` puts it back.
    """
    if not samples.has_labels:
        return None
    pieces = np.flatnonzero(segs.offset > 0)
    if pieces.size == 0:
        return None
    labels = samples.labels_at(segs.start[pieces])
    return np.stack([segs.sample[pieces], segs.offset[pieces], labels]).T.astype(np.int64)


def write_split_labels(points: np.ndarray | None, tmp: Path, algorithm: str) -> dict | None:
    """split_labels.jsonl from `split_points` (written only when there are split points)."""
    if points is None or len(points) == 0:
        return None
    path = tmp / SPLIT_LABELS
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(
            f'{{"label": {lab}, "sample_index": {s}, "sample_offset": {o}}}\n'
            for s, o, lab in points.tolist()
        )
    return {
        "file": SPLIT_LABELS,
        "count": len(points),
        "bytes": path.stat().st_size,
        algorithm: hashing.file_digest(path, algorithm),
    }
