"""`python -m packer`: the same as the `packer` command."""

from packer.cli import command_line

command_line()
