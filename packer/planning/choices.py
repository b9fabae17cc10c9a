"""The planning strategies a user chooses from, by name (light: the CLI's help and the config
check read them without loading the numba kernels)."""

from __future__ import annotations

STRATEGIES = ("bfd", "ffd", "nf", "ff-shuffle", "histogram")
