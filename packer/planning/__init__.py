"""Stages 2 and 3, resolve and plan: over-length samples to segments, segments to rows.

overlength (`resolve`: drop, truncate or split what exceeds L) → strategies (`plan`: pick a
strategy, validate, windows) → kernels (the numba bin-packing kernels). `balance` plans training
batches over packed rows, `report` compares strategies for `packer plan`.

Named `planning`, not `plan`, so that the package never shadows the public `packer.plan`.
"""
