"""What a packer output is: its file names, its shard schema, its manifest and how to read both.

The writer, verify, repack, inspect and the torch loader all take the contract from here, and it
loads neither numba nor torch: `import packer.contract` stays light.
"""
