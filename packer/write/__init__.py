"""Stages 4 and 5, gather/write and commit: planned rows to shards, then the output in place.

gather (the numba kernel that copies segments into row buffers) → shards (`write_shards`: rows
in record batches, one file per shard) → shard_file (the output SCHEMA, a hashing file) →
manifest (`manifest.json`, `rejects.jsonl`, `split_labels.jsonl`) → commit (the hidden temporary
directory, then the atomic swap into place).
"""
