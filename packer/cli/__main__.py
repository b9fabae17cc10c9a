"""`python -m packer.cli`: the same command as `packer`."""

from packer.cli import command_line

command_line()
