"""packer's version: manifests record it, `packer --version` prints it (a leaf: imports nothing)."""

__version__ = "0.1.0"
