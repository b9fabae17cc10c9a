"""The names of a packer output's files and marks, and the label value that carries no loss."""

from __future__ import annotations

MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"  # written with --on-error skip: one JSON line per rejected sample
# The source labels that split points overwrite with -100 (see `packer.write.manifest`).
SPLIT_LABELS = "split_labels.jsonl"
# Marks of the hidden siblings an output directory has while a run writes it (a run's temporary
# output and cache, a replaced output; see `packer.write.commit`).
TMP_MARK = ".packer-tmp-"
OLD_MARK = ".packer-old-"
WORK_MARKS = (TMP_MARK, OLD_MARK)
# Inside a block run's temporary output: its spill files, completion records and task directories.
BLOCK_WORK = ".blocks"
SHARD_PREFIX = "shard-"  # every shard's file name: shard-00000.arrow, shard-b00012-000.arrow
# A label that is no target: the first token of a split continuation, masked prompt tokens.
IGNORE_INDEX = -100
# What to do with a sample longer than max_len; the manifest's config.overlength is one of them.
POLICIES = ("error", "drop", "truncate", "split")
