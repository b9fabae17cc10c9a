"""Stage 1, read: input files to validated `Samples`, one way through these modules.

files (which files, which format) → formats (one file to an Arrow table) → samples (the
in-memory form) → flatten and validate (reason codes, flat int32 values) → assemble
(`read_samples`: every file into one `Samples`). `cache` is the same read streamed to a
memory-mapped cache when the input outgrows the memory budget, `blocks` reads one block of a
file for the block pipeline, and `repack` reads a packer output back into its samples.
`objects` reads Python objects and Arrow tables for `pack_dataset`, and `windows` cuts a stream
of them into planning windows.
"""
