"""A committed packer output in the formats other trainers read: Megatron-Bridge's packed
Parquet, Megatron-LM's IndexedDataset, MosaicML's MDS and TRL's padding-free dataset.

One small module per format; `run.export` reads the output once, batch by batch, and commits
the export atomically with its own manifest. docs/export.md says what each format carries.
"""

from packer.export.run import (
    ACCEPTS,
    EXPORT_MANIFEST,
    FORMATS,
    ExportResult,
    check_destination,
    check_outside,
    export,
)

__all__ = [
    "ACCEPTS",
    "EXPORT_MANIFEST",
    "FORMATS",
    "ExportResult",
    "check_destination",
    "check_outside",
    "export",
]
