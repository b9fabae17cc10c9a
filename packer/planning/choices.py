"""The planning strategies a user chooses from, by name (light: the CLI's help and the config
check read them without loading the numba kernels)."""

from __future__ import annotations

STRATEGIES = ("bfd", "ffd", "nf", "ff-shuffle", "histogram")

# The order rows are written in: "shuffle" a seeded permutation of the planned rows (no length
# curriculum for a reader that reads in order), "plan" the planner's own order (longest first
# for the decreasing strategies). See `packer.planning.row_order`.
ROW_ORDERS = ("shuffle", "plan")
