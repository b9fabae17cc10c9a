"""What a block run's manifest says of its inputs, from the blocks' results: every file's
samples and rejects, and whether the files agree on having labels."""

from __future__ import annotations

from pathlib import Path

from packer.errors import InputError
from packer.pipelines.block_task import BlockResult
from packer.read.blocks import BlockSpec
from packer.read.samples import SourceFile


def check_labels(specs: list[BlockSpec], results: list[BlockResult], labels_column) -> bool:
    """Every block with samples must agree with the first on having labels."""
    seen = [(s, r) for s, r in zip(specs, results) if r.rows and r.samples]
    if not seen:
        return False
    s0, r0 = seen[0]
    for s, r in seen[1:]:
        if r.has_labels != r0.has_labels:
            (w, _), (wo, _) = ((s, r), (s0, r0)) if r.has_labels else ((s0, r0), (s, r))
            if w.path == wo.path:
                raise InputError(
                    f"mixed schemas: {w.path} has a '{labels_column}' column in some blocks "
                    "and not in others"
                )
            raise InputError(
                f"mixed schemas: {w.path} has a '{labels_column}' column and {wo.path} does not"
            )
    return r0.has_labels


def sources_of(scans, specs, results, has_labels: bool) -> list[SourceFile]:
    sources = []
    first = 0
    by_file: dict[int, list[tuple[BlockSpec, BlockResult]]] = {}
    for s, r in zip(specs, results):
        by_file.setdefault(s.file, []).append((s, r))
    for i, scan in enumerate(scans):
        parts = by_file.get(i, [])
        n = sum(r.rows for _, r in parts)
        sources.append(
            SourceFile(
                path=Path(scan.path),
                format=scan.format,
                num_samples=n,
                first_index=first,
                size=scan.size,
                fingerprint=scan.fingerprint,
                has_labels=has_labels and any(r.has_labels for _, r in parts),
                rejected=sum(len(r.rejects) for _, r in parts),
            )
        )
        first += n
    return sources
