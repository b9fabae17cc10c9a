"""`python -m packer.cli`: the same command as `packer`."""

from packer.cli import run

run()
