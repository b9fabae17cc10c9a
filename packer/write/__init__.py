"""Stages 4 and 5, gather/write and commit: planned rows to shards, then the output in place.

gather (the numba kernel that copies segments into row buffers) → shards (`write_shards`: rows
in record batches, one file per shard, as `ShardFiles` describes them) → shard_file (a hashing
Arrow IPC stream of the contract's SCHEMA) → manifest (`manifest.json`, `rejects.jsonl`,
`split_labels.jsonl`) → commit (the hidden temporary directory, then the atomic swap into place).
`in_memory` and `cache_file` write `pack_dataset`'s rows to memory or to one cache file.
"""
